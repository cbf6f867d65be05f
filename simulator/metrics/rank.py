"""One simulated rank's share of the metrics: where its compute stream's time went (forward, backward, optimizer,
the pipeline bubble it waited in) and its communication (exposed, overlapped, per collective), read off the
timeline in one pass over the rank's tasks (``metrics.measure`` adds the ranks up)."""

from __future__ import annotations

from collections import defaultdict

from simulator.program import COMPUTE
from simulator.timeline.timeline import Timeline, intersection_length, length, overlap, union


def rank_metrics(timeline: Timeline, rank_tasks: list, lo: float, hi: float) -> dict:
    """Breakdown, pipeline bubble and communication of one simulated rank.

    The bubble is the compute stream's idle time spent waiting for another rank's work (a pipeline neighbour),
    as a fraction of that idle time plus the rank's forward / backward / recompute time.
    """
    tasks = timeline.tasks
    start, end, free, blocker = timeline.start, timeline.end, timeline.free, timeline.blocker
    parts_of = timeline.parts
    breakdown: dict[str, float] = defaultdict(float)
    pipeline_idle = busy = 0.0
    # one pass sorts the rank's tasks: compute-stream tasks; collectives (network, PCIe, NVMe); and transfers costed
    # alone on a stream of their own (Megatron-Core's overlapped p2p sends: ``_aside``), whose cost is the time a
    # compute stream waits for them (on the receiving rank), not their own span
    compute, collective, aside = [], [], []
    for t in rank_tasks:
        if t.stream == COMPUTE:
            compute.append(t)
        if t.is_collective:
            collective.append(t)
        elif _aside(t, timeline):
            aside.append(t)
    waited: dict[str, float] = defaultdict(float)
    gpu_busy = host_bound = 0.0
    tb, th = timeline.busy, timeline.host_idle
    for t in compute:
        i = t.id
        gpu_busy += tb[i]
        host_bound += th[i]
        ran = end[i] - start[i]
        breakdown[t.phase] += ran
        if t.kind != "optimizer":
            busy += ran
        gap_start, gap_end = free[i] if free[i] > lo else lo, start[i]
        b = blocker[i]
        if gap_end > gap_start:
            # follow the chain: the dependency may itself have waited for another (a gather for a reduction,
            # an all-reduce for the last stage's backward); each stretch goes to the task that held it, and
            # stretches held by another stage's compute are pipeline bubble
            holder, rank = t, t.rank
            while b >= 0 and gap_end > gap_start:
                holder = tasks[b]
                own_start = start[b] if start[b] > gap_start else gap_start
                breakdown[holder.phase] += gap_end - own_start
                if _aside(holder, timeline):
                    waited[_part_key(holder, timeline)] += gap_end - own_start
                elif holder.rank != rank and not holder.is_collective:
                    pipeline_idle += gap_end - own_start
                gap_end = own_start
                b = blocker[b]
            breakdown[holder.phase] += gap_end - gap_start
            if holder.rank != rank and not holder.is_collective and not _aside(holder, timeline):
                pipeline_idle += gap_end - gap_start
    last_compute = max((end[t.id] for t in compute), default=0.0)
    if last_compute < hi:  # trailing communication (e.g. ZeRO-1/2 parameter all-gather after the step)
        last = max(rank_tasks, key=lambda t: end[t.id])
        breakdown[last.phase] += hi - last_compute

    compute_u = union((start[t.id], end[t.id]) for t in compute)
    comm_u = union((start[t.id], end[t.id]) for t in collective)
    overlapped = intersection_length(compute_u, comm_u)
    aside_s = sum(end[t.id] - start[t.id] for t in aside)
    aside_waited = sum(waited.values())
    collectives: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    embedded = hidden = 0.0
    compute_starts = [a for a, _ in compute_u]
    for t in collective:
        d = collectives[f"{t.kind}:{t.group}"]
        a, b = start[t.id], end[t.id]
        d["count"] += 1
        d["time_s"] += b - a
        d["bytes"] += t.bytes
        d["exposed_s"] += max(0.0, b - a) - overlap(a, b, compute_u, compute_starts)
    for t in aside:
        for part in parts_of[t.id]:
            if part.kind == "compute":
                continue
            d = collectives[f"{part.kind}:{part.group}"]
            d["count"] += 1
            d["time_s"] += part.duration_s + part.hidden_s
            d["bytes"] += part.bytes
    for key, seconds in waited.items():
        collectives[key]["exposed_s"] += seconds
    # blocking collectives inside compute tasks; tasks share their parts, so count each tuple once
    uses: dict[int, list] = {}  # id of a parts tuple -> [the tuple, how many of the rank's tasks hold it]
    for t in compute:
        parts = parts_of.get(t.id)
        if parts:
            use = uses.get(id(parts))
            if use is None:
                uses[id(parts)] = [parts, 1]
            else:
                use[1] += 1
    for parts, times in uses.values():
        for part in parts:
            if part.kind == "compute":
                continue
            d = collectives[f"{part.kind}:{part.group}"]
            d["count"] += times
            d["time_s"] += times * (part.duration_s + part.hidden_s)
            d["bytes"] += times * part.bytes
            d["exposed_s"] += times * part.duration_s  # the compute stream waits for it
            embedded += times * part.duration_s
            hidden += times * part.hidden_s
    return {
        "breakdown": breakdown,
        "pipeline_idle": pipeline_idle,
        "busy": busy,
        "gpu_busy": gpu_busy,
        "host_bound": host_bound,
        "exposed": length(comm_u) - overlapped + embedded + aside_waited,
        "overlapped": overlapped + hidden + max(aside_s - aside_waited, 0.0),
        "total": length(comm_u) + embedded + hidden + aside_s,
        "collectives": collectives,
    }


def _aside(t, timeline: Timeline) -> bool:
    """A transfer costed alone on a stream of its own (not the compute stream, not a network collective)."""
    return t.stream != COMPUTE and t.group is None and bool(timeline.parts.get(t.id))


def _part_key(t, timeline: Timeline) -> str:
    """``kind:group`` of such a transfer's collective."""
    part = next(p for p in timeline.parts[t.id] if p.kind != "compute")
    return f"{part.kind}:{part.group}"
