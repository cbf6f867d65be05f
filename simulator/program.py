"""What a strategy produces and the engine replays: per-rank ordered tasks on named streams, with dependencies.

A task is either compute (a tuple of :class:`~simulator.workload.transformer.Op`) or one collective on a named
group (``dp``, ``dp_shard``, ``tp``...). Tasks of one (rank, stream) run in order; a task starts when the
previous task of its stream has finished and all its dependencies have. Nothing here knows about SimPy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.workload.memory import MemoryBreakdown
from simulator.workload.ops import Op

COMPUTE = "compute"


@dataclass(slots=True)
class Task:
    id: int
    rank: int
    stream: str
    kind: str  # forward | backward | recompute | optimizer | all_reduce | all_gather | reduce_scatter | ...
    phase: str  # forward | backward | optimizer: where its time is booked in the breakdown
    name: str
    deps: tuple[int, ...] = ()
    ops: tuple[Op, ...] = ()
    group: str | None = None  # collectives only
    bytes: float = 0.0  # collectives: the full (unsharded) buffer, as NCCL's "size"
    microbatch: int = -1
    # the host thread waits for the GPU (and the task's dependencies) before issuing this task's kernels: a
    # synchronising call such as a blocking p2p receive, a pageable input copy or ``.item()``
    sync: bool = False
    # communication issued by the host thread of a compute stream (a framework hook): it starts no earlier than
    # that host has finished issuing this compute task (-1: issued ahead of time, bounded by nothing)
    issued_after: int = -1
    # compute tasks: the host thread blocks until these tasks have ended before it issues this task's kernels
    # (``event.synchronize()`` on another stream), without waiting for the GPU's own stream
    host_waits: tuple[int, ...] = ()

    @property
    def is_collective(self) -> bool:
        """Communication on links (network, PCIe, NVMe); the CPU optimizer step uses none."""
        return self.group is not None and self.kind != "cpu_optimizer"


@dataclass
class RankClass:
    """One simulated rank standing for ``count`` real ranks that behave identically."""

    label: str
    count: int
    memory: MemoryBreakdown
    stage: int | None = None  # pipeline stage, when the rank's collectives involve only that stage's groups


@dataclass
class Program:
    strategy: str
    tasks: list[Task] = field(default_factory=list)
    ranks: list[RankClass] = field(default_factory=list)
    # asynchronous schedules simulate several batches; one iteration is the period between the ends of these
    # two tasks (steady state), and metrics count only what starts inside it
    window: tuple[int, int] | None = None

    def add_compute(
        self,
        rank: int,
        kind: str,
        phase: str,
        name: str,
        deps: tuple,
        ops: tuple,
        microbatch: int,
        sync: bool = False,
    ) -> int:
        """``add`` for a compute task, without keyword handling: pipelines create tens of thousands."""
        tid = len(self.tasks)
        self.tasks.append(Task(tid, rank, COMPUTE, kind, phase, name, deps, ops, None, 0.0, microbatch, sync))
        return tid

    def add(self, rank: int, stream: str, kind: str, phase: str, name: str, deps=(), **kw) -> int:
        task = Task(
            len(self.tasks), rank, stream, kind, phase, name, tuple(d for d in deps if d is not None), **kw
        )
        self.tasks.append(task)
        return task.id
