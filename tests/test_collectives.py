"""Collective costs on the graph reduce to the textbook closed forms."""

import pytest

from simulator.costs.collectives import CollectiveModel, ring_bytes_per_rank, ring_steps
from simulator.hardware.cluster import Cluster
from simulator.hardware.placement import Placement
from simulator.hardware.topology import load_topology

S = 1e9  # bytes


def model(topology: str, nodes: int, algorithm: str = "ring", **placement) -> CollectiveModel:
    cluster = Cluster(load_topology(topology), nodes)
    return CollectiveModel(cluster, Placement(**(placement or {"dp": cluster.num_gpus})), algorithm)


def test_ring_all_reduce_on_nvswitch_is_2_n_minus_1_over_n_times_s_over_b_plus_latency():
    cm = model("dgx-a100", 1)
    spec = cm.cluster.spec
    n = 8
    bandwidth = 300e9 * spec.efficiency.nvlink  # per GPU per direction into the NVSwitch
    hop_latency = 2 * spec.node.nvlink_latency_us * 1e-6  # gpu -> nvswitch -> gpu
    alpha = hop_latency + spec.collective_step_latency_us * 1e-6
    expected = 2 * (n - 1) / n * S / bandwidth + 2 * (n - 1) * alpha
    assert cm.standalone_time_s("all_reduce", "dp", S) == pytest.approx(expected, rel=1e-12)


def test_reduce_scatter_and_all_gather_take_half_an_all_reduce_minus_nothing():
    cm = model("dgx-h100", 1)
    ar = cm.standalone_time_s("all_reduce", "dp", S)
    assert cm.standalone_time_s("reduce_scatter", "dp", S) == pytest.approx(ar / 2, rel=1e-12)
    assert cm.standalone_time_s("all_gather", "dp", S) == pytest.approx(ar / 2, rel=1e-12)


def test_multi_node_ring_is_limited_by_the_eight_nics_per_node():
    """DGX A100, 4 nodes: 8 rings, one per rail, so the bus bandwidth is 8 NICs x 24 GB/s = 192 GB/s
    (NVIDIA's measured multi-node all-reduce bus bandwidth, nccl issue 812)."""
    cm = model("dgx-a100", 4)
    (phase,) = cm.phases("all_reduce", "dp", S)
    n = 32
    nic = 25e9 * cm.cluster.spec.efficiency.infiniband
    assert max(phase.demand_s.values()) == pytest.approx(2 * (n - 1) / n * S / (8 * nic), rel=1e-12)
    busbw = 2 * (n - 1) / n * S / max(phase.demand_s.values())
    assert busbw == pytest.approx(192e9, rel=0.01)


def test_fewer_nics_per_node_slow_inter_node_rings_down():
    eight = model("dgx-a100", 2).standalone_time_s("all_reduce", "dp", S)
    spec = load_topology("dgx-a100")
    four = CollectiveModel(
        Cluster(spec.model_copy(update={"node": spec.node.model_copy(update={"nics": 4})}), 2),
        Placement(dp=16),
        "ring",
    ).standalone_time_s("all_reduce", "dp", S)
    assert four > 1.8 * eight


def test_pcie_server_ring_is_bound_by_each_gpus_pcie_link():
    """Without NVLink every ring hop inside the node crosses the GPU's own PCIe gen4 link (31.5 GB/s x 0.8),
    which is slower than the 2 shared NICs (2 x 24 GB/s)."""
    cm = model("pcie-8gpu", 2)
    (phase,) = cm.phases("all_gather", "dp", S)
    n = 16
    assert max(phase.demand_s.values()) == pytest.approx((n - 1) / n * S / (31.5e9 * 0.8), rel=1e-9)
    assert max(phase.demand_s, key=phase.demand_s.get)[1].startswith(("gpu", "pcie"))


def test_concurrent_groups_add_their_traffic_on_shared_links():
    """Eight DP groups of 2 (one GPU per node, one per rail) each use their own NIC: no slowdown; on the PCIe
    server all eight share 2 NICs and each group's all-reduce takes 4x longer than a lone group's would."""
    fast = model("dgx-a100", 2, tp=8, dp=2).standalone_time_s("all_reduce", "dp", S)
    lone = 2 * (2 - 1) / 2 * S / (25e9 * 0.96)
    assert fast == pytest.approx(lone, rel=0.01)
    shared = model("pcie-8gpu", 2, tp=8, dp=2).phases("all_reduce", "dp", S)[0]
    assert max(shared.demand_s.values()) == pytest.approx(4 * lone * 0.96 / 0.96, rel=0.01)


def test_tree_all_reduce_beats_ring_for_small_messages_at_scale():
    """A ring over 512 GPUs pays 1,022 step latencies; the double binary tree about 2 x (log2(64) + 7)."""
    auto, ring, tree = (model("dgx-a100", 64, a) for a in ("auto", "ring", "tree"))
    small = 64 * 1024
    assert auto.standalone_time_s("all_reduce", "dp", small) < 0.2 * ring.standalone_time_s(
        "all_reduce", "dp", small
    )
    for size in (small, 4e9):  # auto takes the faster of ring and tree, as NCCL's tuner does
        best = min(
            ring.standalone_time_s("all_reduce", "dp", size), tree.standalone_time_s("all_reduce", "dp", size)
        )
        assert auto.standalone_time_s("all_reduce", "dp", size) == pytest.approx(best, rel=1e-12)


def test_hierarchical_all_reduce_keeps_intra_node_phases_on_nvlink():
    phases = model("dgx-a100", 4, "hierarchical").phases("all_reduce", "dp", S)
    assert len(phases) == 3
    assert all("nvswitch" in cls[1:] for cls in phases[0].demand_s)
    assert all("nvswitch" in cls[1:] for cls in phases[2].demand_s)
    assert any(cls[1].startswith("nic") for cls in phases[1].demand_s)


def test_ring_closed_forms():
    assert ring_steps("all_reduce", 8) == 14 and ring_steps("all_gather", 8) == 7
    assert ring_bytes_per_rank("all_reduce", 4, 100.0) == 150.0
    assert ring_bytes_per_rank("reduce_scatter", 4, 100.0) == 75.0


def test_all_to_all_sends_n_minus_1_over_n_of_the_buffer_per_rank():
    """Each rank sends S/n to each of the n-1 others: on NVSwitch, (n-1)/n S through its own link."""
    cm = model("dgx-a100", 1)
    (phase,) = cm.phases("all_to_all", "dp", S)
    bandwidth = 300e9 * cm.cluster.spec.efficiency.nvlink
    assert max(phase.demand_s.values()) == pytest.approx(7 / 8 * S / bandwidth, rel=1e-12)
