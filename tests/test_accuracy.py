"""The error bar every run reports: its profile's error on held-out measured runs (simulator/validation/accuracy.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.frameworks import get_framework
from simulator.metrics import error_bar
from simulator.validation import accuracy
from simulator.validation.runner import load_cases


def test_speed_errors_are_signed_the_same_way_for_times_and_throughputs():
    """+ = simulated faster than measured: 1.6 s simulated against 2.0 s measured is 25% fast, as 125 tokens/s
    against 100 is."""
    assert accuracy.speed_error_pct("iteration_time_s", published=2.0, predicted=1.6) == pytest.approx(25.0)
    assert accuracy.speed_error_pct(
        "tokens_per_s_per_gpu", published=100.0, predicted=125.0
    ) == pytest.approx(25.0)
    assert accuracy.speed_error_pct(
        "model_tflops_per_gpu", published=200.0, predicted=150.0
    ) == pytest.approx(-25.0)


def test_summary_by_hand():
    """|errors| 1, 2, 5, 10, 20: median 5; 90th percentile (inclusive) at rank 0.9 x 4 = 3.6, 10 + 0.6 x 10 = 16;
    mean signed (-10 + 5 + 1 + 2 + 20) / 5 = 3.6."""
    from collections import Counter

    g = accuracy.summary([-10.0, 5.0, 1.0, 2.0, 20.0], Counter(a=3, b=2))
    assert g == {
        "n": 5,
        "median_abs_pct": 5.0,
        "p90_abs_pct": 16.0,
        "max_abs_pct": 20.0,
        "mean_signed_pct": 3.6,
        "sets": {"a": 3, "b": 2},
    }


@pytest.fixture(scope="module")
def measured():
    return accuracy.measure()


def test_the_shipped_error_bars_are_those_of_the_simulator_as_it_stands(measured):
    """A change that moves a prediction rewrites accuracy.yaml (python -m simulator.validation.accuracy)."""
    stored = error_bar.stored()
    assert set(stored) == set(measured) == {"speed", "memory"}
    for kind in measured:
        assert set(stored[kind]) == set(measured[kind]), kind
        for key, g in measured[kind].items():
            s = stored[kind][key]
            assert (s["n"], s["sets"]) == (g["n"], g["sets"]), (kind, key)
            for field in ("median_abs_pct", "p90_abs_pct", "max_abs_pct", "mean_signed_pct"):
                assert s[field] == pytest.approx(g[field], abs=0.02), (kind, key, field)


def test_runs_a_profile_was_fitted_on_are_not_held_out(measured):
    """llm-foundry-2023 is fitted on four MPT A100 runs and one MPT H100 run of published.yaml: the other MPT runs
    there count, those five do not; megatron-2022 is fitted on runs that are not shipped, so all its count."""
    fitted = accuracy.fitted_case_ids()
    assert {"MPT-A100-125M", "MPT-A100-13B", "MPT-H100-7B", "NAR21-T1-1.7B", "MCORE-H100-70B"} <= fitted
    mpt = [c for c in load_cases(accuracy.HERE / "published.yaml") if str(c["id"]).startswith("MPT-")]
    assert measured["speed"]["llm-foundry-2023"]["sets"]["published"] == len(mpt) - 5
    vtrain = len(load_cases(accuracy.HERE / "vtrain-8gpu.yaml")) + len(
        load_cases(accuracy.HERE / "vtrain-multi.yaml")
    )
    assert (
        measured["speed"]["megatron-2022 on ampere"]["sets"]["vtrain-8gpu"]
        + measured["speed"]["megatron-2022 on ampere"]["sets"]["vtrain-multi"]
        == vtrain
        == 829
    )


def test_a_gpu_generation_without_its_own_runs_says_where_the_runs_ran():
    a100 = error_bar.held_out("megatron-2022", "ampere", 8)["speed"]
    h100 = error_bar.held_out("megatron-2022", "hopper", 8)["speed"]
    assert a100["scope"] == "megatron-2022 on ampere at up to 8 GPUs"
    assert h100["scope"] == "megatron-2022 on ampere" and h100["n"] > a100["n"] > 700
    assert error_bar.held_out("ideal", "ampere", 8) is None
    assert get_framework("ideal").fit_cases == ()


def test_a_large_job_gets_the_error_of_large_held_out_jobs():
    """Over 512 GPUs, megatron-2022 on A100 has DeepSpeed's six public runs of 1,024-3,360 GPUs: the bar is theirs,
    and it says the simulation runs faster than they did; at 64 GPUs it is the 9-512 GPU runs'."""
    big = [c for c in load_cases(accuracy.HERE / "deepspeed.yaml") if c["cluster"]["num_nodes"] * 8 > 512]
    bar = error_bar.held_out("megatron-2022", "ampere", 1024)["speed"]
    assert bar["scope"] == "megatron-2022 on ampere at over 512 GPUs"
    assert bar["n"] == len(big) == 6 and bar["sets"] == {"deepspeed": 6}
    assert bar["mean_signed_pct"] > 10
    assert error_bar.scale_of(513) == "over 512 GPUs" and error_bar.scale_of(512) == "9-512 GPUs"
    assert (
        error_bar.held_out("megatron-2022", "ampere", 64)["speed"]["scope"]
        == "megatron-2022 on ampere at 9-512 GPUs"
    )


def test_run_reports_its_error_bar():
    """The quickstart runs pytorch-2024 on A100: its bar is torchtitan's eight held-out A100 runs."""
    a100_runs = [
        c
        for c in load_cases(accuracy.HERE / "torchtitan-2024.yaml")
        if c["cluster"]["topology"] == "dgx-a100" and "gpu" not in c["cluster"]
    ]
    out = CliRunner().invoke(app, ["run", "quickstart", "--json"])
    assert out.exit_code == 0, out.output
    bar = json.loads(out.output)["accuracy"]["speed"]
    assert bar["scope"] == "pytorch-2024 on ampere"
    assert bar["n"] == len(a100_runs) == bar["sets"]["torchtitan-2024"] == 8
    table = CliRunner().invoke(app, ["run", "quickstart"])
    assert table.exit_code == 0, table.output
    assert "Held-out error, median / p90" in table.output
    assert "Speed error bar: pytorch-2024 on ampere, 8 measured runs never fitted on (torchtitan-2024 8)" in (
        " ".join(table.output.split())
    )


def test_a_profile_of_ones_own_has_no_error_bar():
    """The bar is the shipped profile's record: the same name with other factors (a calibrated copy) has none, and
    the table says so."""
    from simulator.api import simulate
    from simulator.report.table import error_bar_lines
    from simulator.scenario.shipped import shipped_scenarios

    shipped = simulate(shipped_scenarios()["quickstart-gpt3-1.3b-ddp-8xa100"])
    assert shipped.metrics.accuracy["speed"]["scope"] == "pytorch-2024 on ampere"
    mine = get_framework("pytorch-2024").model_copy(update={"gemm_efficiency": 0.5})
    m = simulate(shipped.scenario, framework=mine).metrics
    assert m.accuracy is None
    assert error_bar_lines(m)[0].startswith(
        "Error bar: none: the pytorch-2024 profile as run here has no held-out"
    )
