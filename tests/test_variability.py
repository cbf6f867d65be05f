"""The slowest GPU sets the pace: E[max of n normals] in closed form, the factor on compute-bound kernels only,
and its effect on a simulated iteration (linear in the spread, off for one GPU or a spread of 0)."""

from math import atan, pi, sqrt

import numpy as np
import pytest
from conftest import ideal_network_cluster, make

from simulator import simulate
from simulator.costs.compute import ComputeModel
from simulator.costs.variability import expected_max_std_normal, slowest_gpu_factor
from simulator.errors import ScenarioError
from simulator.hardware.gpus import DEFAULT_SPEED_SD, get_gpu, gpu_catalogue
from simulator.scenario.loader import load_scenario
from simulator.workload.ops import gemm, memory_op


def test_expected_maximum_of_standard_normals_matches_its_closed_forms():
    assert expected_max_std_normal(1) == 0.0
    assert expected_max_std_normal(2) == pytest.approx(1 / sqrt(pi), rel=1e-9)
    assert expected_max_std_normal(3) == pytest.approx(3 / (2 * sqrt(pi)), rel=1e-9)
    assert expected_max_std_normal(4) == pytest.approx(6 * atan(sqrt(2)) / pi**1.5, rel=1e-9)
    with pytest.raises(ValueError):
        expected_max_std_normal(0)


def test_expected_maximum_at_scale_agrees_with_sampling():
    rng = np.random.default_rng(7)
    for n in (64, 512):
        sampled = rng.standard_normal((20000, n)).max(axis=1)
        # the sample mean's standard error is ~0.4 / sqrt(20000) = 0.003
        assert expected_max_std_normal(n) == pytest.approx(sampled.mean(), abs=0.015)
    assert expected_max_std_normal(512) == pytest.approx(3.0439, abs=1e-4)


def test_factor_is_one_for_one_gpu_or_no_spread():
    assert slowest_gpu_factor(0.02, 1) == 1.0
    assert slowest_gpu_factor(0.0, 4096) == 1.0
    assert slowest_gpu_factor(0.015, 2) == pytest.approx(1 + 0.015 / sqrt(pi), rel=1e-9)
    assert (
        abs(DEFAULT_SPEED_SD - 0.08 / (2 * 2.698)) < 5e-4
    )  # Sinha et al.'s 8% as a whisker-to-whisker range
    assert all(g.speed_sd == DEFAULT_SPEED_SD for g in gpu_catalogue().values())


def test_only_compute_bound_kernels_take_the_slowest_gpus_time():
    a100 = get_gpu("a100-sxm4-80gb")
    one, many = ComputeModel(a100, "bf16"), ComputeModel(a100, "bf16", gpus=512, speed_sd=0.02)
    factor = 1 + 0.02 * expected_max_std_normal(512)
    big = gemm("mlp", 8192, 16384, 4096)
    launch = a100.kernel_launch_s
    assert many.op_time_s(big) - launch == pytest.approx((one.op_time_s(big) - launch) * factor, rel=1e-12)
    copy = memory_op("layernorm", 1e9)
    assert many.op_time_s(copy) == one.op_time_s(copy)
    # the GPU profile's spread unless the scenario gives one
    assert ComputeModel(a100, "bf16", gpus=512).slowest == pytest.approx(
        1 + a100.speed_sd * expected_max_std_normal(512), rel=1e-12
    )


def test_a_data_parallel_iteration_grows_linearly_with_the_spread():
    def iteration(sd: float) -> float:
        s = make(cluster={"num_nodes": 2, "gpu_speed_sd": sd}, training={"global_batch_size": 32})
        return simulate(s, cluster=ideal_network_cluster(s)).metrics.iteration_time_s

    t0, t1, t2 = iteration(0.0), iteration(0.02), iteration(0.04)
    assert t1 > t0
    # on an infinitely fast network the iteration is the compute stream: its GEMM part scales by the factor
    assert t2 - t0 == pytest.approx(2 * (t1 - t0), rel=1e-9)
    single = make(cluster={"gpus_per_node": 1, "gpu_speed_sd": 0.04}, training={"global_batch_size": 2})
    assert simulate(single).metrics.iteration_time_s == pytest.approx(t0, rel=1e-12)  # one GPU: no spread


def test_a_negative_spread_is_named():
    s = make().model_dump(mode="json", exclude_none=True)
    s["cluster"]["gpu_speed_sd"] = -0.1
    with pytest.raises(ScenarioError, match=r"cluster\.gpu_speed_sd"):
        load_scenario(s)
