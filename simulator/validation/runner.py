"""Predict published measured runs and report the error honestly.

A cases file holds ``cases:``, each a scenario (model / cluster / training / parallelism) plus ``published``:
the measured ``metric`` and ``value``, its ``source``, ``level`` and, for TFLOP/s, the ``flop_convention``.
TFLOP/s are compared in the source's own convention; iteration times and tokens/s directly.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from simulator.api import simulate
from simulator.errors import ScenarioError
from simulator.frameworks import Framework
from simulator.metrics.error_bar import families
from simulator.metrics.flops import megatron_flops
from simulator.metrics.metrics import Metrics
from simulator.scenario.files import read_yaml
from simulator.scenario.loader import load_scenario
from simulator.validation.signs import SPEED_METRICS, speed_error_pct

DEFAULT_CASES = Path(__file__).parent / "published.yaml"

# CI gate (the validation issue's targets): one place, to be tightened as the model improves.
GATE_MEDIAN_ABS_ERROR_PCT = 10.0
GATE_MAX_ABS_ERROR_PCT = 25.0

# peak_memory_gib: the peak allocation (torch.cuda.max_memory_allocated, what DeepSpeed's and Megatron's memory
# reports give); reserved_memory_gib: what the caching allocator holds at it (torch.cuda.max_memory_reserved,
# torchtitan's memory line): that and the holes it cannot reuse. Neither counts the CUDA context or NCCL's own
# buffers, which nvidia-smi adds.
METRICS = (
    "iteration_time_s",
    "tokens_per_s_per_gpu",
    "model_tflops_per_gpu",
    "peak_memory_gib",
    "reserved_memory_gib",
)


@dataclass
class CaseResult:
    id: str
    source: str
    metric: str
    published: float
    predicted: float | None
    error_pct: float | None
    # ok | off (simulated, |error| over the per-case gate) | oom (simulated out of memory where the source ran) |
    # failed (invalid or crashed config)
    status: str
    message: str = ""
    profile: str = ""  # the framework profile it ran
    architecture: str = ""  # its GPU's generation (ampere, hopper, ...)
    gpus: int = 0  # the job's GPUs
    families: tuple[str, ...] = ()  # the model's families (metrics/error_bar.py FAMILIES)

    def to_dict(self) -> dict:
        return asdict(self)


FLOP_CONVENTIONS = ("megatron-model", "narayanan-eq3-96", "mosaic-model", "megatron-causal")


def load_cases(path: str | Path | None = None) -> list[dict]:
    """The cases of a cases file, each checked: a published metric this runner knows, a finite positive
    value, a known FLOP convention."""
    path = Path(path) if path else DEFAULT_CASES
    data = read_yaml(path, "--cases")
    cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(cases, list) or not cases:
        raise ScenarioError(f"--cases: {path}: expected a list under 'cases:'")
    seen: dict[str, int] = {}
    for i, c in enumerate(cases):
        where = f"--cases: {path}: cases[{i}]"
        case_id = c.get("id") if isinstance(c, dict) else None
        if case_id is not None:
            if isinstance(case_id, bool) or not isinstance(case_id, str | int):
                raise ScenarioError(
                    f"{where}.id must be a name (text or a number), got {type(case_id).__name__}"
                )
            if str(case_id) in seen:
                raise ScenarioError(
                    f"{where}.id {str(case_id)[:80]!r} is also cases[{seen[str(case_id)]}]'s: ids name one case each "
                    "(errors and first-contact records are kept by id)"
                )
            seen[str(case_id)] = i
        pub = c.get("published") if isinstance(c, dict) else None
        if not isinstance(pub, dict) or "metric" not in pub or "value" not in pub:
            raise ScenarioError(f"{where} needs published.metric and published.value")
        if pub["metric"] not in METRICS:
            raise ScenarioError(
                f"{where}.published.metric {pub['metric']!r} is not one of {', '.join(METRICS)}"
            )
        value = pub["value"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise ScenarioError(
                f"{where}.published.value must be a finite number above 0 (an error is relative to it), "
                f"got {value!r}"
            )
        convention = pub.get("flop_convention", FLOP_CONVENTIONS[0])
        if convention not in FLOP_CONVENTIONS:
            raise ScenarioError(
                f"{where}.published.flop_convention {convention!r} is not one of {', '.join(FLOP_CONVENTIONS)}"
            )
    return cases


def source_group(case: dict) -> str:
    """Cases are summarised per source: the ``group`` key, else the id's prefix (NAR21-T1-1T -> NAR21)."""
    return case.get("group") or str(case.get("id", "case")).split("-")[0]


def predicted_value(m: Metrics, published: dict, params: float, s=None) -> float:
    metric = published["metric"]
    if metric == "peak_memory_gib":
        return m.memory_gib["peak"]
    if metric == "reserved_memory_gib":
        return m.memory_gib["reserved"]
    if metric != "model_tflops_per_gpu":
        return getattr(m, metric)
    convention = published.get("flop_convention", "megatron-model")
    if convention == "megatron-causal":  # Megatron-LM's own count since 2025-03 (metrics/flops.py)
        return megatron_flops(s) / m.iteration_time_s / m.gpus / 1e12
    if convention == "narayanan-eq3-96":
        return m.tflops_per_gpu_narayanan_eq3
    if convention == "mosaic-model":  # (6 N + 12 l h s) FLOPs per token
        return m.tokens_per_s_per_gpu * params / 1e12
    return m.model_tflops_per_gpu


def case_scenario(case: dict) -> dict:
    """The scenario a case describes (its scenario sections, named by its id), for ``load_scenario``."""
    keys = ("model", "cluster", "training", "parallelism", "framework", "kernels")
    return {"name": str(case.get("id", "case")), **{k: case[k] for k in keys if k in case}}


def run_case(case: dict, framework: Framework | None = None, kernels: str | None = None) -> CaseResult:
    """Simulate one case (with ``framework`` replacing the case's own profile, for calibration, and
    ``kernels`` its cost tables)."""
    pub = case["published"]
    base = dict(
        id=str(case.get("id", "case")),
        source=source_group(case),
        metric=pub["metric"],
        published=float(pub["value"]),
    )
    scenario = case_scenario(case)
    if kernels is not None:
        scenario["kernels"] = kernels
    try:
        s = load_scenario(scenario)
        r = simulate(s, framework=framework)
    except ScenarioError as e:
        return CaseResult(**base, predicted=None, error_pct=None, status="failed", message=str(e))
    except Exception as e:  # a bug hit by one case must not hide the others: report it in the table
        return CaseResult(
            **base,
            predicted=None,
            error_pct=None,
            status="failed",
            message=f"internal error: {type(e).__name__}: {e}",
        )
    m = r.metrics
    base.update(
        profile=m.framework, architecture=r.cluster.gpu.architecture, gpus=m.gpus, families=families(s.model)
    )
    model = s.model
    mosaic_params = 6 * r.workload.total_params + 12 * model.num_layers * model.hidden_size * model.seq_length
    predicted = predicted_value(m, pub, mosaic_params, s)
    error = 100.0 * (predicted / base["published"] - 1.0)
    if m.oom:
        status, message = (
            "oom",
            f"simulated {m.memory_gib['device']:.1f} GiB on the GPU > {m.memory_gib['capacity']:.0f}",
        )
    elif abs(error) > GATE_MAX_ABS_ERROR_PCT:  # simulated, but further off than any case may be
        status, message = "off", f"over {GATE_MAX_ABS_ERROR_PCT:g}%"
    else:
        status, message = "ok", ""
    return CaseResult(**base, predicted=predicted, error_pct=error, status=status, message=message)


def run_cases(
    cases: Iterable[dict],
    progress: Callable[[str], None] | None = None,
    framework: Framework | None = None,
    kernels: str | None = None,
) -> list[CaseResult]:
    out = []
    for case in cases:
        out.append(run_case(case, framework, kernels))
        if progress:
            progress(out[-1].id)
    return out


def summarize(results: list[CaseResult]) -> dict:
    """n, median / mean / max absolute error (%) of the cases with a prediction; failed cases counted apart."""
    errors = [abs(r.error_pct) for r in results if r.error_pct is not None]
    # which way it leans: speed errors signed + where the simulation is faster than measured, whatever the metric
    # (an iteration time as measured / simulated), memory errors + where it needs more (accuracy.py's signs)
    speed = [
        speed_error_pct(r.metric, r.published, r.predicted)
        for r in results
        if r.predicted is not None and r.metric in SPEED_METRICS
    ]
    memory = [r.error_pct for r in results if r.error_pct is not None and r.metric not in SPEED_METRICS]
    return {
        "mean_signed_speed_pct": statistics.fmean(speed) if speed else None,
        "mean_signed_memory_pct": statistics.fmean(memory) if memory else None,
        "n": len(errors),
        "failed": sum(r.status == "failed" for r in results),
        "oom": sum(r.status == "oom" for r in results),
        "median_abs_error_pct": statistics.median(errors) if errors else None,
        "mean_abs_error_pct": statistics.fmean(errors) if errors else None,
        "max_abs_error_pct": max(errors) if errors else None,
    }


def summarize_by_source(results: list[CaseResult]) -> dict[str, dict]:
    sources = sorted({r.source for r in results})
    return {src: summarize([r for r in results if r.source == src]) for src in sources}


def gate_failures(summary: dict) -> list[str]:
    """Why the suite misses the CI gate (empty when it meets it)."""
    out = []
    if summary["failed"]:
        out.append(f"{summary['failed']} case(s) failed to simulate")
    if (
        summary["median_abs_error_pct"] is not None
        and summary["median_abs_error_pct"] > GATE_MEDIAN_ABS_ERROR_PCT
    ):
        out.append(f"median |error| {summary['median_abs_error_pct']:.1f}% > {GATE_MEDIAN_ABS_ERROR_PCT:g}%")
    if summary["max_abs_error_pct"] is not None and summary["max_abs_error_pct"] > GATE_MAX_ABS_ERROR_PCT:
        out.append(f"max |error| {summary['max_abs_error_pct']:.1f}% > {GATE_MAX_ABS_ERROR_PCT:g}%")
    return out


def lean(summary: dict) -> str:
    """', signed speed +8.2% (+: simulated faster)' and likewise for memory: the mean signed errors that are there."""
    out = ""
    if summary.get("mean_signed_speed_pct") is not None:
        out += f", signed speed {summary['mean_signed_speed_pct']:+.1f}% (+: simulated faster)"
    if summary.get("mean_signed_memory_pct") is not None:
        out += f", signed memory {summary['mean_signed_memory_pct']:+.1f}% (+: simulated larger)"
    return out


def summary_line(summary: dict) -> str:
    if not summary["n"]:
        return "validation: no case could be simulated"
    return (
        f"validation: {summary['n']} cases, median |error| {summary['median_abs_error_pct']:.1f}%, "
        f"mean {summary['mean_abs_error_pct']:.1f}%, max {summary['max_abs_error_pct']:.1f}%"
        + lean(summary)
        + (f", {summary['failed']} failed" if summary["failed"] else "")
        + (f", {summary['oom']} out of memory" if summary["oom"] else "")
    )
