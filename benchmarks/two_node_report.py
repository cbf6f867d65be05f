"""Simulated vs reported: the 2-node Megatron-DeepSpeed report (baseline, ZeRO-1/2/3; 2 nodes x 1 GPU, Ethernet).

The report's network is "1-10 Gb/s". This script runs the scenarios at the topology's 10 Gb/s, then fits ONE
number, the Ethernet bandwidth, on the small model's baseline iteration time and predicts every other row with
it. Memory is compared as DeepSpeed and Megatron print it (bytes / 2**30, labelled GB). Prints a Markdown table
(used in docs/two-node-report.md).  Run: python benchmarks/two_node_report.py
"""

from __future__ import annotations

from pathlib import Path

from simulator import load_scenario, simulate

ROOT = Path(__file__).resolve().parents[1]
# Reported by the report's author (shared/validation/published.yaml, seed_report_megatron_deepspeed_2node)
REPORTED = {
    "small": {
        "baseline": (1.211, 6.60, 1.48),
        "pipeline": (0.986, 8.12, 0.88),
        "zero1": (1.769, 4.52, 2.06),
        "zero2": (2.861, 2.80, 1.62),
        "zero3": (2.166, 3.69, 2.05),
    },
    "large": {
        "baseline": (7.009, 2.28, 6.69),
        "pipeline": (8.574, 1.87, 3.88),
        "zero1": (10.041, 1.59, 5.38),
        "zero2": (28.358, 0.56, 5.64),
        "zero3": (24.469, 0.65, 5.38),
    },
}


def run(size: str, method: str, gbps: float):
    s = load_scenario(ROOT / "scenarios" / f"mds-2node-{size}-{method}.yaml")
    s = s.model_copy(update={"cluster": s.cluster.model_copy(update={"nic_bandwidth_gbps": gbps})})
    return simulate(s).metrics


def fit_bandwidth() -> float:
    target = REPORTED["small"]["baseline"][0]
    lo, hi = 0.01, 100.0  # Gb/s; iteration time falls as bandwidth rises
    for _ in range(50):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if run("small", "baseline", mid).iteration_time_s > target else (lo, mid)
    return (lo * hi) ** 0.5


def main() -> None:
    fitted = fit_bandwidth()
    print(f"Fitted Ethernet bandwidth (small baseline): {fitted:.3f} Gb/s\n")
    print(
        "| model | method | reported s/iter | simulated @10 Gb/s | simulated @fitted | error @fitted | "
        "reported samples/s | simulated samples/s @fitted | reported peak GB | simulated peak GiB | memory error |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size, rows in REPORTED.items():
        for method, (t, sps, mem) in rows.items():
            m10, mf = run(size, method, 10.0), run(size, method, fitted)
            err = 100 * (mf.iteration_time_s / t - 1)
            peak = mf.memory_gib["peak"]
            print(
                f"| {size} | {method} | {t:.3f} | {m10.iteration_time_s:.3f} | {mf.iteration_time_s:.3f} | "
                f"{err:+.0f}% | {sps:.2f} | {mf.samples_per_s:.2f} | {mem:.2f} | {peak:.2f} | "
                f"{100 * (peak / mem - 1):+.0f}% |"
            )
    print()
    for size in REPORTED:
        rep = sorted(REPORTED[size], key=lambda k: REPORTED[size][k][0])
        sim = sorted(REPORTED[size], key=lambda k: run(size, k, fitted).iteration_time_s)
        print(f"- {size}: reported ranking {' < '.join(rep)}; simulated {' < '.join(sim)}")
    print("\nBreakdown at the fitted bandwidth (forward / backward / optimizer, s):")
    for size in REPORTED:
        for method in REPORTED[size]:
            b = run(size, method, fitted).breakdown
            print(f"- {size} {method}: {b['forward_s']:.2f} / {b['backward_s']:.2f} / {b['optimizer_s']:.2f}")


if __name__ == "__main__":
    main()
