"""Simulator speed at scale: simulated iteration time, event count and wall time per scenario; then the 1T
run at 1x, 4x and 16x its micro-batches, extrapolated from three short runs (the default) and replayed in full
(``periodic=False``), with the Python heap's peak (tracemalloc, a separate pass).

Run: python benchmarks/bench_scale.py   (prints tables: the first run's wall time, caches cold, and the best
of 3; not a test)
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from pathlib import Path

from simulator import load_scenario, simulate
from simulator.api import with_microbatches

ROOT = Path(__file__).resolve().parents[1]
CASES = [
    "scenarios/gpt3-175b-zero3-384xa100.yaml",
    "scenarios/gpt3-175b-zero3-1536xa100.yaml",
    "scenarios/llama2-7b-fsdp2-512xh100.yaml",
    "scenarios/published/nar21-t1-1t.yaml",
    "scenarios/published/kor22-530b-sp-selective.yaml",
    "scenarios/llama3-405b-4d-cp1-8192xh100.yaml",
    "scenarios/llama3-405b-4d-cp1-16384xh100.yaml",
    "scenarios/llama3-405b-4d-cp16-16384xh100.yaml",
]


def main(paths: list[str]) -> None:
    print(
        f"{'scenario':32s} {'GPUs':>6s} {'sim. iteration':>15s} {'ranks':>6s} {'tasks':>9s} {'SimPy ev.':>9s}"
        f" {'wall: first':>12s} {'best of 3':>10s}"
    )
    for rel in paths:
        s = load_scenario(ROOT / rel)
        walls = []
        for _ in range(3):
            t0 = time.perf_counter()
            m = simulate(s).metrics
            walls.append(time.perf_counter() - t0)
        print(
            f"{s.name:32s} {m.gpus:6d} {m.iteration_time_s:13.3f} s {m.ranks_simulated:6,d} {m.tasks:9,d}"
            f" {m.events:9,d} {walls[0]:10.3f} s"
            f" {min(walls):8.3f} s"
        )


def microbatch_scaling(rel: str = "scenarios/published/nar21-t1-1t.yaml") -> None:
    base = load_scenario(ROOT / rel)
    m0 = base.gradient_accumulation_steps
    print(f"\n{base.name} at 1x / 4x / 16x its {m0} micro-batches per pipeline")
    print(
        f"{'micro-batches':>13s} {'mode':>9s} {'sim. iteration':>15s} {'tasks':>9s} {'wall: first':>12s}"
        f" {'best of 3':>10s} {'heap peak':>10s}"
    )
    for factor in (1, 4, 16):
        s = with_microbatches(base, m0 * factor)
        for periodic in (True, False):
            walls = []
            for _ in range(3 if periodic or factor == 1 else 1):
                t0 = time.perf_counter()
                m = simulate(s, periodic=periodic).metrics
                walls.append(time.perf_counter() - t0)
            tracemalloc.start()
            simulate(s, periodic=periodic)
            heap = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            mode = "periodic" if m.periodic else "every"
            print(
                f"{m0 * factor:13,d} {mode:>9s} {m.iteration_time_s:13.3f} s {m.tasks:9,d} {walls[0]:10.3f} s"
                f" {min(walls):8.3f} s {heap / 2**20:7.0f} MiB"
            )


if __name__ == "__main__":
    main(sys.argv[1:] or CASES)
    if not sys.argv[1:]:
        microbatch_scaling()
