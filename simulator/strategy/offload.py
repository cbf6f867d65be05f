"""ZeRO-Offload (Ren et al. ATC'21) and ZeRO-Infinity (Rajbhandari et al. SC21): the tasks and the memory they
move off the GPU. The ZeRO strategies call these; the engine costs the tasks on the graph (``costs/host.py``).

* ``offload_optimizer``: each rank's reduced gradient partition is copied to host memory (fp32 there), the CPU
  steps the rank's 1/N of the model (states in host memory, or swapped with NVMe), and the updated 16-bit
  partition is copied back before the parameter all-gather (stages 1-2) or stays on the host for the next
  fetch (stage 3 with ``offload_param``).
* ``offload_param`` (stage 3): parameter shards live in host memory or on NVMe; each all-gather first fetches
  the rank's shard to the GPU.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.hardware.cluster import Cluster
from simulator.program import Program
from simulator.scenario.schema import Scenario
from simulator.workload.memory import MemoryBreakdown, state_bytes_per_param

FP32 = 4


def optimizer_device(s: Scenario) -> str | None:
    d = s.parallelism.zero.offload_optimizer.device
    return None if d == "none" else d


def param_device(s: Scenario) -> str | None:
    d = s.parallelism.zero.offload_param.device
    return None if d == "none" else d


def add_grad_copy(p: Program, name: str, after: int, nbytes: float, rank: int = 0) -> int:
    """Copy a reduced gradient partition (``nbytes`` per GPU) to host memory, overlapping backward."""
    return p.add(
        rank, "host.d2h", "d2h", "backward", f"{name} grad copy to host", (after,), group="host", bytes=nbytes
    )


def add_host_step(p: Program, s: Scenario, params: float, deps, rank: int = 0) -> int:
    """The optimizer step on the host CPU over ``params`` parameters per rank."""
    group = "nvme" if optimizer_device(s) == "nvme" else "host"
    return p.add(
        rank,
        "host.cpu",
        "cpu_optimizer",
        "optimizer",
        f"CPU {s.training.optimizer} step",
        deps,
        group=group,
        bytes=params,
    )


def add_param_copy(
    p: Program, name: str, nbytes: float, deps, phase: str, group: str = "host", rank: int = 0
) -> int:
    """Copy ``nbytes`` of 16-bit parameters per GPU from host memory (or NVMe) to the GPU."""
    return p.add(rank, "host.h2d", "h2d", phase, name, deps, group=group, bytes=nbytes)


def offloaded_memory(
    s: Scenario, mem: MemoryBreakdown, psi: float, shards: int, stage: int, cluster: Cluster
) -> MemoryBreakdown:
    """``mem`` (the ZeRO breakdown without offload) with what offloading moves to host memory and NVMe.

    Per rank: optimizer states K Psi/N and the fp32 gradient partition 4 Psi/N go to the host (the states to
    NVMe with ``nvme``, leaving swap buffers); the GPU keeps no gradient partition at stages 2-3. Parameter
    offload moves the 16-bit shard w Psi/N. Host and NVMe use are reported per node (DeepSpeed's estimators:
    16 and 18 bytes per parameter for a one-node job, ``estimate_zero3_model_states_mem_needs``)."""
    w_b, _, k_b = state_bytes_per_param(
        s.training.precision, s.training.optimizer, s.training.optimizer_moments
    )
    z = s.parallelism.zero
    node = cluster.spec.node
    host = nvme = 0.0
    params, grads, optimizer = mem.params, mem.grads, mem.optimizer
    if (dev := optimizer_device(s)) is not None:
        optimizer = 0.0
        if stage >= 2:
            grads = 0.0
        host += FP32 * psi / shards
        if dev == "cpu":
            host += k_b * psi / shards
        else:
            nvme += k_b * psi / shards
            host += z.offload_optimizer.buffer_count * z.offload_optimizer.buffer_size * FP32
    if (dev := param_device(s)) is not None:
        params -= w_b * psi / shards  # what stays is the persistent units' full copies
        if dev == "cpu":
            host += w_b * psi / shards
        else:
            nvme += w_b * psi / shards
            cached = min(z.offload_param.max_in_cpu, psi / shards)
            host += (z.offload_param.buffer_count * z.offload_param.buffer_size + cached) * w_b
    return replace(
        mem,
        params=max(params, 0.0),
        grads=grads,
        optimizer=optimizer,
        host=mem.host + host * node.gpus,
        host_capacity=node.host_memory_gib * 2**30,
        nvme=mem.nvme + nvme * node.gpus,
    )
