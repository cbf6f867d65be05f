"""Topology files (``topologies/*.yaml``): what one node holds and how nodes are wired, and the topology a
scenario's cluster section resolves to (its what-if overrides applied). The checks a scenario needs the topology
for (GPU count, derived data-parallel degree) are ``simulator/scenario/resolve.py``'s."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from simulator.errors import ScenarioError
from simulator.hardware.gpus import get_gpu
from simulator.scenario.files import load_named
from simulator.scenario.schema import ClusterConfig, Scenario
from simulator.scenario.section import EFFICIENCY_MIN, GBPS_MAX, GBPS_MIN


def _topology_dir() -> Path:
    """topologies/ of a checkout, or the copy an installed package carries (simulator/topologies)."""
    if "CLUSTERSIM_TOPOLOGIES" in os.environ:
        return Path(os.environ["CLUSTERSIM_TOPOLOGIES"])
    checkout = Path(__file__).resolve().parents[2] / "topologies"
    return checkout if checkout.is_dir() else Path(__file__).resolve().parents[1] / "topologies"


TOPOLOGY_DIR = _topology_dir()


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, defer_build=True)


# Bounds on hardware numbers: finite, positive, and within a few orders of magnitude of real machines (a
# bandwidth of 0 or below would be a division by zero or an infinitely fast link).
LATENCY_MAX_US = 1e6


class NodeSpec(_Spec):
    gpus: PositiveInt = Field(le=1024)
    gpu: str
    power_w: float | None = Field(
        None,
        ge=1,
        le=1e4,
        description="Power limit set on every GPU (nvidia-smi -pl), W; below the GPU's own power_w its compute-bound "
        "kernels slow by (limit / power_w) ** 0.47 (hardware/gpus.py power_capped_clock). Default: the GPU's.",
    )
    intra_node: Literal["nvswitch", "pcie"]
    nvlink_bandwidth_GBps: float | None = Field(
        None, ge=GBPS_MIN, le=GBPS_MAX, description="Per GPU per direction; default from the GPU."
    )
    nvlink_latency_us: float = Field(0.7, ge=0, le=LATENCY_MAX_US)
    pcie_switches: PositiveInt = Field(1, le=256)
    pcie_bandwidth_GBps: float | None = Field(
        None, ge=GBPS_MIN, le=GBPS_MAX, description="Per link per direction; default from the GPU."
    )
    pcie_latency_us: float = Field(1.0, ge=0, le=LATENCY_MAX_US)
    cpus: PositiveInt = Field(2, le=64)
    cpu_interconnect_GBps: float = Field(64.0, ge=GBPS_MIN, le=GBPS_MAX)
    host_memory_gib: float = Field(1024, gt=0, le=2**20)
    host_memory_bandwidth_GBps: float = Field(200, ge=GBPS_MIN, le=GBPS_MAX)
    nics: PositiveInt = Field(1, le=1024)
    nic_bandwidth_gbps: float = Field(200, ge=GBPS_MIN, le=GBPS_MAX)
    nic_kind: Literal["infiniband", "ethernet"] = "infiniband"
    nic_latency_us: float = Field(2.0, ge=0, le=LATENCY_MAX_US)
    nvme_drives: int = Field(
        0, ge=0, le=64, description="Drives striped as one volume (RAID-0), as DGX /raid."
    )
    nvme_bandwidth_GBps: float = Field(3.5, ge=GBPS_MIN, le=GBPS_MAX)
    nvme_latency_us: float = Field(
        80.0, ge=0, le=LATENCY_MAX_US, description="Per request (NVMe read latency, typical datacenter SSD)."
    )
    cpu_optimizer_params_per_s: float | None = Field(
        None,
        ge=1e3,
        le=1e13,
        description="CPU-Adam parameters updated per second by the whole host; default: host memory bandwidth "
        "/ 30 bytes per parameter (the step streams fp32 weight, gradient, momentum, variance and writes "
        "them back with a 16-bit copy).",
    )


class FabricSpec(_Spec):
    nodes_per_leaf: PositiveInt = Field(32, le=2**17)
    rail_optimized: bool = True
    oversubscription: float = Field(1.0, ge=1, le=1000)
    switch_latency_us: float = Field(0.5, ge=0, le=LATENCY_MAX_US)
    routing: Literal["adaptive", "ecmp"] = Field(
        "adaptive",
        description="How a leaf spreads traffic over its spine uplinks: 'adaptive' (InfiniBand adaptive routing, "
        "packet spraying: the uplinks act as one pipe) or 'ecmp' (a flow hashed onto one uplink: a few large flows "
        "collide, and the busiest uplink sets the pace; costs/ecmp.py).",
    )
    qps_per_connection: int = Field(
        1,
        ge=1,
        le=128,
        description="Flows (RDMA queue pairs) NCCL opens per connection, NCCL_IB_QPS_PER_CONNECTION (NCCL's "
        "default 1; Meta's RoCE clusters use more so that ECMP sees more flows); matters with routing: ecmp.",
    )


class LinkEfficiency(_Spec):
    """Fraction of nominal bandwidth that NCCL reaches on each link kind (measured bus bandwidth / nominal)."""

    nvlink: float = Field(0.8, ge=EFFICIENCY_MIN, le=1)
    pcie: float = Field(0.8, ge=EFFICIENCY_MIN, le=1)
    infiniband: float = Field(0.95, ge=EFFICIENCY_MIN, le=1)
    ethernet: float = Field(0.9, ge=EFFICIENCY_MIN, le=1)
    nvme: float = Field(0.9, ge=EFFICIENCY_MIN, le=1)
    memory: float = Field(0.8, ge=EFFICIENCY_MIN, le=1)
    nvls: float | None = Field(
        None,
        ge=EFFICIENCY_MIN,
        le=2,
        description="NVLink SHARP all-reduce bus bandwidth / nominal NVLink bandwidth per GPU per direction "
        "(measured; above 1 because the switch reduces); null: the NVSwitch has no NVLS (or it is off).",
    )


NCCL_VERSION = r"^2\.\d{1,2}(\.\d{1,2})?$"  # 2.21 or 2.21.5
_Protocol = Literal["LL", "LL128", "Simple"]
_Algorithm = Literal["ring", "tree"]
_Latency = Annotated[float, Field(ge=0, le=LATENCY_MAX_US)]
_Fraction = Annotated[float, Field(ge=EFFICIENCY_MIN, le=1)]


class NcclTuning(_Spec):
    """NCCL's protocol constants measured on this fabric, replacing NCCL's own (simulator/costs/nccl.yaml):
    per-step latency by algorithm, link kind and protocol, and each protocol's bus bandwidth as a fraction of
    the Simple protocol's."""

    base_us: dict[_Algorithm, dict[_Protocol, _Latency]] = {}
    hop_us: dict[_Algorithm, dict[Literal["nvlink", "pcie", "network"], dict[_Protocol, _Latency]]] = {}
    bandwidth: dict[_Algorithm, dict[_Protocol, _Fraction]] = {}
    version: str | None = Field(
        None,
        pattern=NCCL_VERSION,
        description="The NCCL release the collectives run on (cluster.nccl_version sets it; default: by GPU, "
        "costs/nccl.release).",
    )
    net_overhead_us: _Latency | None = Field(
        None,
        description="NCCL's network post overhead per step (tuning.cc getNetOverhead, v2.18+: 1 us on Intel "
        "hosts, 2 us on AMD): a multi-node ring's steps inside a node take at least this (x3 on Simple).",
    )
    source: str = ""


class TopologySpec(_Spec):
    name: str
    description: str = ""
    sources: str = ""
    node: NodeSpec
    fabric: FabricSpec = Field(default_factory=FabricSpec)
    efficiency: LinkEfficiency = Field(default_factory=LinkEfficiency)
    nccl: NcclTuning = Field(default_factory=NcclTuning)


@cache
def load_topology(name: str) -> TopologySpec:
    """A shipped topology by name (``dgx-a100``) or a topology file by path (``my/cluster.yaml``)."""
    return load_named(name, TOPOLOGY_DIR, "cluster.topology", "topology", TopologySpec)


def nics_per_gpu_grouped(spec: TopologySpec) -> TopologySpec:
    """A node with several NICs per GPU (AWS p5: 32 x 100 Gb/s EFA for 8 H100) as one NIC per GPU of their summed
    bandwidth: NCCL spreads a GPU's channels over its local NICs (src/graph/topo.cc ncclTopoGetLocalNet, v2.20+:
    channel c takes local NIC ``c % ceil(localNets / localGpus)``), and aws-ofi-nccl presents each GPU's four EFA
    NICs as one device of four times their speed. Otherwise a GPU would reach the network through one of them only.
    A count that does not divide by the GPUs is left as it is."""
    n = spec.node
    if n.nics <= n.gpus or n.nics % n.gpus:
        return spec
    per_gpu = n.nics // n.gpus
    node = n.model_copy(update={"nics": n.gpus, "nic_bandwidth_gbps": n.nic_bandwidth_gbps * per_gpu})
    return spec.model_copy(update={"node": node})


def apply_overrides(spec: TopologySpec, cfg: ClusterConfig) -> TopologySpec:
    """The topology with the scenario's what-if overrides (GPU type, GPUs/NICs per node, NIC speed)."""
    node: dict = {}
    if cfg.gpu:
        get_gpu(cfg.gpu)  # validates the name
        node["gpu"] = cfg.gpu
    if cfg.power_w is not None:
        gpu = get_gpu(cfg.gpu or spec.node.gpu)
        if gpu.power_w is None:
            raise ScenarioError(
                f"cluster.power_w: the GPU {gpu.name} states no power limit (power_w) for its figures, so a limit of "
                f"{cfg.power_w:g} W has nothing to scale from; add power_w to its GPU file"
            )
        node["power_w"] = cfg.power_w
    if cfg.gpus_per_node and cfg.gpus_per_node > spec.node.gpus:
        raise ScenarioError(
            f"cluster.gpus_per_node ({cfg.gpus_per_node}) exceeds the {spec.node.gpus} GPUs of a '{spec.name}' node"
        )
    if cfg.nics_per_node:
        node["nics"] = cfg.nics_per_node
    if cfg.nic_bandwidth_gbps:
        node["nic_bandwidth_gbps"] = cfg.nic_bandwidth_gbps
    for key in ("pcie_bandwidth_GBps", "nvme_drives", "nvme_bandwidth_GBps", "cpu_optimizer_params_per_s"):
        if getattr(cfg, key) is not None:
            node[key] = getattr(cfg, key)
    if cfg.nccl_version:
        spec = spec.model_copy(update={"nccl": spec.nccl.model_copy(update={"version": cfg.nccl_version})})
    fabric = {"oversubscription": cfg.oversubscription} if cfg.oversubscription else {}
    for key in ("routing", "qps_per_connection"):
        if getattr(cfg, key) is not None:
            fabric[key] = getattr(cfg, key)
    # several NICs per GPU are grouped on the whole node, before ``gpus_per_node`` leaves some GPUs out (those
    # GPUs' NICs are not the others')
    whole = nics_per_gpu_grouped(spec.model_copy(update={"node": spec.node.model_copy(update=node)}))
    if cfg.gpus_per_node:
        whole = whole.model_copy(update={"node": whole.node.model_copy(update={"gpus": cfg.gpus_per_node})})
    return whole.model_copy(update={"fabric": spec.fabric.model_copy(update=fabric)})


def ideal_network(spec: TopologySpec) -> TopologySpec:
    """The same cluster with every link infinitely fast and without latency: what-if studies and the
    closed-form checks (DDP on a free network equals one GPU; bubbles with free communication)."""
    node = spec.node.model_copy(
        update={
            "nvlink_bandwidth_GBps": 1e30,
            "pcie_bandwidth_GBps": 1e30,
            "nic_bandwidth_gbps": 1e30,
            "nvlink_latency_us": 0.0,
            "pcie_latency_us": 0.0,
            "nic_latency_us": 0.0,
        }
    )
    fabric = spec.fabric.model_copy(update={"switch_latency_us": 0.0})
    protocols = ("LL", "LL128", "Simple")
    kinds = ("nvlink", "pcie", "network")
    free = NcclTuning(
        base_us={a: dict.fromkeys(protocols, 0.0) for a in ("ring", "tree")},
        hop_us={a: {k: dict.fromkeys(protocols, 0.0) for k in kinds} for a in ("ring", "tree")},
        bandwidth={a: dict.fromkeys(protocols, 1.0) for a in ("ring", "tree")},
        source="free communication",
    )
    efficiency = spec.efficiency.model_copy(update={"nvls": None})  # NVLS has a latency of its own
    return spec.model_copy(update={"node": node, "fabric": fabric, "nccl": free, "efficiency": efficiency})


def cluster_spec(scenario: Scenario) -> TopologySpec:
    return apply_overrides(load_topology(scenario.cluster.topology), scenario.cluster)
