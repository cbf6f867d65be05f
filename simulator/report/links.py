"""Link utilisation over an iteration, without plotting: the share of each link class's bandwidth in use per
time bin, from the bytes each collective put on it while it ran (the HTML report's "busiest links" chart and
the Perfetto trace's link counters)."""

from __future__ import annotations

from collections import defaultdict

from simulator.api import Result
from simulator.costs.host import HOST_GROUPS


def bounding_rank(result: Result) -> int:
    """The simulated rank that bounds the step: the one whose compute stream is busy longest (its kernels and the
    collectives its kernels wait for: a pipeline's slowest stage, the MoE stage beside a dense one). Ties go to
    the first."""
    busy = [0.0] * len(result.program.ranks)
    tl = result.timeline
    for t in result.program.tasks:
        if not t.is_collective and t.rank < len(busy):
            busy[t.rank] += tl.busy[t.id]
    return max(range(len(busy)), key=lambda r: (busy[r], -r)) if busy else 0


def link_utilisation(result: Result, bins: int = 200, rank: int = 0) -> tuple[list[float], dict]:
    """(bin centres in seconds, per link class the share of its bandwidth in use in each bin): one simulated
    rank's collective tasks and the collectives inside its compute steps (tensor-parallel all-reduces, pipeline
    sends, MoE all-to-alls), each where it ran; a bin gets a collective's rate weighted by how much of the bin it
    covers."""
    tl, tasks = result.timeline, result.program.tasks
    T = tl.makespan_s or 1.0
    width = T / bins
    busy: dict = defaultdict(lambda: [0.0] * bins)  # summed unclipped; each bin capped at 1 once at the end
    stage_of = [r.stage for r in result.program.ranks]

    def load(phases, start: float, end: float) -> None:
        if end <= start:
            return
        # the share of each bin the collective covers, once for all its link classes (a 1T run's phases load
        # hundreds of classes each)
        window = range(int(start / T * bins), min(int(end / T * bins) + 1, bins))
        shares = [(min(end, (b + 1) * width) - max(start, b * width)) / width for b in window]
        cover = [(b, c) for b, c in zip(window, shares, strict=True) if c > 0]
        if not cover:
            return
        for phase in phases:
            for cls, seconds in phase.demand_s.items():
                use = min(seconds / (end - start), 1.0)  # the link's share while the collective runs
                row = busy[cls]
                for b, c in cover:
                    row[b] += use * c

    for t in tasks:
        if t.rank != rank:
            continue
        if t.is_collective:
            load(result.task_phases(t, stage_of[t.rank]), tl.start[t.id], tl.end[t.id])
            continue
        offset = tl.start[t.id]
        for part in tl.parts.get(t.id, ()):
            span = part.duration_s + part.hidden_s
            if part.kind != "compute" and part.group and part.group not in HOST_GROUPS:
                load(
                    result.comm.phases(part.kind, part.group, part.bytes, stage_of[t.rank]),
                    offset,
                    offset + span,
                )
            offset += part.duration_s
    return [(i + 0.5) * T / bins for i in range(bins)], {
        c: [min(y, 1.0) for y in ys] for c, ys in busy.items()
    }


def busiest(result: Result, top: int, bins: int, rank: int | None = None) -> tuple[list[float], list[tuple]]:
    """(bin centres in seconds, the ``top`` busiest link classes as (class, name, utilisation per bin)), busiest
    first by time-integrated use, of ``rank`` (default: the rank that bounds the step, ``bounding_rank``); a link
    name that recurs on nodes of other pipeline stages carries its stages. Links loaded alike over the whole
    step (the GPUs of an NVL72 rack on their switches) are one line, named after the first with how many it
    stands for."""
    rank = bounding_rank(result) if rank is None else rank
    xs, busy = link_utilisation(result, bins, rank)
    alike: dict[tuple, list] = {}
    for cls, ys in busy.items():
        alike.setdefault(tuple(round(y, 6) for y in ys), []).append(cls)
    groups = sorted(alike.values(), key=lambda members: -sum(busy[members[0]]))[:top]
    names = [_name(members[0]) for members in groups]
    out = []
    for members in groups:
        name = _name(members[0], names)
        if len(members) > 1:
            name += f" (and {len(members) - 1} alike)"
        out.append((members[0], name, busy[members[0]]))
    return xs, out


def _name(cls, all_names: list[str] | None = None) -> str:
    """``nic0 -> leaf0``; with the stages of the link's nodes where the same name recurs on other stages."""
    name = f"{cls[1]} -> {cls[2]}"
    if all_names is not None and all_names.count(name) > 1:
        name += f" [stages {','.join(str(x) for x in sorted(cls[0]))}]"
    return name
