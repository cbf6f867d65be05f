"""A run's error bar: how far the simulation has been from measured runs it had not seen, for the run's framework
profile on its GPU generation at its job size, as ``simulator/validation/accuracy.yaml`` holds them (each run with
the larger of its error with its source left out of every fit and its error at first contact; written by
``python -m simulator.validation.accuracy``, which says how they are measured and signed).

Where the run's own cell holds fewer than ``MIN_RUNS`` runs, the bar says so and shows the widest of its
neighbouring cells (the same profile and GPU generation at another job size, the same profile on another
generation, another profile on the same generation and job size), never a narrow one: a run the record does not
cover is a run off the measured path, and the bar must not be tighter than the record next to it. A profile of
one's own (a file, or one refitted) is an unseen stack: its bar is the widest shipped profile's on its generation.

A model of a family the record holds fewer than ``MIN_RUNS`` runs of (``families``: hybrid Mamba-2 stacks, sliding
windows, ...) is an unseen workload, and gets the same: the widest neighbouring cell, with a note naming the
family; where the family holds enough runs, the bar is the wider of the run's cell and the family's own record.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

ACCURACY_FILE = Path(__file__).resolve().parents[1] / "validation" / "accuracy.yaml"
# a cell's figures are shown from this many runs; below it, the widest neighbouring cell's
MIN_RUNS = 5
# job sizes the figures are also kept for: a simulation's error grows with what scale adds (docs/validation.md)
SCALES = ((8, "up to 8 GPUs"), (512, "9-512 GPUs"), (None, "over 512 GPUs"))
# the cells that pool every profile's runs (an unseen stack's bar)
ANY_PROFILE = "any profile"
# the hardware's upper bound (frameworks/ideal.yaml): no error bar
BOUND = "ideal"
# model families whose runs the record keeps apart (``families``): what each adds to the simulated program
FAMILIES = (
    "mixture of experts",
    "multi-latent attention",
    "hybrid Mamba-2 layers",
    "sliding-window attention",
    "chunked local attention",
    "multi-token prediction",
)


def families(model) -> tuple[str, ...]:
    """The FAMILIES a scenario's ``model`` belongs to (none: a dense transformer of full attention)."""
    have = (
        model.moe is not None,
        model.mla is not None,
        "M" in (model.hybrid_pattern or ""),
        model.sliding_window is not None,
        model.attention_chunk_size is not None,
        model.mtp_layers > 0,
    )
    return tuple(name for name, yes in zip(FAMILIES, have, strict=True) if yes)


@cache
def stored() -> dict:
    from simulator.scenario.files import read_yaml

    return read_yaml(ACCURACY_FILE, "accuracy file", shipped=True) if ACCURACY_FILE.is_file() else {}


def scale_of(gpus: int) -> str:
    return next(label for most, label in SCALES if most is None or gpus <= most)


def _cell(profile: str, architecture: str | None = None, scale: str | None = None) -> str:
    return " ".join(
        [profile, *([f"on {architecture}"] if architecture else []), *([f"at {scale}"] if scale else [])]
    )


def _profiles_and_architectures(groups: dict) -> tuple[set[str], set[str]]:
    profiles, archs = set(), set()
    for key in groups:
        name, _, rest = key.partition(" on ")
        if name != ANY_PROFILE:
            profiles.add(name)
        if rest:
            archs.add(rest.split(" at ")[0])
    return profiles, archs


def neighbours(profile: str, architecture: str, scale: str, groups: dict, own: bool) -> list[list[str]]:
    """The cells a run falls back to, ring by ring: first those that differ from its own in one coordinate, then
    pooled ones. ``own``: a profile of one's own, which no cell holds: every shipped profile's cells, the one it
    may be a copy of included."""
    profiles, archs = _profiles_and_architectures(groups)
    others = sorted(profiles - {profile})
    if own:
        return [
            [_cell(p, architecture, scale) for p in sorted(profiles)],
            [_cell(p, architecture) for p in sorted(profiles)] + [_cell(ANY_PROFILE, architecture, scale)],
            [_cell(ANY_PROFILE, architecture), ANY_PROFILE],
        ]
    scales = [label for _, label in SCALES if label != scale]
    return [
        [_cell(profile, architecture, s) for s in scales]
        + [_cell(profile, a, scale) for a in sorted(archs - {architecture})]
        + [_cell(p, architecture, scale) for p in others],
        [_cell(profile, architecture), profile, _cell(ANY_PROFILE, architecture, scale)],
        [_cell(ANY_PROFILE, architecture), ANY_PROFILE],
    ]


def held_out(
    profile: str, architecture: str, gpus: int, own: bool = False, kinds: tuple[str, ...] = ()
) -> dict | None:
    """The error bar for a run of ``profile`` on ``architecture`` with ``gpus`` GPUs: for each kind (speed, memory)
    the figures of its cell when it holds ``MIN_RUNS`` runs, else those of the widest neighbouring cell (by p90
    |error|) that does, with a ``note`` that says so; ``scope`` names the cell shown. ``own``: a profile of one's
    own. ``kinds``: the model's ``families`` (``widen``). None for the ideal bound, which predicts no measured run,
    and where no cell applies."""
    if profile == BOUND:
        return None
    data = stored()
    out: dict = {}
    scale = scale_of(gpus)
    mine = _cell(profile, architecture, scale)
    for kind in ("speed", "memory"):
        groups = data.get(kind, {})
        if not own and groups.get(mine, {}).get("n", 0) >= MIN_RUNS:
            out[kind] = {"scope": mine, **groups[mine]}
            continue
        for ring in neighbours(profile, architecture, scale, groups, own):
            filled = [c for c in ring if groups.get(c, {}).get("n", 0) >= MIN_RUNS]
            if filled:
                widest = max(filled, key=lambda c: (groups[c]["p90_abs_pct"], groups[c]["n"]))
                have = 0 if own else groups.get(mine, {}).get("n", 0)
                why = (
                    f"a profile of your own is an unseen stack ({profile} on {architecture} at {scale})"
                    if own
                    else f"only {have} measured run{'s' if have != 1 else ''} for {mine}"
                )
                out[kind] = {
                    "scope": widest,
                    "note": f"{why}: the widest neighbouring cell",
                    **groups[widest],
                }
                break
    if kinds:  # a model of one or more families: their records too
        for kind, bar in out.items():
            out[kind] = widen(
                bar, kind, kinds, neighbours(profile, architecture, scale, data.get(kind, {}), True)
            )
    return out or None


def widen(bar: dict, kind: str, kinds: tuple[str, ...], rings: list[list[str]]) -> dict:
    """``bar`` for a model of the families ``kinds``: a family with ``MIN_RUNS`` runs in the record widens it to its
    own record where that is wider (by p90); one with fewer makes the run an unseen workload, whose bar is the widest
    of ``rings``' first two (an unseen stack's neighbours) and the few runs the family has, never narrower than
    ``bar``; each says so."""
    record = stored().get("families", {}).get(kind, {})
    groups = stored().get(kind, {})
    notes = [bar["note"]] if bar.get("note") else []
    for family in kinds:
        row = record.get(family, {"n": 0})
        if row["n"] >= MIN_RUNS:
            if row["p90_abs_pct"] > bar["p90_abs_pct"]:
                bar = {**row, "scope": f"models with {family}"}
                notes.append(f"{family}: that family's record is wider")
            continue
        rows = {c: groups[c] for ring in rings[:2] for c in ring if groups.get(c, {}).get("n", 0) >= MIN_RUNS}
        if row["n"]:  # the few runs it has, where they are further off than any neighbour
            rows[f"models with {family}"] = row
        widest = max(rows, key=lambda c: (rows[c]["p90_abs_pct"], rows[c]["n"]), default=None)
        if widest is not None and rows[widest]["p90_abs_pct"] > bar["p90_abs_pct"]:
            bar = {**rows[widest], "scope": widest}
        runs = f"{row['n']} measured run{'s' if row['n'] != 1 else ''}"
        notes.append(f"only {runs} of models with {family}: an unseen workload, the widest neighbouring cell")
    bar = {k: v for k, v in bar.items() if k != "note"}
    return {**bar, "note": "; ".join(notes)} if notes else bar


# a run's distance from the measured step a profile was calibrated on (validation/one_run.py files its errors so)
SAME = "same GPU and precision"
RELATIONS = (SAME, "other precision", "other GPU")


def relation(gpu: str, precision: str, fitted_gpu: str, fitted_precision: str) -> str:
    """How far a run is from the run a profile was fitted to: SAME, "other precision" or "other GPU"."""
    return "other GPU" if gpu != fitted_gpu else SAME if precision == fitted_precision else "other precision"


def calibrated(framework, gpu: str, precision: str) -> dict | None:
    """The bar of a run with a profile calibrated on one measured step (``framework.calibrated_on``): the one-run
    workflow's measured error (validation/one_run.py, stored in accuracy.yaml) for runs as far from the fitted one
    as this: the same GPU and precision, another precision, or another GPU."""
    on = framework.calibrated_on
    rel = relation(gpu, precision, on.gpu, on.precision)
    row = stored().get("one_run", {}).get(rel)
    if not row or row.get("n", 0) < MIN_RUNS:
        return None
    scope = f"a profile calibrated on one measured step ({on.gpus:,} {on.gpu}, {on.precision}), runs of {rel}"
    return {"speed": {"scope": scope, **row}}


def for_run(
    framework, architecture: str, gpus: int, gpu: str = "", precision: str = "", kinds: tuple[str, ...] = ()
) -> dict | None:
    """``held_out`` for a run of ``framework`` (a Framework): the shipped profile's own cells when it is the
    shipped profile of its name; a profile calibrated on one measured step (``calibrate step``, given the run's
    ``gpu`` and ``precision``) carries the one-run workflow's measured error, another profile of one's own or one
    refitted (calibrate, cross-validation) is an unseen stack. The ideal bound has none."""
    from simulator.errors import ScenarioError
    from simulator.frameworks import get_framework

    if framework.name == BOUND:
        return None
    try:
        shipped = get_framework(framework.name)
    except ScenarioError:
        shipped = None
    bar = held_out(framework.name, architecture, gpus, own=shipped != framework, kinds=kinds)
    if framework.calibrated_on is not None and gpu:
        one = calibrated(framework, gpu, precision)
        if one:  # speed from the one-run workflow; memory stays the unseen stack's (the fit moves no memory)
            bar = {**(bar or {}), **one}
    return bar
