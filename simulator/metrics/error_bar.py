"""A run's error bar: how far the simulation has been from measured runs of the run's framework profile on its GPU
generation that nothing was fitted on, as ``simulator/validation/accuracy.yaml`` holds them (written by
``python -m simulator.validation.accuracy``, which says how they are measured and signed)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

ACCURACY_FILE = Path(__file__).resolve().parents[1] / "validation" / "accuracy.yaml"
# a GPU generation's own figures are shown from this many runs; below it, the profile's on every GPU
MIN_RUNS = 5


@cache
def stored() -> dict:
    from simulator.scenario.files import read_yaml

    return read_yaml(ACCURACY_FILE, "accuracy file", shipped=True) if ACCURACY_FILE.is_file() else {}


def held_out(profile: str, architecture: str) -> dict | None:
    """The error bar for a run of ``profile`` on ``architecture``: for each kind (speed, memory) the figures of
    that profile on that GPU generation (from ``MIN_RUNS`` runs), else of the profile on any GPU, with ``scope``
    saying which; None where no held-out measured run ran the profile."""
    data = stored()
    out: dict = {}
    for kind in ("speed", "memory"):
        groups = data.get(kind, {})
        own = groups.get(f"{profile} on {architecture}")
        if own and own["n"] >= MIN_RUNS:
            out[kind] = {"scope": f"{profile} on {architecture}", **own}
        elif profile in groups:  # every GPU's runs, saying which generations they ran on
            ran = [k.split(" on ", 1)[1] for k in groups if k.startswith(f"{profile} on ")]
            scope = (
                f"{profile} on {', '.join(ran)}"
                if own is None
                else f"{profile} on every GPU ({', '.join(ran)})"
            )
            out[kind] = {"scope": scope, **groups[profile]}
    return out or None
