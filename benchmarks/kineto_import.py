"""Kineto (PyTorch profiler) trace import time against trace size and nesting (issue 34 item 4: the walk up each
op's parent chain made 20,000 nested CPU ops take 28 s; target: a 100,000-event nested trace in under 5 s).

Each trace has N CPU ops: ``nested`` puts every op inside the one before it (one chain N deep, an aten::mm at
every 10th level), ``flat`` puts them side by side; a GPU kernel launched from every 10th op.

Run: python benchmarks/kineto_import.py   (not a test)
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from simulator.calibration.importers.kineto import import_trace


def trace(n: int, nested: bool) -> dict:
    events = []
    for i in range(n):
        ts, dur = (i, 2 * n - 2 * i) if nested else (10 * i, 5)
        name = "aten::mm" if i % 10 == 0 else "aten::view"
        args = {"External id": i, "Input Dims": [[64, 128], [128, 256]], "Input type": ["c10::BFloat16"] * 2}
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}
        )
        if i % 10 == 0:
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "sm90_gemm",
                    "pid": 0,
                    "tid": 7,
                    "ts": ts,
                    "dur": 3.0,
                    "args": {"External id": i},
                }
            )
    return {"traceEvents": events}


def main() -> None:
    print(f"{'ops':>8s} {'shape':8s} {'events':>8s} {'MB':>6s} {'import':>9s} {'kernel rows':>12s}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (10_000, 20_000, 100_000):
            for nested in (False, True):
                path = Path(tmp) / "t.json"
                path.write_text(json.dumps(trace(n, nested)))
                t = time.perf_counter()
                kernels, _, _ = import_trace(path)
                wall = time.perf_counter() - t
                events = n + n // 10
                shape = "nested" if nested else "flat"
                size = path.stat().st_size / 2**20
                print(f"{n:8,d} {shape:8s} {events:8,d} {size:6.1f} {wall:8.2f}s {len(kernels):12d}")
    print("target: 100,000 nested in under 5 s")


if __name__ == "__main__":
    main()
