"""Every task of a simulated iteration with its start and end, plus interval arithmetic for the metrics."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import NamedTuple

from simulator.program import Program, Task


class Part(NamedTuple):
    """A slice of a compute task: a run of kernels or a collective the stream waits for (tensor-parallel
    all-reduce, pipeline send). ``duration_s`` is the time the stream spends on it; ``hidden_s`` the part of a
    collective that ran alongside a kernel (ring attention's K/V exchange) and so took no extra time."""

    name: str
    kind: str  # compute | all_reduce | all_gather | reduce_scatter | send_recv | ...
    group: str
    bytes: float
    duration_s: float
    hidden_s: float = 0.0


class Timeline:
    """Arrays indexed by task id: when its stream was free for it, when it started, when it ended, and which
    dependency (if any) kept the stream idle."""

    def __init__(self, program: Program, n: int):
        self.program = program
        # plain lists: the engine writes one element at a time and metrics read them one at a time
        self.free = [0.0] * n
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.blocker = [-1] * n
        # GPU time lost to the host thread inside the task's window (from when the GPU could have started it to
        # its end): kernels not issued yet
        self.host_idle = [0.0] * n
        self.busy = [0.0] * n  # compute tasks: GPU seconds of their kernels and the collectives they wait for
        # compute tasks: when their host thread had issued them (0 without a host model)
        self.issued = [0.0] * n
        self.parts: dict[int, tuple[Part, ...]] = {}
        self.events = 0

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_relative_spans", None)  # keyed by object ids, which an unpickled copy does not share
        return state

    @property
    def tasks(self) -> list[Task]:
        return self.program.tasks

    @property
    def makespan_s(self) -> float:
        return max(self.end, default=0.0)

    def inner_spans(self, task_id: int) -> list[InnerSpan]:
        """The collectives inside a compute task (tensor-parallel all-reduces, pipeline sends, ring attention), one
        span per collective kind and group: from the first's start to the last's end, with their count, the time
        the stream spent on them and their bytes. Reports and traces draw these (a step of 12 layers holds
        dozens of TP collectives: one mark each made a 3D run's report 13 MB)."""
        parts = self.parts.get(task_id, ())
        # tasks share parts tuples (one per ops tuple): each tuple's spans are worked out once, from 0
        cache = self.__dict__.setdefault("_relative_spans", {})
        if id(parts) not in cache:
            cache[id(parts)] = (parts, _relative_spans(parts))  # the tuple kept: its id stays its own
        offset = self.start[task_id]
        return [
            InnerSpan(kind, group, offset + first, offset + last, count, seconds, nbytes)
            for kind, group, first, last, count, seconds, nbytes in cache[id(parts)][1]
        ]


def _relative_spans(parts: tuple[Part, ...]) -> list[tuple]:
    """inner_spans of a task that starts at 0."""
    offset = 0.0
    spans: dict[tuple[str, str], list] = {}
    for part in parts:
        if part.kind != "compute" and part.duration_s > 0:
            span = spans.setdefault((part.kind, part.group), [offset, 0.0, 0, 0.0, 0.0])
            span[1] = offset + part.duration_s
            span[2] += 1
            span[3] += part.duration_s
            span[4] += part.bytes
        offset += part.duration_s
    return [(kind, group, *values) for (kind, group), values in spans.items()]


class InnerSpan(NamedTuple):
    kind: str
    group: str
    first_s: float  # start of the first
    last_s: float  # end of the last
    count: int
    seconds: float  # the stream's time on them
    bytes: float


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def overlap(a: float, b: float, ys: list[tuple[float, float]], starts: list[float]) -> float:
    """How much of [a, b) the sorted, disjoint intervals ``ys`` cover (``starts``: their starts), found by
    bisection: a timeline's thousands of collectives each against its compute, without a scan from the start."""
    total = 0.0
    for y0, y1 in ys[max(0, bisect_right(starts, a) - 1) :]:
        if y0 >= b:
            break
        total += max(0.0, min(b, y1) - max(a, y0))
    return total


def intersection_length(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Total overlap of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total
