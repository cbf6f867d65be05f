"""GPU memory outside what a program's tensors take: the CUDA context, NCCL's buffers and the caching allocator's
reserve (``scenario.memory``, the framework's ``cuda_context_gib``; docs/memory.md). Added to every rank's
:class:`~simulator.workload.memory.MemoryBreakdown` once the strategy has built its program, so ``run``, ``plan``,
``sweep`` and the what-fits suggestions judge the same device total."""

from __future__ import annotations

from dataclasses import replace

from simulator.frameworks import Framework
from simulator.hardware.placement import Placement
from simulator.program import Program
from simulator.scenario.schema import Scenario
from simulator.workload.memory import nccl_buffer_bytes

NOT_NCCL = frozenset({"host", "nvme"})  # copies to host memory and NVMe (simulator/costs/host.py)


def communicators(program: Program, placement: Placement) -> list[int]:
    """NCCL communicators each rank of ``program`` uses: one per group kind the program runs a collective on (of
    more than one rank; the program's ranks stand for every rank, and a collective shared by two stages may be
    simulated on one of them), the tied-embedding group on the first and last stage only, and for pipeline
    transfers one per neighbouring stage (PyTorch's send / recv make a communicator per pair of ranks:
    ProcessGroupNCCL's point-to-point keys), so two on a middle stage."""
    used: set[str] = set()
    in_ops: dict[int, frozenset[str]] = {}  # tasks share their ops tuples: read each once
    for t in program.tasks:
        if t.is_collective and t.group not in NOT_NCCL:
            used.add(t.group)
        if t.ops:
            key = id(t.ops)
            if key not in in_ops:
                in_ops[key] = frozenset(
                    op.group
                    for op in t.ops
                    if op.kind == "collective" and op.group and op.group not in NOT_NCCL
                )
                used |= in_ops[key]
    kinds = [g for g in sorted(used) if placement.group_size(g) > 1]
    last = placement.pp - 1
    out = []
    for rank in program.ranks:
        end = rank.stage is None or rank.stage in (0, last)
        n = 0
        for g in kinds:
            if g == "pp":
                n += 1 if end else 2
            elif g != "embedding" or end:
                n += 1
        out.append(n)
    return out


def add_runtime_memory(program: Program, s: Scenario, framework: Framework, placement: Placement) -> None:
    """Each rank's memory with the CUDA context, NCCL's buffers for its communicators and the allocator's
    fragmentation (in place)."""
    m = s.memory
    context = context_bytes(s, framework)
    for rank, comms in zip(program.ranks, communicators(program, placement), strict=True):
        rank.memory = replace(
            rank.memory,
            context=context,
            nccl=nccl_buffer_bytes(comms, m.nccl_channels),
            fragmentation=m.allocator_fragmentation,
        )


def layout_runtime_bytes(s: Scenario, framework: Framework, degrees: tuple[int, ...], pp: int) -> float:
    """What ``add_runtime_memory`` adds on a rank of a layout before it is simulated (the planner's screen): the
    CUDA context and NCCL's buffers for a communicator per parallel degree above 1 (``degrees``: TP, CP, DP, EP,
    ETP) and one per pipeline neighbour (two on a middle stage)."""
    comms = sum(d > 1 for d in degrees) + min(pp - 1, 2)
    return context_bytes(s, framework) + nccl_buffer_bytes(comms, s.memory.nccl_channels)


def context_bytes(s: Scenario, framework: Framework) -> float:
    """The CUDA context: the scenario's ``memory.cuda_context_gib``, else the framework's."""
    m = s.memory
    return (m.cuda_context_gib if m.cuda_context_gib is not None else framework.cuda_context_gib) * 2**30
