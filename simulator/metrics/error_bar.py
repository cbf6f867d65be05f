"""A run's error bar: how far the simulation has been from measured runs of the run's framework profile on its GPU
generation, at its job size, that nothing was fitted on, as ``simulator/validation/accuracy.yaml`` holds them (written by
``python -m simulator.validation.accuracy``, which says how they are measured and signed)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

ACCURACY_FILE = Path(__file__).resolve().parents[1] / "validation" / "accuracy.yaml"
# a group's figures are shown from this many runs; below it, the next wider group's
MIN_RUNS = 5
# job sizes the figures are also kept for: a simulation's error grows with what scale adds (docs/validation.md)
SCALES = ((8, "up to 8 GPUs"), (512, "9-512 GPUs"), (None, "over 512 GPUs"))


@cache
def stored() -> dict:
    from simulator.scenario.files import read_yaml

    return read_yaml(ACCURACY_FILE, "accuracy file", shipped=True) if ACCURACY_FILE.is_file() else {}


def scale_of(gpus: int) -> str:
    return next(label for most, label in SCALES if most is None or gpus <= most)


def held_out(profile: str, architecture: str, gpus: int) -> dict | None:
    """The error bar for a run of ``profile`` on ``architecture`` with ``gpus`` GPUs: for each kind (speed, memory)
    the figures of that profile on that GPU generation at that scale, else on that generation at any scale (each
    from ``MIN_RUNS`` runs), else of the profile on every GPU; ``scope`` says which. None where no held-out
    measured run ran the profile."""
    data = stored()
    out: dict = {}
    arch = f"{profile} on {architecture}"
    for kind in ("speed", "memory"):
        groups = data.get(kind, {})
        for scope in (f"{arch} at {scale_of(gpus)}", arch):
            if groups.get(scope, {}).get("n", 0) >= MIN_RUNS:
                out[kind] = {"scope": scope, **groups[scope]}
                break
        else:
            if profile in groups:  # every GPU's runs, saying which generations they ran on
                ran = sorted(
                    {k.split(" on ", 1)[1].split(" at ")[0] for k in groups if k.startswith(f"{profile} on ")}
                )
                where = (
                    f"on {', '.join(ran)}" if architecture not in ran else f"on every GPU ({', '.join(ran)})"
                )
                out[kind] = {"scope": f"{profile} {where}", **groups[profile]}
    return out or None


def for_run(framework, architecture: str, gpus: int) -> dict | None:
    """``held_out`` for a run of ``framework`` (a Framework), when it is the shipped profile of its name: a profile
    of one's own, or one refitted (calibrate, cross-validation), has no held-out record of its own."""
    from simulator.errors import ScenarioError
    from simulator.frameworks import get_framework

    try:
        shipped = get_framework(framework.name)
    except ScenarioError:
        return None
    return held_out(framework.name, architecture, gpus) if shipped == framework else None
