"""A power limit below the part's rated power slows its compute-bound kernels by (limit / rated) ** 0.47
(hardware/gpus.py power_capped_clock, fitted on MLPerf's capped DGX H100 runs); memory-bound kernels, links and
the network keep their speed."""

import pytest
from conftest import ideal_network_cluster, make

from simulator import simulate
from simulator.costs.compute import ComputeModel
from simulator.errors import ScenarioError
from simulator.hardware.gpus import POWER_CAP_EXPONENT, get_gpu, power_capped_clock
from simulator.scenario.loader import load_scenario
from simulator.workload.ops import gemm, memory_op


def test_the_capped_clock_by_hand():
    """350 W on a 700 W H100: 0.5 ** 0.47 = 0.7219; at or above the rating: 1."""
    assert POWER_CAP_EXPONENT == 0.47
    assert (
        power_capped_clock(350, 700) == pytest.approx(0.5**0.47, rel=1e-12) == pytest.approx(0.7219, abs=1e-4)
    )
    assert power_capped_clock(700, 700) == power_capped_clock(800, 700) == 1.0


def test_the_fit_reproduces_mlperfs_capped_throughput():
    """The nine MaxQ / MaxP throughput ratios of MLPerf Inference v4.0's DGX H100 (cap W, measured ratio) the
    exponent is the median of: the seven GEMM- or convolution-bound benchmarks within 4%; 3d-unet and rnnt (an LSTM),
    the least compute-bound, lose less than the model says (-10%, -18%): the model is for compute-bound kernels."""
    compute_bound = {
        "bert-99": (400, 0.766),
        "resnet50": (300, 0.673),
        "gptj-99": (350, 0.746),
        "dlrm-v2": (450, 0.806),
        "retinanet": (350, 0.712),
        "sdxl": (350, 0.735),
        "llama2-70b": (450, 0.805),
    }
    errors = [power_capped_clock(w, 700) / r - 1 for w, r in compute_bound.values()]
    assert max(abs(e) for e in errors) < 0.04, errors
    assert power_capped_clock(300, 700) / 0.742 - 1 == pytest.approx(-0.095, abs=0.001)  # 3d-unet
    assert power_capped_clock(300, 700) / 0.820 - 1 == pytest.approx(-0.181, abs=0.001)  # rnnt


def test_only_compute_bound_kernels_slow_under_a_cap():
    h100 = get_gpu("h100-sxm5-80gb")
    capped = h100.at_power(350)
    assert capped.clock_scale == pytest.approx(0.5**0.47) and capped.power_w == 350
    assert h100.at_power(None) is h100 and h100.at_power(700) is h100
    full, low = ComputeModel(h100, "bf16"), ComputeModel(capped, "bf16")
    big, launch = gemm("mlp", 8192, 16384, 4096), h100.kernel_launch_s
    assert low.op_time_s(big) - launch == pytest.approx((full.op_time_s(big) - launch) / 0.5**0.47, rel=1e-9)
    copy = memory_op("layernorm", 1e9)
    assert low.op_time_s(copy) == full.op_time_s(copy)


def test_a_capped_iteration_on_an_ideal_network_is_its_compute_slowed_by_the_clock():
    """Data parallelism on an infinitely fast network under the ideal profile: the iteration is the compute stream,
    so capping an A100 (400 W) to 200 W stretches its GEMM time by 1 / 0.5 ** 0.47 and leaves the rest."""

    def iteration(**cluster) -> float:
        s = make(cluster={"gpu_speed_sd": 0.0, **cluster}, training={"global_batch_size": 16})
        return simulate(s, cluster=ideal_network_cluster(s)).metrics.iteration_time_s

    full, half, quarter = iteration(), iteration(power_w=200), iteration(power_w=100)
    assert iteration(power_w=400) == full == iteration(power_w=500)
    # t(cap) = rest + gemm / clock(cap): two caps give both parts, which must be positive and sum to the uncapped
    c2, c4 = 0.5**0.47, 0.25**0.47
    gemm_s = (quarter - half) / (1 / c4 - 1 / c2)
    rest = full - gemm_s
    assert gemm_s > 0.5 * full and rest > 0
    assert half == pytest.approx(rest + gemm_s / c2, rel=1e-9)


def test_a_cap_on_a_gpu_without_a_rating_is_refused_and_named():
    s = make().model_dump(mode="json", exclude_none=True)
    s["cluster"]["power_w"] = 0
    with pytest.raises(ScenarioError, match=r"cluster\.power_w"):
        load_scenario(s)
