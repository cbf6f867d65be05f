"""The catalogue's derived parts and nodes (issue 60 item 4): H800 (an H100 with NVLink cut to 400 GB/s
bidirectional), DGX H800, DGX B300 (800 Gb/s NICs), an 8-GPU MI300X platform."""

import pytest

from simulator import load_scenario, simulate
from simulator.costs.collectives import CollectiveModel
from simulator.hardware.cluster import Cluster
from simulator.hardware.gpus import get_gpu
from simulator.hardware.placement import Placement
from simulator.hardware.topology import load_topology

GIB = 2**30


def all_reduce_s(topology: str, nodes: int, size: float, algorithm: str = "ring") -> float:
    cluster = Cluster(load_topology(topology), nodes)
    return CollectiveModel(cluster, Placement(dp=cluster.num_gpus), algorithm).standalone_time_s(
        "all_reduce", "dp", size
    )


def test_h800_is_an_h100_with_its_nvlink_cut():
    h800, h100 = get_gpu("h800-sxm5-80gb"), get_gpu("h100-sxm5-80gb")
    assert h800.lineage == "h100-sxm5-80gb"  # its cost table and profile factors are the H100's
    assert h800.peak_tflops == h100.peak_tflops and h800.hbm_bandwidth_GBps == h100.hbm_bandwidth_GBps
    assert (h800.nvlink_bandwidth_GBps, h100.nvlink_bandwidth_GBps) == (200, 450)


def test_an_8_gpu_all_reduce_on_dgx_h800_moves_at_its_nvlink():
    """8 GiB on the ring: 2 (n-1)/n S / (200 GB/s x 0.8, DeepSeek-V3's 160 GB/s) plus a latency that is a
    fraction of a percent of it; about 2.3 times DGX H100's (450 x 0.822)."""
    s = 8 * GIB
    h800 = all_reduce_s("dgx-h800", 1, s)
    assert h800 == pytest.approx(2 * 7 / 8 * s / 160e9, rel=0.01)
    assert h800 / all_reduce_s("dgx-h100", 1, s) == pytest.approx(450 * 0.822 / 160, rel=0.02)


def test_dgx_b300s_800_gbps_nics_halve_a_network_bound_all_reduce():
    """Two nodes, 8 GiB on the ring (network-bound): DGX B300's ConnectX-8 at 800 Gb/s against DGX B200's 400."""
    b300, b200 = all_reduce_s("dgx-b300", 2, 8 * GIB), all_reduce_s("dgx-b200", 2, 8 * GIB)
    assert load_topology("dgx-b300").node.nic_bandwidth_gbps == 800
    assert b300 / b200 == pytest.approx(0.5, abs=0.05)


@pytest.mark.parametrize("topology", ["dgx-h800", "dgx-b300", "mi300x-8gpu"])
def test_each_new_node_runs_a_tensor_parallel_job(topology):
    s = load_scenario(
        {
            "name": "t",
            "model": {"preset": "gpt3-1.3b"},
            "cluster": {"topology": topology, "num_nodes": 2},
            "training": {"global_batch_size": 32, "micro_batch_size": 1},
            "parallelism": {"tensor_parallel": 2},
        }
    )
    m = simulate(s).metrics
    assert m.iteration_time_s > 0 and m.gpus == 16 and not m.oom
