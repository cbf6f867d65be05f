"""1-bit Adam against Adam at scale: wall time and Python heap peak of simulate() for a data-parallel GPT-3 1.3B
on 1,024 to 16,384 H100 (issue 34 item 7: the compressed step's momentum all-to-all over the whole data-parallel
group had n(n-1) pairs, 34 s and 7.1 GB at 16,384 GPUs; target: within 2x Adam's time and memory).

Run: python benchmarks/onebit_scale.py   (best of 3 wall time, caches cold per run; heap peak from tracemalloc
in a separate pass; not a test)
"""

from __future__ import annotations

import time
import tracemalloc

from simulator import load_scenario, simulate


def scenario(optimizer: str, gpus: int):
    return load_scenario(
        {
            "name": f"{optimizer}-{gpus}",
            "model": {"preset": "gpt3-1.3b"},
            "cluster": {"topology": "dgx-h100", "num_nodes": gpus // 8},
            "training": {"global_batch_size": gpus, "micro_batch_size": 1, "optimizer": optimizer},
            "parallelism": {"data_parallel": gpus},
        }
    )


def measure(optimizer: str, gpus: int) -> tuple[float, float, float]:
    walls = []
    for _ in range(3):
        s = scenario(optimizer, gpus)  # a fresh scenario: no cost cached from the previous run
        t = time.perf_counter()
        r = simulate(s)
        walls.append(time.perf_counter() - t)
    tracemalloc.start()
    simulate(scenario(optimizer, gpus))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return min(walls), peak / 2**20, r.metrics.iteration_time_s


def main() -> None:
    print(
        f"{'GPUs':>6s} {'optimizer':12s} {'sim. iteration':>15s} {'wall':>8s} {'heap peak':>10s} {'x Adam':>14s}"
    )
    for gpus in (1024, 4096, 16384):
        base = None
        for optimizer in ("adam", "onebit-adam"):
            wall, peak, it = measure(optimizer, gpus)
            ratio = "" if base is None else f"{wall / base[0]:.2f} / {peak / base[1]:.2f}"
            base = base or (wall, peak)
            print(f"{gpus:6d} {optimizer:12s} {it * 1e3:12.1f} ms {wall:7.2f}s {peak:8.1f}MB {ratio:>14s}")
    print("x Adam: wall time / heap peak; the target is <= 2 / 2")


if __name__ == "__main__":
    main()
