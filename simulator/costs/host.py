"""Host-side work of ZeRO-Offload and ZeRO-Infinity as phases on the cluster graph: copies between GPUs, host
memory and NVMe drives, and the optimizer step on the CPU.

Every rank of a node does the same copy at the same time, so a phase's demand adds the bytes of all the node's
GPUs on every link of their paths (GPU -> PCIe switch -> CPU -> host memory, NVMe drive -> PCIe switch -> CPU
-> host memory) and takes, per link, the seconds at that link's bandwidth. Two GPUs behind one PCIe switch
share its uplink; every GPU of a socket shares its memory channels; NVMe volumes are striped over all drives
(RAID-0, as DGX ``/raid``). Link classes are the collective model's, so offload copies and GPUDirect RDMA
traffic on the same PCIe switch slow each other down in the engine.

Task kinds (``Task.group`` is ``host`` or ``nvme``: where the data lives):
  ``d2h`` / ``h2d``             GPU -> storage / storage -> GPU; via pinned host buffers for ``nvme``; pinned or
                                 not as the offload section says (``pin_memory``)
  ``d2h_pageable`` / ``h2d_pageable``  the same copy to or from pageable host memory, whatever the offload
                                 settings (``tensor.cpu()``, DeepSpeed's host activation checkpoints)
  ``d2h_pinned`` / ``h2d_pinned``      to or from pinned host buffers (Transformer Engine's activation offload)
  ``nvme_read`` / ``nvme_write`` NVMe <-> host memory (optimizer-state swapping; ``bytes`` per GPU)
  ``cpu_optimizer``              the optimizer step on the host CPU; ``bytes`` is the rank's parameter count
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from simulator.costs.collectives import CollectiveModel, Phase
from simulator.errors import ScenarioError
from simulator.scenario.schema import Scenario

HOST_GROUPS = frozenset({"host", "nvme"})
COPIES = ("d2h", "h2d", "d2h_pageable", "h2d_pageable", "d2h_pinned", "h2d_pinned")  # GPU <-> host memory

# CPU-Adam streams, per parameter, fp32 weight, gradient, momentum and variance in (16 bytes), the updated
# weight, momentum and variance out (12) and a 16-bit weight copy for the GPU (2): memory-bound on a
# vectorised implementation (DeepSpeed CPU-Adam, Ren et al. ATC'21 Sec. 5.1: 5-7x PyTorch's CPU Adam).
CPU_ADAM_BYTES_PER_PARAM = 30
# Swapping optimizer states with NVMe (ZeRO-Infinity): fp32 weight, momentum and variance are read before the
# step and written after it; the fp32 gradient stays in host memory.
SWAPPED_BYTES_PER_PARAM = 12
HALF_DUPLEX = ("nvme", "memory")
COPY_LAUNCH_S = 10e-6  # cudaMemcpyAsync / aio submission overhead per copy


class HostModel:
    """Costs host copies and CPU optimizer steps; phases are cached per (kind, group, bytes, stage)."""

    def __init__(self, comm: CollectiveModel, s: Scenario):
        self.comm = comm
        self.cluster = comm.cluster
        node = self.cluster.spec.node
        z = s.parallelism.zero
        # copies to the GPU are parameter fetches when parameters are offloaded (offload_param's buffers),
        # otherwise updated weights from the optimizer's buffers; copies to the host are gradients
        fetches = z.offload_param if z.offload_param.device != "none" else z.offload_optimizer
        self.pinned = {
            "h2d": fetches.pin_memory,
            "d2h": z.offload_optimizer.pin_memory,
            "h2d_pinned": True,
            "d2h_pinned": True,
        }
        self.pipelined = z.offload_optimizer.pipeline_read or z.offload_optimizer.pipeline_write
        self.optimizer_device = z.offload_optimizer.device
        memory_Bps = node.host_memory_bandwidth_GBps * 1e9 * self.cluster.spec.efficiency.memory
        self.cpu_params_per_s = node.cpu_optimizer_params_per_s or memory_Bps / CPU_ADAM_BYTES_PER_PARAM
        self.aio_Bps = aio_bandwidth_Bps(
            z.aio.block_size,
            z.aio.queue_depth,
            z.aio.thread_count,
            node.nvme_latency_us * 1e-6,
            node.nvme_bandwidth_GBps * 1e9 * self.cluster.spec.efficiency.nvme,
        )
        self._phases: dict[tuple, tuple[Phase, ...]] = {}

    def phases(self, kind: str, group: str, nbytes: float, stage: int | None = None) -> tuple[Phase, ...]:
        key = (kind, group, nbytes, stage)
        if key not in self._phases:
            self._phases[key] = self._cost(kind, group, nbytes, stage)
        return self._phases[key]

    def standalone_time_s(self, kind: str, group: str, nbytes: float, stage: int | None = None) -> float:
        return sum(p.duration_s for p in self.phases(kind, group, nbytes, stage))

    # -----------------------------------------------------------------------------------------------------
    def _cost(self, kind: str, group: str, nbytes: float, stage: int | None) -> tuple[Phase, ...]:
        if nbytes <= 0:
            return ()
        node, gpus = self._node_gpus(stage)
        if kind == "cpu_optimizer":
            step = self._cpu_step(node, len(gpus) * nbytes)
            if group != "nvme":
                return (step,)
            swap = nbytes * SWAPPED_BYTES_PER_PARAM
            read = self._nvme(node, len(gpus) * swap, to_host=True)
            write = self._nvme(node, len(gpus) * swap, to_host=False)
            if self.pipelined:  # tiles: read the next, step this one, write the previous, all at once
                return (_merge(read, step, write),)
            return (read, step, write)
        if kind in ("nvme_read", "nvme_write"):
            return (self._nvme(node, len(gpus) * nbytes, to_host=kind == "nvme_read"),)
        if kind not in COPIES:
            raise ValueError(kind)
        up = kind.startswith("h2d")
        pinned = self.pinned.get(kind, False)
        load: dict = defaultdict(float)
        latency = 0.0
        for g in gpus:
            a, b = ("hostmem", f"gpu{g}") if up else (f"gpu{g}", "hostmem")
            links, lat = self.cluster.local_route(node, a, b)
            latency = max(latency, lat)
            for link in links:
                load[link] += nbytes
                if link[2] == "hostmem" or link[1] == "hostmem":
                    # pageable memory: the driver stages through a pinned buffer, one more copy in host memory
                    load[link] += 0.0 if pinned else 2 * nbytes
        phase = self._phase(load, latency)
        if group == "nvme":  # through pinned host buffers, prefetched: both legs stream at once
            return (_merge(phase, self._nvme(node, len(gpus) * nbytes, to_host=up)),)
        return (phase,)

    def _node_gpus(self, stage: int | None) -> tuple[int, list[int]]:
        """A node whose GPUs run ``stage`` (any node without pipelining), and those GPUs' local indices."""
        gpn = self.cluster.gpus_per_node
        pp = self.comm.placement.stages()
        first = 0 if stage is None else int(np.flatnonzero(pp == stage)[0])
        node = first // gpn
        ranks = range(node * gpn, min((node + 1) * gpn, len(pp)))
        return node, [r % gpn for r in ranks if stage is None or pp[r] == stage]

    def _cpu_step(self, node: int, params: float) -> Phase:
        # the host's CPU-Adam throughput is one resource shared by every rank of the node
        return Phase(
            COPY_LAUNCH_S,
            {(self.comm.stages_of((node, "cpu", "adam")), "cpu", "adam"): params / self.cpu_params_per_s},
        )

    def _nvme(self, node: int, total_bytes: float, to_host: bool) -> Phase:
        """``total_bytes`` (the whole node's) between host memory and the node's striped NVMe drives, each rank's
        share also bounded by its aio queue (Little's law)."""
        drives = self.cluster.spec.node.nvme_drives
        if drives == 0:
            raise ScenarioError(
                f"parallelism.zero: offload to nvme, but a '{self.cluster.spec.name}' node has no NVMe drives "
                "(topology node.nvme_drives = 0; set cluster.nvme_drives)"
            )
        load: dict = defaultdict(float)
        latency = 0.0
        for d in range(drives):
            a, b = (f"nvme{d}", "hostmem") if to_host else ("hostmem", f"nvme{d}")
            links, lat = self.cluster.local_route(node, a, b)
            latency = max(latency, lat)
            for link in links:
                load[link] += total_bytes / drives
        phase = self._phase(load, latency)
        ranks = max(1, len(self._node_gpus(None)[1]))
        aio = {(frozenset(), "aio", "queue"): total_bytes / ranks / self.aio_Bps}
        return Phase(phase.latency_s, {**phase.demand_s, **aio})

    def _phase(self, load: dict, latency: float) -> Phase:
        demand: dict = {}
        for link, nbytes in load.items():
            info = self.cluster.link_info(link)
            u, v = self.cluster.link_class(link)
            if info.kind in HALF_DUPLEX:  # reads and writes share a drive's flash and a socket's DRAM
                u, v = sorted((u, v))
            c = (self.comm.stages_of(link), u, v)
            demand[c] = demand.get(c, 0.0) + nbytes / info.bandwidth_Bps
        return Phase(latency + COPY_LAUNCH_S, demand)


def _merge(*phases: Phase) -> Phase:
    """Phases that stream concurrently (pipelined through buffers): every link busy for its own demand."""
    demand: dict = {}
    for p in phases:
        for c, d in p.demand_s.items():
            demand[c] = demand.get(c, 0.0) + d
    return Phase(max(p.latency_s for p in phases), demand)


def aio_bandwidth_Bps(
    block_size: int, queue_depth: int, threads: int, latency_s: float, drive_Bps: float
) -> float:
    """Bandwidth one rank's libaio queue sustains: ``threads x queue_depth`` requests of ``block_size`` bytes in
    flight, each taking the drive's latency plus its transfer time (Little's law). DeepSpeed's defaults (1 MiB,
    depth 8, 1 thread) keep a drive busy; small blocks or a shallow queue do not (DeepSpeed aio tuning docs)."""
    return threads * queue_depth * block_size / (latency_s + block_size / drive_Bps)
