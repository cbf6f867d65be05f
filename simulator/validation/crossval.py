"""Out-of-sample error: every source predicted by profiles that never saw it (leave one source out).

A framework profile's fitted factors (``fit_params``, fitted on ``fit_cases`` of published.yaml; per-GPU factors
likewise) are refitted for each source in turn without that source's cases, and the source's cases are predicted
with the refitted profile. Where a profile was fitted on that source alone, it is refitted on the other sources'
cases that run the same profile on the GPU architecture and precision it was fitted on (Megatron-LM 2021's MEG20
runs for NAR21; Megatron-Core's H100 BF16 MoE runs of moe.yaml, which ``pool`` brings in, for the MCORE runs); where there are none, its fitted factors fall back to the reference (1.0: the kernel tables and the GPU's roofline as they stand), which is what the
simulator predicts for a stack it has no measurement of. Sources whose profiles were never fitted on them are
out of sample already: both errors are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simulator.frameworks import Framework, get_framework
from simulator.scenario.loader import load_scenario
from simulator.validation.calibrate import fit
from simulator.validation.runner import CaseResult, case_scenario, run_case, source_group


@dataclass
class CrossResult:
    case: CaseResult  # in sample: the shipped profile
    out_of_sample: CaseResult  # the profile refitted without the case's source
    how: str  # unchanged | refitted on N cases | reference


def profile_of(case: dict) -> str:
    """The framework profile a case runs (``auto`` resolved as its scenario resolves it)."""
    return load_scenario(case_scenario(case)).framework


def regime_of(case: dict) -> tuple[str, str]:
    """(GPU architecture, precision) of a case: what a profile's fitted factors (times the GPU's kernel tables and
    the training precision's GEMMs) were measured in."""
    from simulator.hardware.gpus import get_gpu
    from simulator.hardware.topology import cluster_spec

    s = load_scenario(case_scenario(case))
    return get_gpu(cluster_spec(s).node.gpu).architecture, s.training.precision


def reference(framework: Framework) -> Framework:
    """The profile with every fitted factor back at the reference (1.0) and its fitted per-GPU factors removed."""
    update = dict.fromkeys(framework.fit_params, 1.0)
    gpus = {g: f for g, f in framework.gpus.items() if not f.fit_cases}
    return framework.model_copy(update={**update, "gpus": gpus, "fit_cases": (), "fit_params": ()})


def without(framework: Framework, left_out: set[str], cases: list[dict], profile: str, progress=None):
    """The profile refitted without the ``left_out`` case ids (``cases``: every case it may be refitted on), and
    how."""
    if not framework.fitted_on & left_out:
        return framework, "unchanged"
    by_id = {str(c["id"]): c for c in cases}
    keep = [by_id[i] for i in framework.fit_cases if i not in left_out and i in by_id]
    if not keep:  # fitted on this source alone: the other sources that run this profile in the regime it was
        # fitted in (the same GPU architecture and precision: a Hopper bf16 fit is not refitted on Blackwell FP8
        # runs), else the reference
        regimes = {regime_of(by_id[i]) for i in framework.fit_cases if i in by_id}
        keep = [
            c
            for c in cases
            if str(c["id"]) not in left_out and profile_of(c) == profile and regime_of(c) in regimes
        ]
    start = reference(framework)
    if not keep or not framework.fit_params:
        return start, "reference"
    refit = fit(keep, start, list(framework.fit_params), progress=progress)
    return refit, f"refitted on {len(keep)} other cases"


def cross_validate(
    cases: list[dict], progress: Callable[[str], None] | None = None, pool: list[dict] | None = None
) -> list[CrossResult]:
    """In-sample and leave-one-source-out predictions of every case; ``pool``: more cases (of other sources) a
    profile may be refitted on, not themselves predicted."""
    profiles = {str(c["id"]): profile_of(c) for c in cases}
    refit_on = [*cases, *(pool or [])]
    sources: dict[str, list[dict]] = {}
    for c in cases:
        sources.setdefault(source_group(c), []).append(c)
    out = []
    for source, members in sources.items():
        left_out = {str(c["id"]) for c in members}
        refits: dict[str, tuple[Framework, str]] = {}
        for c in members:
            name = profiles[str(c["id"])]
            if name not in refits:
                refits[name] = without(get_framework(name), left_out, refit_on, name)
            framework, how = refits[name]
            inside = run_case(c)
            outside = inside if how == "unchanged" else run_case(c, framework)
            out.append(CrossResult(inside, outside, how))
            if progress:
                progress(f"{source}: {c['id']}")
    return out
