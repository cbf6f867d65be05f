"""Published nccl-tests curves (``nccl_tests.yaml``) as the collective model predicts them.

A curve names its topology, node count, ranks, operation and, where the cluster differs from the topology file,
its ``cluster`` overrides (NICs per node and their speed, as ``cluster:`` in a scenario) and a forced ``algorithm``
(NCCL_ALGO=Ring: ``ring``; else NCCL's own choice, ``auto``). ``first_contact`` keeps the model's times for a curve
at the commit it arrived, before any change it prompted (``python -m simulator.validation.collective_curves ID``);
``used_for`` says whether anything was fitted on it.
"""

from __future__ import annotations

import datetime
import statistics
import sys
from functools import cache
from pathlib import Path

CURVES_FILE = Path(__file__).resolve().parent / "nccl_tests.yaml"


@cache
def curves() -> dict[str, dict]:
    from simulator.scenario.files import read_yaml

    return {c["id"]: c for c in read_yaml(CURVES_FILE, "nccl-tests curves", shipped=True)["curves"]}


def collective_model(curve: dict):
    from simulator.costs.collectives import CollectiveModel
    from simulator.hardware.cluster import Cluster
    from simulator.hardware.placement import Placement
    from simulator.hardware.topology import apply_overrides, load_topology
    from simulator.scenario.cluster import ClusterConfig

    nodes = curve.get("nodes", 1)
    spec = apply_overrides(
        load_topology(curve["topology"]),
        ClusterConfig(topology=curve["topology"], num_nodes=nodes, **curve.get("cluster", {})),
    )
    cluster = Cluster(spec, nodes)
    return CollectiveModel(cluster, Placement(dp=curve["ranks"]), curve.get("algorithm", "auto"))


def model_times_us(curve: dict, sizes=None) -> dict[int, float]:
    """The model's time (us) of the curve's operation at each of its sizes (bytes, as nccl-tests counts them)."""
    cm = collective_model(curve)
    return {
        int(size): cm.standalone_time_s(curve["op"], "dp", int(size)) * 1e6
        for size in (sizes or curve["times_us"])
    }


def errors_pct(curve: dict, model_us: dict[int, float], lo: int = 2**20, hi: int = 2**32) -> dict[int, float]:
    """Model over measured time, less 1 (%), at the sizes from ``lo`` to ``hi`` bytes: negative = model faster."""
    return {
        size: 100.0 * (model_us[size] / us - 1.0)
        for size, us in sorted(curve["times_us"].items())
        if lo <= size <= hi and size in model_us
    }


def median_abs(errors: dict[int, float]) -> float:
    return statistics.median(abs(e) for e in errors.values())


def record(curve_id: str) -> dict:
    """The model's times for a curve that has no first-contact record yet, written into nccl_tests.yaml."""
    from simulator.validation.first_contact import _commit

    curve = curves()[curve_id]
    if "first_contact" in curve:
        raise SystemExit(f"{curve_id}: already has a first-contact record (never rewrite one)")
    block = {
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "model_us": {s: round(t, 2) for s, t in model_times_us(curve).items()},
    }
    text = CURVES_FILE.read_text()
    marker = f"  - id: {curve_id}\n"
    start = text.index(marker)
    end = text.find("\n  - id: ", start + len(marker))
    end = len(text.rstrip("\n")) if end < 0 else end
    flow = ", ".join(f"{s}: {t}" for s, t in block["model_us"].items())
    entry = (
        f"\n    first_contact:  # the model's times (us) before any change this curve prompted\n"
        f"      commit: {block['commit']}\n      date: '{block['date']}'\n      model_us: {{{flow}}}"
    )
    CURVES_FILE.write_text(text[:end] + entry + text[end:])
    curves.cache_clear()
    return block


if __name__ == "__main__":
    for name in sys.argv[1:]:
        got = record(name)
        c = curves()[name]
        e = errors_pct(c, got["model_us"])
        print(
            f"{name}: first contact, median |error| {median_abs(e):.1f}% over {len(e)} sizes from 1 MiB to 4 GiB"
        )
