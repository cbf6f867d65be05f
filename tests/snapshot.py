"""What ``clustersim run --json`` prints for every shipped scenario and every published validation case, as one
JSON document: the reference a refactor must reproduce (tests/test_snapshot.py).

A change that is meant to change results regenerates the stored file in the same commit, and its message says
which numbers moved and why:

    python tests/snapshot.py            # rewrites tests/data/snapshot.json
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict
from pathlib import Path

from simulator.api import simulate
from simulator.errors import ScenarioError
from simulator.metrics.layers import microbatch_view
from simulator.scenario.loader import load_scenario
from simulator.scenario.shipped import shipped_scenarios
from simulator.study.fit import what_fits
from simulator.validation.runner import DEFAULT_CASES, case_scenario, load_cases

STORED = Path(__file__).parent / "data" / "snapshot.json"
# what a run says about the machine that simulated it, not about the simulated run; and its error bar, which sums
# up other runs (kept current by tests/test_accuracy.py)
VOLATILE = ("wall_s", "accuracy")


def run_json(source) -> dict:
    """``run --json``'s object for one scenario (a path or a scenario dict), without wall-clock fields."""
    s = load_scenario(source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = simulate(s)
    m = result.metrics
    out = {k: v for k, v in m.to_dict().items() if k not in VOLATILE}
    if m.oom or m.host_oom:
        out["would_fit"] = [asdict(f) for f in what_fits(result.scenario)]
    out["microbatch"] = [row.to_dict() for row in microbatch_view(result)]
    return out


def collect() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name, path in shipped_scenarios().items():
        out[f"scenario:{name}"] = run_json(path)
    for case in load_cases(DEFAULT_CASES):
        try:
            out[f"case:{case['id']}"] = run_json(case_scenario(case))
        except ScenarioError as e:
            out[f"case:{case['id']}"] = {"error": str(e)}
    return out


def differences(stored, new, path: str = "", rel: float = 1e-9) -> list[str]:
    """Where ``new`` differs from ``stored``: numbers beyond a relative ``rel`` (float sums may round
    differently on another platform), anything else exactly."""
    if isinstance(stored, dict) and isinstance(new, dict):
        out = [f"{path}.{k}: missing" for k in stored if k not in new]
        out += [f"{path}.{k}: new" for k in new if k not in stored]
        for k in sorted(stored.keys() & new.keys()):
            out += differences(stored[k], new[k], f"{path}.{k}", rel)
        return out
    if isinstance(stored, list) and isinstance(new, list):
        if len(stored) != len(new):
            return [f"{path}: {len(stored)} items -> {len(new)}"]
        pairs = enumerate(zip(stored, new, strict=True))
        return [d for i, (a, b) in pairs for d in differences(a, b, f"{path}[{i}]", rel)]
    numbers = (int, float)
    if isinstance(stored, numbers) and isinstance(new, numbers) and not isinstance(stored, bool):
        if math.isclose(stored, new, rel_tol=rel, abs_tol=1e-12):
            return []
        return [f"{path}: {stored!r} -> {new!r}"]
    return [] if stored == new else [f"{path}: {stored!r} -> {new!r}"]


if __name__ == "__main__":
    data = collect()
    STORED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"{len(data)} runs written to {STORED}")
