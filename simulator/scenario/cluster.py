"""``cluster:``: which topology file, how many nodes, and what-if overrides of its hardware."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from simulator.scenario.section import GBPS_MAX, GBPS_MIN, MAX_GPUS, Section


class ClusterConfig(Section):
    """Which topology file, how many nodes, and what-if overrides of its hardware."""

    topology: str = Field(..., description="Name of a file in topologies/ (without .yaml) or a path to one.")
    num_nodes: PositiveInt = Field(1, le=MAX_GPUS)
    gpus_per_node: PositiveInt | None = Field(None, description="Use only this many GPUs of each node.")
    gpu: str | None = Field(
        None,
        min_length=1,
        description="Replace the topology's GPU with another from the catalogue, or a GPU file.",
    )
    power_w: float | None = Field(
        None,
        ge=1,
        le=1e4,
        allow_inf_nan=False,
        description="Power limit set on every GPU (nvidia-smi -pl), watts. Below the GPU's rated power_w its "
        "compute-bound kernels (GEMMs, attention) slow by (power_w / rated) ** 0.47, fitted on MLPerf's capped runs; "
        "HBM, NVLink and the network keep their speed (docs/hardware.md). At or above it: no change.",
    )
    nccl_version: str | None = Field(
        None,
        pattern=r"^2\.\d{1,2}(\.\d{1,2})?$",
        description="The NCCL release the collectives run on, e.g. '2.21.5': from 2.18 NCCL's tuning model has "
        "other latencies (costs/nccl.yaml). Default: 2.18 or later on Hopper and later GPUs, 2.17 before "
        "(docs/collectives.md).",
    )
    nics_per_node: PositiveInt | None = Field(None, le=64)
    nic_bandwidth_gbps: float | None = Field(
        None, ge=GBPS_MIN, le=GBPS_MAX, description="Per NIC, gigabits per second."
    )
    oversubscription: float | None = Field(
        None, ge=1, le=1000, description="Leaf-to-spine oversubscription ratio."
    )
    routing: Literal["adaptive", "ecmp"] | None = Field(
        None,
        description="Replace the topology's fabric routing: 'adaptive' (the spine uplinks as one pipe) or 'ecmp' "
        "(each flow hashed onto one uplink; collisions slow the busiest).",
    )
    qps_per_connection: int | None = Field(
        None, ge=1, le=128, description="NCCL_IB_QPS_PER_CONNECTION: flows per connection that ECMP hashes."
    )
    pcie_bandwidth_GBps: float | None = Field(
        None, ge=GBPS_MIN, le=GBPS_MAX, description="Per PCIe link, per direction, GB/s."
    )
    nvme_drives: int | None = Field(None, ge=0, le=64, description="NVMe drives per node (striped).")
    nvme_bandwidth_GBps: float | None = Field(
        None, ge=GBPS_MIN, le=GBPS_MAX, description="Per NVMe drive, GB/s."
    )
    cpu_optimizer_params_per_s: float | None = Field(
        None, ge=1e3, le=1e13, description="CPU-Adam throughput of one host, parameters per second."
    )
    price_per_gpu_hour: float | None = Field(
        None, gt=0, le=1e4, allow_inf_nan=False, description="US dollars per GPU-hour: the cost to train."
    )
    nccl_sm_contention: bool = Field(
        True,
        description="A collective's thread blocks (one per NCCL channel, memory.nccl_channels) hold SMs while it "
        "runs: compute-bound kernels beside it run on the rest, SMs / (SMs - channels) slower (costs/contention.py). "
        "false: communication beside compute costs it nothing.",
    )
    gpu_speed_sd: float | None = Field(
        None,
        ge=0,
        le=0.5,
        description="Spread of sustained speed across the GPUs (standard deviation, fraction of the typical GPU's): "
        "compute-bound kernels run at the slowest GPU's speed. Default: the GPU profile's (0.015); 0 turns it off.",
    )
