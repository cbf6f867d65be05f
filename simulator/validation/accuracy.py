"""The error bar of a simulated run, measured: how far the simulation has been from measured runs it was never
fitted on, by framework profile, GPU generation and job size (simulator/metrics/error_bar.py looks a run's up).

``accuracy.yaml`` holds the figures. They are written from the validation files that ship in this folder:
every case of ``HELD_OUT``, except the cases a profile's factors were fitted on (its ``fit_cases`` and its
per-GPU ones). The 720 small runs that megatron-2022 is fitted on are not shipped, so they never count.
Rewrite the file after any change that moves a prediction, as the snapshot is rewritten:

    python -m simulator.validation.accuracy        # rewrites simulator/validation/accuracy.yaml

tests/test_accuracy.py fails while the file disagrees with the simulator as it stands.

Speed errors are signed so that positive means the simulation is faster than the measured run (optimistic),
whatever the metric: an iteration time compares as measured / simulated, a throughput as simulated / measured.
Memory errors are simulated / measured, less 1: positive means the simulation needs more memory than measured.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from simulator.metrics.error_bar import ACCURACY_FILE, scale_of, stored

HERE = Path(__file__).resolve().parent
# The held-out validation files, by stem (simulator/validation/<stem>.yaml): docs/validation.md describes each.
HELD_OUT = (
    "published",
    "vtrain-8gpu",
    "vtrain-multi",
    "deepspeed",
    "torchtitan-2024",
    "llm-foundry",
    "h100-rank",
    "moe",
    "fp8",
    "memory",
)
SPEED_METRICS = ("iteration_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu")
MEMORY_METRICS = ("peak_memory_gib", "reserved_memory_gib")


def speed_error_pct(metric: str, published: float, predicted: float) -> float:
    """Simulated speed over measured speed, less 1, in %: positive = the simulation is faster than measured."""
    if metric == "iteration_time_s":
        return 100.0 * (published / predicted - 1.0)
    return 100.0 * (predicted / published - 1.0)


def summary(errors: list[float], sets: Counter) -> dict:
    """n, median / 90th-percentile / max |error| and the mean signed error (%), and how many runs each file gave."""
    magnitudes = sorted(abs(e) for e in errors)
    p90 = (
        statistics.quantiles(magnitudes, n=10, method="inclusive")[-1]
        if len(magnitudes) > 1
        else magnitudes[0]
    )
    return {
        "n": len(errors),
        "median_abs_pct": round(statistics.median(magnitudes), 2),
        "p90_abs_pct": round(p90, 2),
        "max_abs_pct": round(magnitudes[-1], 2),
        "mean_signed_pct": round(statistics.fmean(errors), 2),
        "sets": dict(sorted(sets.items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def fitted_case_ids() -> set[str]:
    """Every case id a shipped profile's factors were fitted on."""
    from simulator.frameworks import PROFILE_DIR, get_framework

    return set().union(*(get_framework(path.stem).fitted_on for path in PROFILE_DIR.glob("*.yaml")))


def measure(progress=None) -> dict:
    """Run every held-out case and group the errors by profile, by profile and GPU generation, and by those and
    the job's size (``scale_of``); ``progress(stem, n)`` after each file."""
    from simulator.validation.runner import load_cases, run_cases

    fitted = fitted_case_ids()
    errors: dict[str, dict[str, list]] = {"speed": {}, "memory": {}}
    for stem in HELD_OUT:
        cases = [c for c in load_cases(HERE / f"{stem}.yaml") if str(c.get("id")) not in fitted]
        results = run_cases(cases)
        if progress:
            progress(stem, len(results))
        for r in results:
            if r.error_pct is None or not r.profile:
                continue
            if r.metric in SPEED_METRICS:
                kind, e = "speed", speed_error_pct(r.metric, r.published, r.predicted)
            elif r.metric in MEMORY_METRICS:
                kind, e = "memory", r.error_pct
            else:
                continue
            arch = f"{r.profile} on {r.architecture}"
            for key in (r.profile, arch, f"{arch} at {scale_of(r.gpus)}"):
                errors[kind].setdefault(key, []).append((e, stem))
    return {
        kind: {
            key: summary([e for e, _ in rows], Counter(stem for _, stem in rows))
            for key, rows in sorted(groups.items())
        }
        for kind, groups in errors.items()
    }


def write(path: Path = ACCURACY_FILE, progress=None) -> dict:
    import yaml

    data = measure(progress)
    header = (
        "# How far the simulation has been from measured runs it was never fitted on, by framework profile, GPU\n"
        "# generation and job size (speed: positive = simulated faster than measured; memory: positive = simulated\n"
        "# larger). Written by `python -m simulator.validation.accuracy` (simulator/validation/accuracy.py); do not\n"
        "# edit by hand. Every `clustersim run` states its own line (simulator/metrics/error_bar.py).\n"
    )
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=120))
    stored.cache_clear()
    return data


if __name__ == "__main__":
    written = write(progress=lambda stem, n: print(f"{stem}: {n} held-out runs simulated", flush=True))
    for kind, groups in written.items():
        for key, g in groups.items():
            print(
                f"{kind:6} {key:34} n={g['n']:4}  median {g['median_abs_pct']:5.1f}%  p90 {g['p90_abs_pct']:5.1f}%  "
                f"signed {g['mean_signed_pct']:+5.1f}%"
            )
