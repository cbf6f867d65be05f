"""Chrome-trace JSON (opens in Perfetto, ui.perfetto.dev, and chrome://tracing): a process per simulated rank,
a thread per stream, complete events ("X") in microseconds with the operation's details as arguments, flow
arrows from each step to the step on another rank that waits for it (pipeline sends), and counters per rank:
activations in flight and memory."""

from __future__ import annotations

import json
from pathlib import Path

from simulator.program import COMPUTE
from simulator.report.output import write_atomic
from simulator.timeline.timeline import Timeline


def chrome_trace(timeline: Timeline) -> dict:
    program = timeline.program
    events: list[dict] = []
    streams: dict[tuple[int, str], int] = {}
    for rank, rc in enumerate(program.ranks):
        events.append(
            {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}: {rc.label}"}}
        )
    for t in program.tasks:
        key = (t.rank, t.stream)
        if key not in streams:
            streams[key] = len([k for k in streams if k[0] == t.rank])
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": t.rank,
                    "tid": streams[key],
                    "args": {"name": t.stream},
                }
            )
        start, end = timeline.start[t.id], timeline.end[t.id]
        args = {"kind": t.kind, "phase": t.phase}
        if t.microbatch >= 0:
            args["microbatch"] = t.microbatch
        if t.is_collective:
            args.update(group=t.group, bytes=int(t.bytes))
        else:
            args["flops"] = float(sum(op.flops for op in t.ops))
            parts = timeline.parts.get(t.id)
            if parts:
                args["collectives_inside"] = [
                    f"{p.name}: {p.duration_s * 1e3:.3f} ms" for p in parts if p.kind != "compute"
                ]
        events.append(
            {
                "ph": "X",
                "name": t.name,
                "cat": t.kind,
                "pid": t.rank,
                "tid": streams[key],
                "ts": start * 1e6,
                "dur": (end - start) * 1e6,
                "args": args,
            }
        )
    events += _flows(timeline, streams) + _counters(timeline)
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
                    "ts": timeline.end[d] * 1e6 - 0.001,
                }
            )
            out.append(
                {
                    **common,
                    "ph": "f",
                    "bp": "e",
                    "pid": t.rank,
                    "tid": streams[(t.rank, t.stream)],
                    "ts": timeline.start[t.id] * 1e6,
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
                    "ts": ts * 1e6,
                    "args": {"steps": n},
                }
            )
            out.append(
                {
                    "ph": "C",
                    "name": "memory (GiB)",
                    "pid": rank,
                    "ts": ts * 1e6,
                    "args": {"GiB": round(states + m.activations / 2**30 * n / peak, 3)},
                }
            )
    return out


def write_trace(timeline: Timeline, path: str | Path) -> None:
    write_atomic(Path(path), json.dumps(chrome_trace(timeline)))
