"""ECMP's hash collisions on the spine uplinks (costs/ecmp.py): balls in bins by hand, then what they do to a
collective that crosses leaves, and what more queue pairs per connection buy back."""

import copy
from pathlib import Path

import pytest
import yaml

from simulator import load_scenario, simulate
from simulator.costs.ecmp import expected_max, slowdown

ROOT = Path(__file__).parents[1]


def test_the_busiest_uplink_by_hand():
    # 2 flows on 2 links: both on one (probability 1/2) or one each -> E[max] = 1.5
    assert expected_max(2, 2) == 1.5 and slowdown(2, 2) == 1.5
    # 3 flows on 3 links: 3 assignments put all three on one link, 6 spread them, 18 put two together
    assert expected_max(3, 3) == pytest.approx((3 * 3 + 6 * 1 + 18 * 2) / 27, rel=1e-12)
    # one flow uses one of 32 uplinks: 1/32 of the pipe
    assert slowdown(1, 32) == 32.0
    # many flows spread out; one uplink has nothing to collide on
    assert 1.0 < slowdown(100_000, 32) < 1.05 and slowdown(7, 1) == 1.0
    assert slowdown(64, 32) > slowdown(512, 32) > slowdown(4096, 32) > 1.0


def ep_scenario(**cluster):
    d = yaml.safe_load((ROOT / "scenarios" / "moe" / "deepseek-v3-ep64-1024xh100.yaml").read_text())
    d["cluster"].update(cluster)
    return load_scenario(d)


def a2a_s(s) -> float:
    return simulate(s).comm.standalone_time_s("all_to_all", "ep", 1e9)


def test_ecmp_slows_an_all_to_all_across_leaves_and_more_queue_pairs_win_it_back():
    adaptive = a2a_s(ep_scenario())
    ecmp = a2a_s(ep_scenario(routing="ecmp"))
    spread = a2a_s(ep_scenario(routing="ecmp", qps_per_connection=16))
    assert ecmp > 1.05 * adaptive
    assert adaptive <= spread < ecmp and spread == pytest.approx(adaptive, rel=0.01)


def test_a_ring_crossing_each_leaf_boundary_once_is_not_slowed():
    """A data-parallel ring visits the nodes of a leaf in a row: one flow leaves each leaf, which one uplink
    carries at the NIC's rate; ECMP changes nothing. (The ring is forced: over 1,024 ranks NCCL's own model
    takes the tree for 1 GB, whose flows ECMP does collide.)"""
    d = {
        "model": {"preset": "llama3-8b"},
        "cluster": {"topology": "dgx-h100", "num_nodes": 128, "oversubscription": 2},
        "training": {"global_batch_size": 1024, "micro_batch_size": 1},
        "parallelism": {"zero_stage": 1, "collective_algorithm": "ring"},
    }
    times = []
    for routing in ("adaptive", "ecmp"):
        e = copy.deepcopy(d)
        e["cluster"]["routing"] = routing
        times.append(simulate(load_scenario(e)).comm.standalone_time_s("all_reduce", "dp", 1e9))
    assert times[0] == times[1]
