"""Rail symmetry (costs/rails.py): groups alike but for their local GPU are summed as one family, and give the
link loads that walking every hop of every group along its route gives."""

import numpy as np
import pytest
from conftest import reference_loads

from simulator.costs.collectives import CollectiveModel
from simulator.costs.hops import hops as pattern_hops
from simulator.costs.rails import RAIL_HOPS, rail_families, rail_hops
from simulator.hardware.cluster import Cluster
from simulator.hardware.placement import Groups, Placement
from simulator.hardware.topology import load_topology


def test_families_are_groups_on_the_same_nodes_one_rank_per_node_each_on_one_gpu():
    pm = Placement(tp=8, dp=4, pp=2)  # 64 GPUs on 8 nodes: a stage's data-parallel groups are rails
    reps, gpus = rail_families(pm.groups("dp"), 8)
    assert gpus == tuple(range(8))
    # one group per family: stage 0's nodes 0-3, stage 1's 4-7, each on local GPU 0
    assert reps.array.tolist() == [[0, 8, 16, 24], [32, 40, 48, 56]]
    reps, gpus = rail_families(pm.groups("pp"), 8)  # pipeline groups: a family per data-parallel index
    assert gpus == tuple(range(8)) and reps.array.tolist() == [[0, 32], [8, 40], [16, 48], [24, 56]]
    # TP 2: four of a data-parallel group's ranks share each node; not a family
    assert rail_families(Placement(tp=2, dp=16, pp=2).groups("dp"), 8) is None
    assert rail_families(Placement(tp=8, dp=4).groups("tp"), 8) is None  # inside one node
    # a group that changes local GPU from node to node, and families on different GPUs
    assert rail_families(Groups([[0, 9], [1, 8]], "x"), 8) is None
    assert rail_families(Groups([[0, 8], [1, 9], [16, 24], [18, 26]], "y"), 8) is None
    # families on the same GPUs in another order are still families
    reps, gpus = rail_families(Groups([[0, 8], [1, 9], [17, 25], [16, 24]], "z"), 8)
    assert gpus == (0, 1) and reps.array.tolist() == [[0, 8], [17, 25]]


@pytest.mark.parametrize("kind", ["ring", "tree", "pairs"])
@pytest.mark.parametrize("size", [2, 3, 7, 600])
def test_rail_hops_in_pieces_are_the_hops_of_one_rank_per_node_groups(kind, size):
    """The same hops (source, destination, share) as costs/hops.py makes for groups with one rank per node, in
    pieces of any length: a group of 600 made 100 positions at a time."""
    rng = np.random.default_rng(size)
    rows = np.stack([rng.permutation(1000)[:size] * 8 + g for g in range(3)])  # one rank per node
    want = sorted(zip(*(x.tolist() for x in pattern_hops(kind, Groups(rows, "r"), 8, 8)), strict=True))
    got = []
    for lo in range(0, size, 100):
        got += zip(*(x.tolist() for x in rail_hops(kind, rows, lo, lo + 100)), strict=True)
    assert sorted(got) == want and want


@pytest.mark.parametrize(
    "nodes, update, placement",
    [
        (16, {}, {"tp": 8, "dp": 8, "pp": 2}),  # DGX A100: a NIC per GPU, 20 nodes per leaf
        (64, {"fabric": {"nodes_per_leaf": 4, "oversubscription": 2.0}}, {"tp": 8, "dp": 16, "pp": 4}),
        (
            64,
            {"fabric": {"nodes_per_leaf": 4, "routing": "ecmp", "qps_per_connection": 2}},
            {"tp": 8, "dp": 32, "pp": 2},
        ),
        (
            16,
            {"node": {"nics": 4}, "fabric": {"nodes_per_leaf": 2}},
            {"tp": 8, "dp": 4, "pp": 4},
        ),  # 2 GPUs a NIC
        (12, {"fabric": {"nodes_per_leaf": 3, "rail_optimized": False}}, {"tp": 8, "dp": 6, "pp": 2}),
        (8, {"fabric": {"nodes_per_leaf": 64}}, {"tp": 8, "dp": 4, "pp": 2}),  # one leaf: no spine
        (
            16,
            {"fabric": {"nodes_per_leaf": 2}},
            {"tp": 4, "cp": 2, "dp": 8, "pp": 2},
        ),  # TP x CP fills the node
    ],
)
def test_families_load_every_link_as_their_hops_walked_along_their_routes(
    nodes, update, placement, monkeypatch
):
    """Data-parallel, pipeline and embedding groups summed as rail families (and in pieces of 5 hops, so a group's
    tree spans many) give the loads of every hop of every group summed per GPU, which are those of every hop walked
    along its route (with ECMP, whose hashing the walk does not know, the per-GPU sums alone)."""
    from simulator.costs import rails

    spec = load_topology("dgx-a100")
    for part, values in update.items():
        spec = spec.model_copy(update={part: getattr(spec, part).model_copy(update=values)})
    cluster = Cluster(spec, nodes)
    for chunk in (RAIL_HOPS, 5):
        monkeypatch.setattr(rails, "RAIL_HOPS", chunk)
        cm = CollectiveModel(cluster, Placement(**placement), "auto")
        checked = 0
        for group in ("dp", "pp", "embedding"):
            groups = cm.placement.groups(group)
            assert rail_families(groups, 8) is not None, group
            for kind in ("ring", "tree", "pairs"):
                got = cm.links.group_loads(kind, groups)
                hops = pattern_hops(kind, groups, 8, spec.node.nics)
                want = cm.links.loads(hops)  # every hop summed per GPU (not as families)
                if spec.fabric.routing != "ecmp":  # the route walk knows no hashing of flows
                    walked = reference_loads(cm, zip(*(x.tolist() for x in hops), strict=True))
                    assert walked.keys() == want.keys()
                    assert all(walked[c] == pytest.approx(s, rel=1e-12) for c, s in want.items())
                assert got.keys() == want.keys(), (group, kind)
                for c, seconds in want.items():
                    assert got[c] == pytest.approx(seconds, rel=1e-12), (group, kind, c)
                checked += len(want)
        assert checked > 30
