"""Routes inside a node kept on disk between runs (simulator/hardware/route_cache.py): a later run of the same
node reads the routes an earlier one found, with the same result and without networkx; a node wired otherwise
gets its own; a damaged or unwritable cache only costs finding them again."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.hardware import route_cache
from simulator.hardware.cluster import Cluster
from simulator.hardware.topology import cluster_spec, load_topology
from simulator.scenario.loader import load_scenario

ROOT = Path(__file__).parents[1]
PAIRS = [("gpu0", "gpu5"), ("gpu3", "nic3"), ("nic6", "gpu6"), ("gpu2", "hostmem"), ("hostmem", "gpu7")]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory, no shipped routes, and no route table read in this process yet (as in a new
    process): every route is found again."""
    monkeypatch.setenv("CLUSTERSIM_CACHE", str(tmp_path))
    monkeypatch.setattr(route_cache, "SHIPPED_DIR", tmp_path / "none-shipped")
    monkeypatch.setattr(route_cache, "_tables", {})
    monkeypatch.setattr(route_cache, "_grown", [])
    return tmp_path / "routes"


def routes(cluster: Cluster) -> tuple:
    return cluster.nearest_nic, [cluster.local_route(3, a, b) for a, b in PAIRS]


def new_process(monkeypatch) -> None:
    """Write what this 'process' found, and forget every table read, as a process exit and a new start do."""
    route_cache.write_all()
    monkeypatch.setattr(route_cache, "_tables", {})


def test_a_later_run_of_the_same_node_reads_its_routes_and_finds_none(cache, monkeypatch):
    first = routes(Cluster(load_topology("dgx-a100"), 4))
    new_process(monkeypatch)
    assert len(list(cache.glob("*.json"))) == 1

    def not_again(*args):
        raise AssertionError("a route was searched again")

    monkeypatch.setattr(Cluster, "_find_path", not_again)
    monkeypatch.setattr(Cluster, "_find_nearest_nic", not_again)
    again = routes(Cluster(load_topology("dgx-a100"), 16))  # another cluster of the same nodes
    assert again == first
    assert first[0] == list(range(8))  # DGX A100: GPU i's nearest NIC is NIC i
    assert [links for links, _ in first[1]][0] == ((3, "gpu0", "nvswitch"), (3, "nvswitch", "gpu5"))


def test_a_node_wired_otherwise_has_routes_of_its_own(cache, monkeypatch):
    spec = load_topology("dgx-a100")
    routes(Cluster(spec, 1))
    four = spec.model_copy(update={"node": spec.node.model_copy(update={"nics": 4})})
    near = Cluster(four, 1).nearest_nic
    new_process(monkeypatch)
    assert len(list(cache.glob("*.json"))) == 2
    assert near == [0, 0, 1, 1, 2, 2, 3, 3] and Cluster(four, 1).nearest_nic == near


@pytest.mark.parametrize("content", ["{not json", '{"format": 1, "nearest_nic": "x", "paths": {}}', "[]", ""])
def test_a_damaged_cache_file_is_ignored_and_replaced(cache, monkeypatch, content):
    first = routes(Cluster(load_topology("dgx-h100"), 2))
    new_process(monkeypatch)
    (path,) = cache.glob("*.json")
    path.write_text(content)
    assert routes(Cluster(load_topology("dgx-h100"), 2)) == first
    new_process(monkeypatch)
    assert json.loads(path.read_text())["format"] == route_cache.FORMAT


def test_an_unwritable_cache_still_routes(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("not a directory")
    monkeypatch.setenv("CLUSTERSIM_CACHE", str(tmp_path / "a-file"))
    monkeypatch.setattr(route_cache, "_tables", {})
    monkeypatch.setattr(route_cache, "_grown", [])
    assert routes(Cluster(load_topology("dgx-a100"), 1))[0] == list(range(8))
    route_cache.write_all()  # nothing written, nothing raised
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_the_second_run_of_a_node_not_shipped_imports_no_networkx(tmp_path):
    """As a user runs it, on a node no shipped scenario has (a DGX A100 with 2 NICs): the first run finds its
    routes with networkx and keeps them; the next run reads them, networkx never imported, with the same
    iteration time."""
    code = (
        "import sys; from simulator import load_scenario, simulate; "
        "s = load_scenario({'name': 'q', 'model': {'preset': 'gpt3-125m'}, "
        "'cluster': {'topology': 'dgx-a100', 'num_nodes': 2, 'nics_per_node': 2}, "
        "'training': {'global_batch_size': 16, 'micro_batch_size': 1}, 'parallelism': {}}); "
        "print(repr(simulate(s).metrics.iteration_time_s), 'networkx' in sys.modules)"
    )
    env = {**os.environ, "CLUSTERSIM_CACHE": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
            for _ in range(2)]  # fmt: skip
    (first_time, first_nx), (second_time, second_nx) = (r.stdout.split() for r in runs)
    assert first_nx == "True" and second_nx == "False"
    assert first_time == second_time


def test_every_shipped_scenario_runs_on_shipped_routes_the_first_time(tmp_path):
    """A user's first run of any shipped scenario, with nothing cached: every route its nodes need ships with the
    package (simulator/hardware/routes/), so networkx is never imported."""
    code = (
        "import sys, pathlib; from simulator import load_scenario, simulate; "
        f"[simulate(load_scenario(p)) for p in sorted(pathlib.Path({str(ROOT / 'scenarios')!r}).rglob('*.yaml'))]; "
        "print('networkx' in sys.modules)"
    )
    env = {**os.environ, "CLUSTERSIM_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["False"], (
        "a shipped scenario's node needs routes the shipped files lack (a GPU file, topology or link cost "
        "changed): run python docs/generate_shipped_routes.py"
    )


def test_the_shipped_routes_are_the_routes_found_afresh(cache):
    """Every route shipped for a shipped scenario's node is the one Cluster finds with networkx now, and so is each
    GPU's nearest NIC: a shipped file holds what a run without it would find."""
    checked = 0
    for path in sorted((ROOT / "scenarios").rglob("*.yaml")):
        s = load_scenario(path)
        cluster = Cluster(cluster_spec(s), s.cluster.num_nodes)
        digest = route_cache.table(cluster._node0.signature()).path.name
        shipped = json.loads((ROOT / "simulator" / "hardware" / "routes" / digest).read_text())
        for pair, stored in shipped["paths"].items():
            assert cluster._find_path(*pair.split(">")) == stored, (path.name, pair)
            checked += 1
        if shipped["nearest_nic"] is not None:
            assert cluster._find_nearest_nic() == shipped["nearest_nic"], path.name
    assert checked > 100
