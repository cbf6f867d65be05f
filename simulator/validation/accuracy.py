"""The error bar of a simulated run, measured: how far the simulation is from measured runs it has not seen, by
framework profile, GPU generation and job size (simulator/metrics/error_bar.py looks a run's up).

A bar must be the error a user of an unseen stack, GPU or scale would get, not the error on the files the code was
tuned against. So each case of the shipped validation files (``HELD_OUT``) counts with the error it had:

- **left out**: predicted by today's code with profiles refitted without its source (crossval.py; a profile fitted
  on that source alone falls back to its reference factors);
- **at first contact** (first_contact.py: its prediction before any change it prompted), where it has one;

and counts with the larger of the two in magnitude. No case counts in sample.

``accuracy.yaml`` holds the figures of every (profile, GPU generation, job size) cell, and of the wider cells the
bar falls back to (error_bar.py), each beside today's in-sample figure; per file, the three side by side; and
(``one_run``) the one-run workflow's errors by distance from the fitted run (one_run.py), the bar of a profile
calibrated on one measured step; and (``families``) the figures of each model family (MoE, MLA, hybrid Mamba-2,
...), which widen the bar of a run of that family, or flag it as unseen where it holds too few. Rewrite it after
any change that moves a prediction, as the snapshot is rewritten:

    python -m simulator.validation.accuracy        # rewrites simulator/validation/accuracy.yaml (about 5 min)

The published runs' leave-one-source-out refits take most of that; the file keeps their errors
(``leave_one_source_out``) so that tests/test_accuracy.py checks the rest against the simulator as it stands in
seconds, and its slow test the refits.

Speed errors are signed so that positive means the simulation is faster than measured (optimistic), whatever the
metric: an iteration time compares as measured / simulated, a throughput as simulated / measured. Memory errors
are simulated / measured, less 1: positive means the simulation needs more memory than measured.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from simulator.metrics.error_bar import ACCURACY_FILE, ANY_PROFILE, FAMILIES, RELATIONS, scale_of, stored
from simulator.validation.first_contact import signed_error
from simulator.validation.first_contact import stored as first_contact
from simulator.validation.one_run import OneRun, one_run
from simulator.validation.runner import load_cases
from simulator.validation.signs import kind_and_error, speed_error_pct

HERE = Path(__file__).resolve().parent
# The validation files, by stem (simulator/validation/<stem>.yaml): docs/validation.md describes each.
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
    "mlperf",
)
# Files whose runs come from a source a profile is fitted on in published.yaml: left out together with it.
# MosaicML's llm-foundry throughput tables are the source of the MPT rows llm-foundry-2023 is fitted on.
SAME_SOURCE = {"llm-foundry": "MPT"}


@dataclass
class CaseError:
    stem: str
    id: str
    kind: str  # speed | memory
    profile: str
    architecture: str
    gpus: int
    families: tuple[str, ...]  # the model's (metrics/error_bar.py FAMILIES)
    today: float  # the shipped profiles as they stand (in sample where a profile was fitted on the case)
    left_out: float  # profiles refitted without the case's source
    first: float | None  # at first contact, where the case has one

    @property
    def bar(self) -> float:
        """The larger (in magnitude) of its two unseen errors: first contact (the code before the case arrived) and
        left out (the code now, fitted without its source). Either alone can flatter: the code has been tuned with
        the case in view since first contact, and may have grown worse on it as well (Blackwell's FP8 runs)."""
        return self.left_out if self.first is None else max(self.first, self.left_out, key=abs)


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


def brief(errors: list[float]) -> dict:
    """n, median |error| and mean signed error (%)."""
    return {
        "n": len(errors),
        "median_abs_pct": round(statistics.median(abs(e) for e in errors), 2),
        "mean_signed_pct": round(statistics.fmean(errors), 2),
    }


def fitted_case_ids() -> set[str]:
    """Every case id a shipped profile's factors were fitted on."""
    from simulator.frameworks import PROFILE_DIR, get_framework

    return set().union(*(get_framework(path.stem).fitted_on for path in PROFILE_DIR.glob("*.yaml")))


def published_left_out(progress: Callable[[str], None] | None = None) -> dict[str, dict]:
    """The published runs predicted with profiles refitted without their source (the slow part: the refits)."""
    from simulator.validation.crossval import cross_validate
    from simulator.validation.runner import load_cases

    cases = load_cases(HERE / "published.yaml")
    pool = load_cases(
        HERE / "moe.yaml"
    )  # the Megatron-Core runs megatron-core-2024 is refitted on without MCORE
    out = {}
    for r in cross_validate(cases, progress, pool):
        o = r.out_of_sample
        if o.error_pct is None:
            continue
        kind, e = kind_and_error(o.metric, o.published, o.predicted)
        out[o.id] = {"kind": kind, "error_pct": round(e, 3), "how": r.how}
    return out


def _same_source_profiles(stem: str, cases: list[dict]) -> dict:
    """For a file of a source some profile was fitted on (``SAME_SOURCE``): those profiles refitted without it."""
    from simulator.frameworks import PROFILE_DIR, get_framework
    from simulator.validation.crossval import profile_of, without
    from simulator.validation.runner import load_cases, source_group

    published = load_cases(HERE / "published.yaml")
    left = {str(c["id"]) for c in published if source_group(c) == SAME_SOURCE[stem]}
    left |= {str(c["id"]) for c in cases}
    names = {profile_of(c) for c in cases}
    out = {}
    for path in PROFILE_DIR.glob("*.yaml"):
        if path.stem in names:
            out[path.stem] = without(get_framework(path.stem), left, [*published, *cases], path.stem)[0]
    return out


def case_errors(
    left_out_published: dict[str, dict] | None = None, progress: Callable[[str, int], None] | None = None
) -> list[CaseError]:
    """Every case of every ``HELD_OUT`` file with its errors today, left out and at first contact
    (``left_out_published``: the published runs' left-out errors, as ``published_left_out`` gives them)."""
    from simulator.validation.runner import load_cases, run_case, run_cases

    left_out_published = left_out_published if left_out_published is not None else published_left_out()
    first = first_contact()
    out = []
    for stem in HELD_OUT:
        cases = load_cases(HERE / f"{stem}.yaml")
        results = run_cases(cases)
        refits = _same_source_profiles(stem, cases) if stem in SAME_SOURCE else {}
        for case, r in zip(cases, results, strict=True):
            if r.error_pct is None or not r.profile:
                continue
            got = kind_and_error(r.metric, r.published, r.predicted)
            if got is None:
                continue
            kind, today = got
            if stem == "published":
                left = left_out_published[r.id]["error_pct"] if r.id in left_out_published else today
            elif r.profile in refits:
                o = run_case(case, refits[r.profile])
                left = kind_and_error(o.metric, o.published, o.predicted)[1] if o.predicted else today
            else:  # no profile was fitted on this file's source
                left = today
            fc = signed_error(first.get(stem, {}).get(r.id, {}))
            out.append(
                CaseError(
                    stem, r.id, kind, r.profile, r.architecture, r.gpus, r.families, today, left, fc and fc[1]
                )
            )
        if progress:
            progress(stem, len(results))
    return out


def cells_of(e: CaseError) -> tuple[str, ...]:
    """The cells a case counts in: its profile, on its GPU generation, at its job size; and any profile's."""
    arch, scale = f"on {e.architecture}", f"at {scale_of(e.gpus)}"
    return (
        e.profile,
        f"{e.profile} {arch}",
        f"{e.profile} {arch} {scale}",
        f"{ANY_PROFILE} {arch}",
        f"{ANY_PROFILE} {arch} {scale}",
        ANY_PROFILE,
    )


def measure(
    left_out_published: dict[str, dict] | None = None, progress: Callable[[str, int], None] | None = None
) -> dict:
    """The figures accuracy.yaml holds (see the module's docstring)."""
    left_out_published = left_out_published if left_out_published is not None else published_left_out()
    errors = case_errors(left_out_published, progress)
    cells: dict[str, dict[str, list[CaseError]]] = {"speed": {}, "memory": {}}
    for e in errors:
        for key in cells_of(e):
            cells[e.kind].setdefault(key, []).append(e)
    out: dict = {}
    for kind, groups in cells.items():
        out[kind] = {}
        for key, rows in sorted(groups.items()):
            g = summary([e.bar for e in rows], Counter(e.stem for e in rows))
            g["first_contact"] = sum(e.first is not None for e in rows)
            g["today"] = brief([e.today for e in rows])
            out[kind][key] = g
    out["families"] = {
        kind: {
            family: summary([e.bar for e in rows], Counter(e.stem for e in rows))
            for family in FAMILIES
            if (rows := [e for e in errors if e.kind == kind and family in e.families])
        }
        for kind in ("speed", "memory")
    }
    out["files"] = {}
    for stem in HELD_OUT:
        for kind in ("speed", "memory"):
            rows = [e for e in errors if e.stem == stem and e.kind == kind]
            if not rows:
                continue
            firsts = [e.first for e in rows if e.first is not None]
            out["files"][f"{stem} {kind}"] = {
                "today": brief([e.today for e in rows]),
                "left_out": brief([e.left_out for e in rows]),
                "first_contact": brief(firsts) if firsts else {"n": 0},
                "bar": brief([e.bar for e in rows]),
            }
    out["leave_one_source_out"] = dict(sorted(left_out_published.items()))
    out["one_run"] = one_run_rows(one_run(shipped_cases()))
    return out


def shipped_cases() -> list[dict]:
    """Every shipped validation file's runs (``HELD_OUT``)."""
    return [c for stem in HELD_OUT for c in load_cases(HERE / f"{stem}.yaml")]


def one_run_rows(results: list[OneRun]) -> dict[str, dict]:
    """The error bar of a calibrated profile's runs by how far they are from the fitted one (``one_run``): per
    relation (error_bar.RELATIONS), ``summary`` of the signed speed errors, with the sources they come from."""
    out = {}
    for rel in RELATIONS:
        chosen = [r for r in results if r.relation == rel and r.case.error_pct is not None]
        if chosen:
            signed = [speed_error_pct(r.case.metric, r.case.published, r.case.predicted) for r in chosen]
            out[rel] = summary(signed, Counter(r.source for r in chosen))
    return out


def write(path: Path = ACCURACY_FILE, progress=None) -> dict:
    import yaml

    data = measure(progress=progress)
    header = (
        "# How far the simulation is from measured runs it has not seen, by framework profile, GPU generation and\n"
        "# job size: each run with the larger of its errors left out (its source out of every fit) and at first\n"
        "# contact (before any change it prompted; first_contact.yaml).\n"
        "# speed: + = simulated faster than measured; memory: + = simulated larger. today: the same runs as the\n"
        "# shipped profiles predict them now. Written by `python -m simulator.validation.accuracy`\n"
        "# (simulator/validation/accuracy.py); do not edit by hand. Every `clustersim run` states its own line.\n"
    )
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=120))
    stored.cache_clear()
    return data


if __name__ == "__main__":

    def _say(stem: str, n: int) -> None:
        print(f"{stem}: {n} runs simulated", flush=True)

    written = write(progress=_say)
    for stem, f in written["files"].items():
        fc = f["first_contact"]
        print(
            f"{stem:22} today {f['today']['median_abs_pct']:5.1f}% ({f['today']['mean_signed_pct']:+5.1f}%)  "
            f"left out {f['left_out']['median_abs_pct']:5.1f}% ({f['left_out']['mean_signed_pct']:+5.1f}%)  "
            + (
                f"first contact {fc['median_abs_pct']:5.1f}% ({fc['mean_signed_pct']:+5.1f}%), {fc['n']} runs"
                if fc["n"]
                else "no first contact"
            )
        )
