"""Every fidelity figure of the simulator in one run, beside its target.

    python benchmarks/fidelity.py [--small ../shared/validation/measured-a100-small.yaml]

1. the 720 measured small-model A100 runs (Megatron-DeepSpeed; `clustersim validate --cases FILE`): mean and
   median |error|, mean signed error, max;
2. the built-in published runs (`clustersim validate`): median and max |error|;
3. the NVLink all-reduce inside one A100 node (2-8 GPUs) against published nccl-tests curves (docs/collectives.md);
4. the quickstart scenario's MFU, and where its profile comes from;
5. the 1-trillion-parameter 3,072-GPU run's simulation wall time (best of 3);
6. held out, never fitted on: vTrain's 720 runs on a full 8-GPU node (simulator/validation/vtrain-8gpu.yaml) and 109
   multi-node Megatron-DeepSpeed runs (simulator/validation/vtrain-multi.yaml),
   the eight public DeepSpeed runs at scale (simulator/validation/deepspeed.yaml), torchtitan's and MosaicML's own
   tables (torchtitan-2024.yaml, llm-foundry.yaml) and one rank measured on an H100 (h100-rank.yaml).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

from generate_collectives import CURVES, model_time_us  # noqa: E402

from simulator.api import simulate  # noqa: E402
from simulator.scenario.loader import load_scenario  # noqa: E402
from simulator.validation.runner import load_cases, run_cases, summarize  # noqa: E402


def mark(ok: bool) -> str:
    return "ok  " if ok else "MISS"


def small_runs(path: Path) -> None:
    if not path.is_file():
        print(f"1. small-model runs: {path} not found (skipped)")
        return
    results = run_cases(load_cases(path))
    errors = [r.error_pct for r in results if r.error_pct is not None]
    s = summarize(results)
    signed = statistics.fmean(errors)
    print(f"1. {len(errors)} measured small-model A100 runs ({path.name}):")
    print(
        f"   {mark(s['mean_abs_error_pct'] <= 8)} mean |error| {s['mean_abs_error_pct']:.1f}%  (target <= 8%)"
    )
    print(f"   {mark(abs(signed) <= 3)} mean signed error {signed:+.1f}%  (target within +-3%)")
    print(
        f"   {mark(s['max_abs_error_pct'] <= 25)} max |error| {s['max_abs_error_pct']:.1f}%  (target <= 25%)"
    )
    print(f"   {mark(not s['failed'])} failed {s['failed']}; median |error| {s['median_abs_error_pct']:.1f}%")


def published() -> None:
    s = summarize(run_cases(load_cases()))
    print(f"2. {s['n']} built-in published runs:")
    print(
        f"   {mark(s['median_abs_error_pct'] <= 5)} median |error| {s['median_abs_error_pct']:.1f}%  (target <= 5%)"
    )
    print(
        f"   {mark(s['max_abs_error_pct'] <= 15)} max |error| {s['max_abs_error_pct']:.1f}%  (target <= 15%)"
    )


def collectives() -> None:
    print(
        "3. NVLink all-reduce inside one A100 node (2-8 GPUs) vs published nccl-tests (docs/collectives.md):"
    )
    for c in CURVES:
        errs = [
            100 * (model_time_us(c["topology"], c["ranks"], n) / us - 1)
            for n, us in sorted(c["times_us"].items())
        ]
        worst = max(errs, key=abs)
        sizes = sorted(c["times_us"])
        print(
            f"   {mark(abs(worst) <= 15)} {c['id']} ({sizes[0]:,} B to {sizes[-1]:,} B, {c['used_for']}): "
            f"largest error {worst:+.1f}%  (target within 15%)"
        )


def quickstart() -> None:
    r = simulate(load_scenario(ROOT / "scenarios" / "quickstart-gpt3-1.3b-ddp-8xa100.yaml"))
    m = r.metrics
    print(
        f"4. quickstart: MFU {m.mfu:.1%}, {m.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, GPU busy "
        f"{m.host['gpu_busy_fraction']:.0%} (profile {m.framework}; measured MPT-1B on 8x A100: 59.9% MFU)"
    )


def trillion() -> None:
    s = load_scenario(ROOT / "scenarios" / "published" / "nar21-t1-1t.yaml")
    best = min(_timed(s) for _ in range(3))
    print(f"5. {mark(best < 1.0)} 1T parameters on 3,072 GPUs: simulated in {best:.2f} s  (target < 1 s)")


def held_out() -> None:
    print("6. held out (never fitted on):")
    for name in ("vtrain-8gpu", "vtrain-multi", "deepspeed", "torchtitan-2024", "h100-rank", "llm-foundry"):
        results = run_cases(load_cases(ROOT / "simulator" / "validation" / f"{name}.yaml"))
        s = summarize(results)
        signed = statistics.fmean(r.error_pct for r in results if r.error_pct is not None)
        metrics = ", ".join(sorted({r.metric for r in results}))
        print(
            f"   {name}.yaml: {s['n']} runs, median |error| {s['median_abs_error_pct']:.1f}%, mean "
            f"{s['mean_abs_error_pct']:.1f}%, mean signed {signed:+.1f}% of {metrics}, max "
            f"{s['max_abs_error_pct']:.1f}%"
        )


def _timed(s) -> float:
    t0 = time.perf_counter()
    simulate(s)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--small", type=Path, default=ROOT.parent / "shared" / "validation" / "measured-a100-small.yaml"
    )
    args = ap.parse_args()
    small_runs(args.small)
    published()
    collectives()
    quickstart()
    trillion()
    held_out()


if __name__ == "__main__":
    main()
