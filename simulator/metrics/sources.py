"""Where the iteration's costs came from: the share of compute and of communication time that is measured,
interpolated or modelled (calibration tables, ``simulator/tables/lookup.py``), and the largest modelled ops,
so a user knows what to measure next."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from simulator.tables.lookup import INTERPOLATED, MEASURED, MODELLED, SHAPED
from simulator.timeline.timeline import Timeline
from simulator.workload.ops import Op, OpsMemo

SOURCES = (MEASURED, INTERPOLATED, MODELLED)


def describe(op: Op) -> str:
    """An op as a user would look it up in a table: name, then kernel kind, pass and shape."""
    if op.window:  # a sliding-window attention kernel: no table's columns state its window
        return f"{op.name} [attention {op.direction}, m={op.m} k={op.k} batch={op.batch} window={op.window}, no table kind]"
    if not op.kernel:
        return f"{op.name} [no table kind]"
    if op.kernel in SHAPED:
        shape = f"m={op.m} n={op.n} k={op.k}" + (f" batch={op.batch}" if op.batch > 1 else "")
    elif op.n == 1:
        shape = f"{op.m:,} elements"
    else:
        shape = f"m={op.m} n={op.n}"
    return f"{op.name} [{op.kernel} {op.direction}, {shape}]"


def summarise_sources(seconds: dict, top: int = 5) -> tuple[dict[str, dict[str, float]], list[dict]]:
    """The fractions and the ``top`` modelled ops from :func:`source_seconds`' totals."""
    fractions = {
        kind: {src: (acc[src] / sum(acc.values()) if sum(acc.values()) > 0 else 0.0) for src in SOURCES}
        for kind, acc in ((k, seconds[k]) for k in ("compute", "communication"))
    }
    largest = sorted(seconds["modelled"].items(), key=lambda kv: -kv[1])[:top]
    return fractions, [{"kind": k, "op": name, "time_per_gpu_s": s} for (k, name), s in largest]


def source_seconds(
    timeline: Timeline,
    lo: float,
    hi: float,
    op_cost: Callable[[Op], tuple[float, str]],
    comm_source: Callable[[str, str, float, int | None], str],
    memo: OpsMemo | None = None,
) -> dict:
    """Seconds per GPU of compute and of communication by source (measured, interpolated, modelled) over
    [lo, hi), and of each modelled op (``modelled``: {(kind, op): seconds}). ``memo``: each ops tuple's own
    sums, kept from an earlier call with the same ``op_cost``."""
    program = timeline.program
    start, end, parts_of = timeline.start, timeline.end, timeline.parts
    gpus = sum(r.count for r in program.ranks) or 1
    weight = [r.count / gpus for r in program.ranks]
    # tasks share their ops and parts tuples: add up each tuple's weight, then cost each tuple once
    ops_weight: dict[int, float] = defaultdict(float)
    parts_weight: dict[int, float] = defaultdict(float)
    distinct: dict[int, tuple] = {}
    comm: dict[tuple, float] = defaultdict(float)  # (kind, group, bytes, stage) -> weighted seconds
    for t in program.tasks:
        if not lo <= start[t.id] < hi:
            continue
        if t.group is None and t.ops:
            ops_weight[id(t.ops)] += weight[t.rank]
            distinct[id(t.ops)] = t.ops
            parts = parts_of.get(t.id)
            if parts:
                parts_weight[id(parts)] += weight[t.rank]
                distinct[id(parts)] = parts
        elif t.is_collective:
            key = (t.kind, t.group, t.bytes, program.ranks[t.rank].stage)
            comm[key] += weight[t.rank] * (end[t.id] - start[t.id])
    totals = {k: defaultdict(float, dict.fromkeys(SOURCES, 0.0)) for k in ("compute", "communication")}
    modelled: dict[tuple[str, str], float] = defaultdict(float)
    memo = memo or OpsMemo()

    def sums(ops: tuple) -> tuple[dict[str, float], dict[str, float]]:
        """One tuple's compute seconds by source, and by modelled op."""
        by_source: dict[str, float] = defaultdict(float)
        by_op: dict[str, float] = defaultdict(float)
        for op in ops:
            if op.kind in ("collective", "host", "sync"):
                continue
            seconds, source = op_cost(op)
            by_source[source] += seconds
            if source == MODELLED:
                by_op[describe(op)] += seconds
        return dict(by_source), dict(by_op)

    for key, w in ops_weight.items():
        by_source, by_op = memo.get(distinct[key], sums)
        for source, seconds in by_source.items():
            totals["compute"][source] += w * seconds
        for name, seconds in by_op.items():
            modelled[("compute", name)] += w * seconds
    for key, w in parts_weight.items():
        for part in distinct[key]:
            if part.kind != "compute":
                comm[(part.kind, part.group, part.bytes, None)] += w * (part.duration_s + part.hidden_s)
    for (kind, group, nbytes, stage), seconds in comm.items():
        source = comm_source(kind, group, nbytes, stage)
        totals["communication"][source] += seconds
        if source == MODELLED:
            modelled[("communication", f"{kind} on {group} ({nbytes / 2**20:,.1f} MiB)")] += seconds
    return {**{k: dict(v) for k, v in totals.items()}, "modelled": dict(modelled)}
