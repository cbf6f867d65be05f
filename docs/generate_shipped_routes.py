"""Build the shipped routes (simulator/hardware/routes/): the routes inside a node that the shipped scenarios and
validation cases use, found as any run finds them (``Cluster`` with networkx, ties broken by our own rule).

    python docs/generate_shipped_routes.py

Every shipped scenario and every case of the shipped validation files is simulated once with an empty route
cache; the route files that leaves behind (one per node layout, named by a digest of the node's devices and links
with their costs, ``hardware/route_cache.py``) replace the shipped ones. A first run of those nodes then reads
its routes and never imports networkx (0.07 s). tests/test_route_cache.py fails, naming this script, when a
shipped scenario's node needs a route the shipped files lack (a GPU file, a topology or a link cost changed).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    cache = tempfile.mkdtemp(prefix="clustersim-routes-")
    os.environ["CLUSTERSIM_CACHE"] = cache  # before the simulator reads it
    from simulator import load_scenario, simulate
    from simulator.hardware import route_cache
    from simulator.validation.runner import load_cases, run_case

    route_cache.SHIPPED_DIR = (
        Path(cache) / "none"
    )  # found afresh, not read back from the files being replaced
    scenarios = sorted((ROOT / "scenarios").rglob("*.yaml"))
    for path in scenarios:
        simulate(load_scenario(path))
    cases = [
        c for p in sorted((ROOT / "simulator" / "validation").glob("*.yaml")) for c in _cases(p, load_cases)
    ]
    for case in cases:
        run_case(case)
    route_cache.write_all()
    out = ROOT / "simulator" / "hardware" / "routes"
    out.mkdir(exist_ok=True)
    for old in out.glob("*.json"):
        old.unlink()
    found = sorted(Path(cache, "routes").glob("*.json"))
    for path in found:
        data = json.loads(path.read_text())
        data["paths"] = dict(sorted(data["paths"].items()))
        (out / path.name).write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"{len(found)} node layouts from {len(scenarios)} scenarios and {len(cases)} cases -> {out}")


def _cases(path: Path, load_cases) -> list[dict]:
    try:
        return load_cases(path)
    except Exception:  # not a cases file (nccl_tests.yaml holds collective curves)
        return []


if __name__ == "__main__":
    main()
