"""The one-run workflow measured on the shipped sources (``clustersim validate --one-run``).

A user of a stack no profile was fitted on measures one step and runs ``clustersim calibrate step``: the GEMM level
of the profile they start from is fitted to that step, and every other run is predicted with it. This measures
that workflow on every shipped source with 4 or more speed runs of one profile: the smallest run (fewest GPUs;
of those, the one whose step the GEMM level moves most, as ``calibrate step`` advises, or the next where the fit
stops at the level's bound, as its warning advises) is the measured step, ``gemm_efficiency`` is fitted to it
alone, the source's other runs are predicted with the fitted profile, and each error is filed by how far the run
is from the fitted one: the same GPU and precision, or another precision, or another GPU. That is the error a
calibrated profile's user should expect, beside the unseen-stack bar (docs/calibration.md).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from simulator.frameworks import get_framework
from simulator.hardware.gpus import get_gpu
from simulator.hardware.topology import cluster_spec
from simulator.metrics.error_bar import relation
from simulator.scenario.loader import load_scenario
from simulator.validation.calibrate import elasticity, fit_level, loss
from simulator.validation.runner import CaseResult, case_scenario, run_case, source_group
from simulator.validation.signs import SPEED_METRICS, speed_error_pct

MIN_RUNS = 4  # a source with fewer runs of one profile has too few left to predict
FALLBACKS = 3  # runs tried as the measured step, most sensitive first, before keeping the first


@dataclass
class OneRun:
    source: str
    profile: str
    fitted_on: str  # the case the GEMM level was fitted to
    gemm_efficiency: tuple[float, float]  # before, after
    case: CaseResult  # a predicted run, with the fitted profile
    relation: str  # SAME, "other precision" or "other GPU"


def _shape(case: dict) -> tuple[str, int, str, str]:
    """(profile, GPUs, GPU, precision) of a case."""
    s = load_scenario(case_scenario(case))
    p = s.parallelism
    gpus = p.tensor_parallel * p.pipeline_parallel * p.context_parallel * p.data_parallel
    return s.framework, gpus, cluster_spec(s).node.gpu, s.training.precision


def _loss(anchor: dict, f) -> float:
    return loss(f, [anchor])


def one_run(cases: list[dict], progress: Callable[[str], None] | None = None) -> list[OneRun]:
    groups: dict[tuple[str, str], list[tuple[dict, tuple]]] = defaultdict(list)
    for c in cases:
        if c["published"]["metric"] in SPEED_METRICS:
            shape = _shape(c)
            groups[source_group(c), shape[0]].append((c, shape[1:]))
    out = []
    for (source, profile), members in groups.items():
        if len(members) < MIN_RUNS:
            continue
        start = get_framework(profile)  # fitted as calibrate step fits it (calibrate.fit_step)
        fewest = min(m[1][0] for m in members)
        # of the runs on the fewest GPUs, the one whose step the GEMM level moves most (the first in the file on a
        # tie): a step mostly of small kernels and host waits identifies that level poorly (calibrate.elasticity)
        # and where its fit stops at the parameter's bound (calibrate step warns that the measurement lies beyond
        # what the level can explain), the next one, as a user following that warning would
        ranked = sorted(
            (m for m in members if m[1][0] == fewest),
            key=lambda m: -elasticity(m[0], start, "gemm_efficiency"),
        )
        fits = []  # (member, (profile, level before, after, at the bound)) per step tried
        for member in ranked[:FALLBACKS]:
            step = partial(_loss, member[0])
            fits.append((member, fit_level(start, "gemm_efficiency", get_gpu(member[1][1]), step)))
            if not fits[-1][1][3]:
                break
        kept = fits[-1] if not fits[-1][1][3] else fits[0]  # every one at the bound: the first
        (anchor, (_, gpu, precision)), (fitted, *levels, _) = kept
        for c, (_, g, prec) in members:
            if c is anchor:
                continue
            rel = relation(g, prec, gpu, precision)
            out.append(OneRun(source, profile, str(anchor["id"]), tuple(levels), run_case(c, fitted), rel))
            if progress:
                progress(str(c.get("id")))
    return out


def summary(results: list[OneRun], relation: str | None = None) -> dict:
    """n, median and max |error| (%) and the mean signed speed error of the runs of ``relation`` (all: None)."""
    chosen = [
        r for r in results if (relation is None or r.relation == relation) and r.case.error_pct is not None
    ]
    errors = [abs(r.case.error_pct) for r in chosen]
    signed = [speed_error_pct(r.case.metric, r.case.published, r.case.predicted) for r in chosen]
    return {
        "n": len(errors),
        "median_abs_error_pct": statistics.median(errors) if errors else None,
        "max_abs_error_pct": max(errors) if errors else None,
        "mean_signed_speed_pct": statistics.mean(signed) if signed else None,
    }
