"""The planner's screen against the simulation over random layouts: dense, mixture-of-experts and FP8.

    python benchmarks/screen_vs_sim.py [layouts per problem, default 60]

For each problem, layouts drawn at random (seeded) from those the screen says fit are simulated; prints the
median and p90 of |estimate / simulated - 1|, the worst layouts, and how many simulate out of memory or above
the screen's memory estimate (the screen must never promise memory the simulation does not find). Each layout is
screened and simulated on the stack that runs it (study/stacks.py), as `plan --model` does.
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from simulator import load_scenario
from simulator.api import simulate
from simulator.errors import ScenarioError
from simulator.hardware.cluster import Cluster
from simulator.hardware.topology import cluster_spec
from simulator.study.layouts import candidates
from simulator.study.stacks import ByStack

PROBLEMS = [
    ("dense llama3-8b, 32 H100", "llama3-8b", "dgx-h100", 32, 256, "bf16"),
    ("MoE olmoe-1b-7b, 32 H100", "olmoe-1b-7b", "dgx-h100", 32, 256, "bf16"),
    ("FP8 llama3-8b, 16 H100", "llama3-8b", "dgx-h100", 16, 128, "fp8"),
]


def problem(model: str, topology: str, gpus: int, batch: int, precision: str):
    base = load_scenario(
        {
            "model": {"preset": model, "seq_length": 4096},
            "cluster": {"topology": topology, "num_nodes": gpus // 8},
            "training": {"global_batch_size": gpus, "micro_batch_size": 1, "precision": precision},
            "parallelism": {"data_parallel": gpus},
        }
    )
    return base, ByStack(base, Cluster(cluster_spec(base), gpus // 8), batch, gpus)


def compare(
    label: str, model: str, topology: str, gpus: int, batch: int, precision: str, n: int, seed: int = 0
):
    base, screen = problem(model, topology, gpus, batch, precision)
    layouts = candidates(base, gpus, 8, {"max_pp": 8}, batch)
    rng = random.Random(seed)
    rng.shuffle(layouts)
    rows, t0 = [], time.perf_counter()
    for lay in layouts:
        if len(rows) >= n:
            break
        try:
            est = screen.estimate(lay)
            if not est.fits:
                continue
            m = simulate(screen.scenario(lay)).metrics
        except ScenarioError:
            continue
        rows.append((lay, est, m))
    errors = [abs(e.iteration_s / m.iteration_time_s - 1) for _, e, m in rows]
    below = [
        (lay.label(), e.memory_gib, m.memory_gib["device"])
        for lay, e, m in rows
        if m.memory_gib["device"] > e.memory_gib
    ]
    oom = sum(1 for _, _, m in rows if m.oom)
    lowest = min(e.memory_gib / m.memory_gib["device"] for _, e, m in rows)
    q = statistics.quantiles(errors, n=10) if len(errors) > 1 else errors
    print(
        f"{label}: {len(rows)} layouts in {time.perf_counter() - t0:.1f} s; |estimate / simulated - 1| median "
        f"{100 * statistics.median(errors):.1f}%, p90 {100 * q[-1]:.1f}%; simulated memory above the screen's on "
        f"{len(below)} (the screen's at least {lowest:.1%} of it), out of memory {oom}"
    )
    for lay, e, m in sorted(rows, key=lambda r: -abs(r[1].iteration_s / r[2].iteration_time_s - 1))[:3]:
        print(f"  {lay.label():48s} estimate {e.iteration_s:8.3f} s  simulated {m.iteration_time_s:8.3f} s")
    for name, est, sim in below[:3]:
        print(f"  memory: {name:40s} screen {est:6.1f} GiB  simulated {sim:6.1f} GiB")


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    for p in PROBLEMS:
        compare(*p, n)
