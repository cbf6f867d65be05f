"""Chrome-trace JSON (opens in Perfetto, ui.perfetto.dev, and chrome://tracing): a process per simulated rank,
a thread per stream, complete events ("X") in microseconds with the operation's details as arguments."""

from __future__ import annotations

import json
from pathlib import Path

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
        events.append(
            {
                "ph": "X",
                "name": t.name,
                "cat": t.kind,
                "pid": t.rank,
                "tid": streams[key],
                "ts": float(start) * 1e6,
                "dur": float(end - start) * 1e6,
                "args": args,
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"strategy": program.strategy, "iteration_time_s": timeline.makespan_s},
    }


def write_trace(timeline: Timeline, path: str | Path) -> None:
    Path(path).write_text(json.dumps(chrome_trace(timeline)))
