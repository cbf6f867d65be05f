"""Chrome-trace JSON (opens in Perfetto, ui.perfetto.dev, and chrome://tracing): a process per simulated rank,
a thread per stream, complete events ("X") in microseconds with the operation's details as arguments, the
collectives inside compute steps (TP all-reduces, pipeline sends, ring attention) on threads of their own as
the HTML report draws them, flow arrows from each step to the step on another rank that waits for it (pipeline
sends), counters per rank (activations in flight, memory) and, given the whole result, a "links" process with
the busiest link classes' utilisation as counter tracks (report/links.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from simulator.api import Result
from simulator.program import COMPUTE
from simulator.report.links import busiest
from simulator.report.output import write_atomic
from simulator.timeline.timeline import Timeline


def _us(seconds: float) -> float:
    """Trace time: microseconds to the nanosecond (with compact separators a 1T run's trace shrinks from 88 to
    73 MB)."""
    return round(seconds * 1e6, 3)


def _dur(start_s: float, end_s: float) -> float:
    """A slice's duration in trace time: it ends exactly at ``_us(end_s)`` (a flow leaving it starts 1 ns
    before)."""
    return round(_us(end_s) - _us(start_s), 3)


def chrome_trace(source: Timeline | Result, links: int = 8, bins: int = 400) -> dict:
    """The trace of a timeline; of a Result, with the ``links`` busiest link classes as counters over ``bins``
    time bins."""
    timeline = source.timeline if isinstance(source, Result) else source
    program = timeline.program
    events: list[dict] = []
    streams: dict[tuple[int, str], int] = {}
    flops: dict[int, float] = {}
    for rank, rc in enumerate(program.ranks):
        events.append(
            {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}: {rc.label}"}}
        )

    def thread(rank: int, name: str) -> int:
        """The thread id of ``name`` on ``rank``'s process, named on first use."""
        key = (rank, name)
        if key not in streams:
            streams[key] = len([k for k in streams if k[0] == rank])
            events.append(
                {"ph": "M", "name": "thread_name", "pid": rank, "tid": streams[key], "args": {"name": name}}
            )
        return streams[key]

    for t in program.tasks:
        tid = thread(t.rank, t.stream)
        start, end = timeline.start[t.id], timeline.end[t.id]
        args = {"kind": t.kind, "phase": t.phase}
        if t.microbatch >= 0:
            args["microbatch"] = t.microbatch
        if t.is_collective:
            args.update(group=t.group, bytes=int(t.bytes))
        else:
            if id(t.ops) not in flops:  # tasks share ops tuples
                flops[id(t.ops)] = float(sum(op.flops for op in t.ops))
            args["flops"] = flops[id(t.ops)]
        events.append(
            {
                "ph": "X",
                "name": t.name,
                "cat": t.kind,
                "pid": t.rank,
                "tid": tid,
                "ts": _us(start),
                "dur": _dur(start, end),
                "args": args,
            }
        )
        for sp in () if t.is_collective else timeline.inner_spans(t.id):
            inner = thread(t.rank, f"{sp.group} (inside compute)")
            events.append(
                {
                    "ph": "X",
                    "name": f"{sp.count} x {sp.kind.replace('_', '-')}",
                    "cat": sp.kind,
                    "pid": t.rank,
                    "tid": inner,
                    "ts": _us(sp.first_s),
                    "dur": _dur(sp.first_s, sp.first_s + sp.seconds),  # as long as they last together
                    "args": {
                        "in": t.name,
                        "group": sp.group,
                        "count": sp.count,
                        "bytes": int(sp.bytes),
                        "spread_ms": round((sp.last_s - sp.first_s) * 1e3, 6),
                    },
                }
            )
    events += _flows(timeline, streams) + _counters(timeline)
    if isinstance(source, Result):
        events += _link_counters(source, len(program.ranks), links, bins)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"strategy": program.strategy, "iteration_time_s": timeline.makespan_s},
    }


def _flows(timeline: Timeline, streams: dict) -> list[dict]:
    """An arrow from a task to each task of another rank that depends on it (activations / gradients sent)."""
    tasks, out, flow_id = timeline.tasks, [], 0
    for t in tasks:
        for d in t.deps:
            src = tasks[d]
            if src.rank == t.rank:
                continue
            flow_id += 1
            common = {"name": "send/recv", "cat": "pipeline", "id": flow_id}
            out.append(
                {
                    **common,
                    "ph": "s",
                    "pid": src.rank,
                    "tid": streams[(src.rank, src.stream)],
                    "ts": round(_us(timeline.end[d]) - 0.001, 3),  # inside the sending step
                }
            )
            out.append(
                {
                    **common,
                    "ph": "f",
                    "bp": "e",
                    "pid": t.rank,
                    "tid": streams[(t.rank, t.stream)],
                    "ts": _us(timeline.start[t.id]),
                }
            )
    return out


def _counters(timeline: Timeline) -> list[dict]:
    """Per rank: forward steps whose backward has not run yet (activations held), and memory: model states
    plus activations scaled so the counter's peak is the rank's analytic peak."""
    out = []
    for rank, rc in enumerate(timeline.program.ranks):
        changes = []
        for t in timeline.tasks:
            if (
                t.rank != rank
                or t.stream != COMPUTE
                or t.kind not in ("forward", "backward")
                or t.name.startswith("W")
            ):
                continue
            changes.append((timeline.end[t.id], 1 if t.kind == "forward" else -1))
        changes.sort()
        live, peak, series = 0, 1, []
        for ts, delta in changes:
            live += delta
            peak = max(peak, live)
            series.append((ts, live))
        m = rc.memory
        states = (m.params + m.grads + m.optimizer + m.buffers) / 2**30
        for ts, n in [(0.0, 0), *series]:
            out.append(
                {
                    "ph": "C",
                    "name": "activations in flight (steps)",
                    "pid": rank,
                    "ts": _us(ts),
                    "args": {"steps": n},
                }
            )
            out.append(
                {
                    "ph": "C",
                    "name": "memory (GiB)",
                    "pid": rank,
                    "ts": _us(ts),
                    "args": {"GiB": round(states + m.activations / 2**30 * n / peak, 3)},
                }
            )
    return out


def _link_counters(result: Result, pid: int, top: int, bins: int) -> list[dict]:
    """A "links" process: the ``top`` busiest link classes' utilisation (% of bandwidth) as counter tracks."""
    xs, ranked = busiest(result, top, bins)
    half = (xs[1] - xs[0]) / 2 if len(xs) > 1 else 0.0
    out = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": pid,
            "args": {"name": "links (collectives of the rank that bounds the step)"},
        }
    ]
    for _, link, ys in ranked:
        name = f"{link} (% busy)"
        previous = None
        for x, y in zip(xs, ys, strict=True):
            value = round(100 * y, 2)
            if value != previous:  # a counter holds its value until the next sample
                out.append({"ph": "C", "name": name, "pid": pid, "ts": _us(x - half), "args": {"%": value}})
                previous = value
    return out


def write_trace(source: Timeline | Result, path: str | Path) -> None:
    """The trace as compact JSON; gzip-compressed where ``path`` ends in ``.gz`` (Perfetto opens ``.json.gz``:
    a 1T run's 73 MB trace takes 5.4 MB)."""
    text = json.dumps(chrome_trace(source), separators=(",", ":"))
    path = Path(path)
    write_atomic(path, gzip.compress(text.encode(), 6) if path.suffix == ".gz" else text)
