"""Routes inside a node kept on disk between runs (simulator/hardware/route_cache.py): a later run of the same
node reads the routes an earlier one found, with the same result and without networkx; a node wired otherwise
gets its own; a damaged or unwritable cache only costs finding them again."""

import json
import os
import subprocess
import sys

import pytest

from simulator.hardware import route_cache
from simulator.hardware.cluster import Cluster
from simulator.hardware.topology import load_topology

PAIRS = [("gpu0", "gpu5"), ("gpu3", "nic3"), ("nic6", "gpu6"), ("gpu2", "hostmem"), ("hostmem", "gpu7")]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory, and no route table read in this process yet (as in a new process)."""
    monkeypatch.setenv("CLUSTERSIM_CACHE", str(tmp_path))
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


def test_the_second_quickstart_imports_no_networkx(tmp_path):
    """As a user runs it: the first run of a node finds its routes with networkx and keeps them; the next run
    of the same node reads them, networkx never imported, with the same iteration time."""
    code = (
        "import sys; from simulator import load_scenario, simulate; "
        "m = simulate(load_scenario('quickstart')).metrics; "
        "print(repr(m.iteration_time_s), 'networkx' in sys.modules)"
    )
    env = {**os.environ, "CLUSTERSIM_CACHE": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
            for _ in range(2)]  # fmt: skip
    (first_time, first_nx), (second_time, second_nx) = (r.stdout.split() for r in runs)
    assert first_nx == "True" and second_nx == "False"
    assert first_time == second_time


def test_of_equally_short_paths_the_route_is_ours_not_networkxs_order_of_search(cache):
    """A DGX A100 node has 216 tied pairs among its 420 device pairs. With the node's links handed to networkx
    in reverse, networkx's own search returns other paths for some pairs; the route is the same both ways: of
    equally short paths the first by device names in natural order (gpu8 before gpu10)."""
    import itertools

    import networkx as nx

    forward = Cluster(load_topology("dgx-a100"), 1)
    backward = Cluster(load_topology("dgx-a100"), 1)
    g = forward._node0_graph
    reverse = nx.Graph()
    reverse.add_nodes_from(reversed(list(g.nodes(data=True))))
    reverse.add_edges_from(reversed(list(g.edges(data=True))))
    backward.__dict__["_node0_graph"] = reverse
    devices = [n[3:] for n in g if not n[3:].startswith(("pcie", "nvswitch", "cpu"))]
    moved = 0
    for a, b in itertools.permutations(devices, 2):
        assert forward._find_path(a, b) == backward._find_path(a, b)
        ours = [f"n0.{x}" for x in forward._find_path(a, b)]
        moved += nx.shortest_path(reverse, f"n0.{a}", f"n0.{b}", weight="cost") != ours
        ties = list(nx.all_shortest_paths(g, f"n0.{a}", f"n0.{b}", weight="cost"))
        assert ours in ties and all(
            route_cache.natural_order(ours) <= route_cache.natural_order(t) for t in ties
        )
    assert moved > 0  # networkx's search order does pick otherwise: the rule is doing the work
    assert route_cache.natural_order(["gpu8"]) < route_cache.natural_order(["gpu10"])
