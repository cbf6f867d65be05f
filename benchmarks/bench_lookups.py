"""Cost-table lookups: how fast, how accurate, and what they cost a large run.

Run: python benchmarks/bench_lookups.py   (prints numbers; not a test)

1. Lookups per second on the shipped A100 table, uncached (a run caches every distinct op, so a run does a few
   hundred of these): GEMMs between measured shapes, memory-bound kernels, collectives.
2. Interpolation accuracy: every GEMM row of a model's shapes is predicted from the other models' rows only
   (leave one model out), against its measured time; and the roofline alone on the same rows.
3. The 1-trillion-parameter, 3,072-GPU run of Narayanan et al. with the shipped table and with the pure model.
"""

from __future__ import annotations

import random
import re
import statistics
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

from simulator import load_scenario, simulate
from simulator.costs.compute import shape_roofline_s
from simulator.hardware.gpus import get_gpu
from simulator.tables.io import read_table
from simulator.tables.lookup import CollectiveLookup, KernelLookup
from simulator.tables.select import shipped_tables

ROOT = Path(__file__).resolve().parents[1]


def rate(fn, queries) -> float:
    t0 = time.perf_counter()
    for q in queries:
        fn(*q)
    return len(queries) / (time.perf_counter() - t0)


def lookups_per_second(gpu_name: str) -> None:
    table = read_table(shipped_tables()[gpu_name])
    gpu = get_gpu(gpu_name)
    build = float("inf")
    for _ in range(3):  # the best of three: the first also pays for warming numpy up
        t0 = time.perf_counter()
        look = KernelLookup(table.kernels, partial(shape_roofline_s, gpu))
        look.exact  # noqa: B018 - every kind's lookups made (a run makes those it queries, when it first does)
        build = min(build, time.perf_counter() - t0)
    rng = random.Random(0)
    gemms = []
    for _ in range(2000):
        m, n, k = (int(2 ** rng.uniform(9, 14)) for _ in range(3))
        gemms.append(
            (
                "gemm",
                "forward",
                "fp16",
                m,
                n,
                k,
                1,
                shape_roofline_s(gpu, "gemm", "forward", "fp16", m, n, k, 1),
            )
        )
    mems = [
        ("rmsnorm", "forward", "fp16", int(2 ** rng.uniform(4, 15)), 4096, 0, 1, 0.0) for _ in range(5000)
    ]
    colls = CollectiveLookup(table.collectives)
    cqs = [("all_reduce", 8, 1, 8, 2 ** rng.uniform(12, 30)) for _ in range(5000)]
    hits = sum(look.cost(*q) is not None for q in gemms)
    print(
        f"{gpu_name}: {len(table.kernels):,} kernel rows, every kind's lookup built in {build * 1e3:.0f} ms"
    )
    print(
        f"  GEMM lookups (interpolation over {len(look.shaped[('gemm', 'forward', 'fp16')].x):,} rows): {rate(look.cost, gemms):,.0f} /s, {hits / len(gemms):.0%} inside the measured range"
    )
    print(f"  memory-bound kernel lookups: {rate(look.cost, mems):,.0f} /s")
    print(f"  collective lookups: {rate(colls.cost, cqs):,.0f} /s")


def leave_one_model_out(gpu_name: str) -> None:
    table = read_table(shipped_tables()[gpu_name])
    gpu = get_gpu(gpu_name)
    roof = partial(shape_roofline_s, gpu)
    rows = [r for r in table.kernels if r.op == "gemm"]
    model_of = [re.search(r"\((.+?), tp", r.name).group(1) for r in rows]
    by_model = defaultdict(list)
    for r, m in zip(rows, model_of, strict=True):
        by_model[m].append(r)
    errors, outside, roofline = [], 0, []
    for held, test in by_model.items():
        look = KernelLookup([r for r, m in zip(rows, model_of, strict=True) if m != held], roof)
        for r in test:
            rs = roof("gemm", "forward", r.dtype, r.m, r.n, r.k, 1)
            roofline.append(abs(rs / r.seconds - 1))
            hit = look.cost("gemm", "forward", r.dtype, r.m, r.n, r.k, 1, rs)
            if hit is None:
                outside += 1
            else:
                errors.append(abs(hit[0] / r.seconds - 1))
    errors.sort()
    print(
        f"{gpu_name}: {len(errors):,} GEMM rows predicted from the other models' rows "
        f"({outside} outside their range, left to the model): median |error| {100 * statistics.median(errors):.1f}%, "
        f"90th percentile {100 * errors[int(0.9 * len(errors))]:.1f}%; "
        f"the roofline alone: median {100 * statistics.median(roofline):.1f}%"
    )


def large_run() -> None:
    s = load_scenario(ROOT / "scenarios/published/nar21-t1-1t.yaml")
    for kernels in ("auto", "none"):
        walls = []
        for _ in range(3):
            t0 = time.perf_counter()
            m = simulate(s.model_copy(update={"kernels": kernels})).metrics
            walls.append(time.perf_counter() - t0)
        src = m.cost_sources["compute"]
        print(
            f"NAR21-T1-1T (3,072 GPUs) kernels={kernels:4s}: wall first {walls[0]:.3f} s, best of 3 {min(walls):.3f} s; "
            f"compute {src['measured'] + src['interpolated']:.0%} from the table"
        )


if __name__ == "__main__":
    for gpu in ("a100-sxm4-80gb", "h100-sxm5-80gb"):
        lookups_per_second(gpu)
    for gpu in ("a100-sxm4-80gb", "h100-sxm5-80gb"):
        leave_one_model_out(gpu)
    large_run()
