"""Periodic schedules: three short runs extrapolated give the metrics of replaying every micro-batch."""

import math

import pytest
from conftest import make

from simulator import simulate
from simulator.metrics.periodic import NotPeriodic, extrapolate, sample_windows, worth_it

# fields that describe the simulation itself, not the simulated iteration
NOT_COMPARED = {"wall_s", "tasks", "events", "periodic"}


def assert_same(a, b, path=""):
    """Every number equal to float rounding, everything else identical."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (path, a, b)
    else:
        assert a == b, path


LAYER8 = {
    "num_layers": 8,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "seq_length": 512,
    "vocab_size": 8000,
}
CASES = {
    "1f1b": ({"pipeline_parallel": 4, "data_parallel": 2, "pipeline_schedule": "1f1b"}, 32),
    "interleaved": (
        {
            "pipeline_parallel": 4,
            "data_parallel": 2,
            "pipeline_schedule": "interleaved-1f1b",
            "virtual_pipeline_stages": 2,
        },
        64,
    ),
    "gpipe": ({"pipeline_parallel": 2, "data_parallel": 4, "pipeline_schedule": "gpipe"}, 16),
    "zb-h1": ({"pipeline_parallel": 4, "data_parallel": 2, "pipeline_schedule": "zb-h1"}, 32),
    "deepspeed-zero1": (
        {"pipeline_parallel": 2, "data_parallel": 4, "pipeline_schedule": "deepspeed", "zero_stage": 1},
        16,
    ),
    "uneven-tp": (
        {
            "tensor_parallel": 2,
            "pipeline_parallel": 2,
            "data_parallel": 2,
            "pipeline_schedule": "1f1b",
            "first_pipeline_stage_layers": 3,
        },
        16,
    ),
    "ddp-accumulation": ({"data_parallel": 8}, 16),
    "zero2-accumulation": ({"data_parallel": 8, "zero_stage": 2}, 16),
    "zero3-accumulation": ({"data_parallel": 8, "zero_stage": 3}, 16),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("framework", ["ideal", "megatron-2022"])
def test_extrapolated_metrics_equal_replaying_every_microbatch(case, framework):
    parallelism, microbatches = CASES[case]
    dp = parallelism.get("data_parallel", 1)
    s = make(
        model=LAYER8,
        training={"global_batch_size": microbatches * dp, "micro_batch_size": 1},
        parallelism=parallelism,
        framework=framework,
    )
    full = simulate(s, periodic=False).metrics
    fast = simulate(s, periodic=True).metrics
    assert full.periodic is None
    u = max(parallelism.get("pipeline_parallel", 1), 2)
    # interleaved 1F1B's warm-up outgrows p micro-batches: its first window is not periodic yet, the next is;
    # sampled a pipeline depth apart (its chunks cycle in groups of p micro-batches). The rest repeat every
    # micro-batch from the p-th on: three runs a micro-batch apart.
    simulated = [u, 2 * u, 3 * u, 4 * u] if case == "interleaved" else [u, u + 1, u + 2]
    assert fast.periodic == {"microbatches": microbatches, "simulated": simulated}
    assert fast.tasks < full.tasks  # what was replayed, honestly
    a, b = full.to_dict(), fast.to_dict()
    for k in NOT_COMPARED:
        a.pop(k), b.pop(k)
    assert_same(a, b)


def test_sample_windows_only_where_they_save_work():
    """One, two and three times the pipeline depth, moved on by one depth twice, each window while its largest
    count is under half the micro-batches."""
    assert sample_windows(512, 64) == [(64, 128, 192)]
    assert sample_windows(385, 64) == [(64, 128, 192)]
    assert sample_windows(384, 64) == []
    assert sample_windows(100, 4) == [(4, 8, 12), (8, 12, 16), (12, 16, 20)]
    assert sample_windows(100, 1) == [(2, 4, 6), (4, 6, 8), (6, 8, 10)]
    # a schedule that repeats every micro-batch: a micro-batch apart, moved on by the depth
    assert sample_windows(512, 64, step=1) == [(64, 65, 66), (128, 129, 130), (192, 193, 194)]
    assert sample_windows(133, 64, step=1) == [(64, 65, 66)]
    assert sample_windows(132, 64, step=1) == []


def test_the_default_replays_periodically_only_where_that_costs_less():
    """``worth_it``: a window's runs, with 40 micro-batches' worth charged for each run, must add up to at most the
    micro-batches they stand for. 64 stages at 512 micro-batches: 64 + 128 + 192 + 3 x 40 = 504, kept; at 503
    not. 8 stages at 512: the three windows' five runs, 8 + 16 + ... + 40 + 5 x 40 = 320, all kept; at 128 not
    even the first (48 + 120 = 168). Runs a micro-batch apart: 64 + 65 + 66 + 3 x 40 = 315. Data parallelism
    with 16 micro-batches replays every one by default."""
    assert worth_it(512, sample_windows(512, 64)) == [(64, 128, 192)]
    assert worth_it(503, sample_windows(503, 64)) == []
    assert worth_it(512, sample_windows(512, 8)) == [(8, 16, 24), (16, 24, 32), (24, 32, 40)]
    assert worth_it(279, sample_windows(279, 8)) == [(8, 16, 24), (16, 24, 32)]
    assert worth_it(128, sample_windows(128, 8)) == []
    assert worth_it(315, sample_windows(315, 64, step=1)) == [(64, 65, 66)]
    assert worth_it(314, sample_windows(314, 64, step=1)) == []
    s = make(
        model=LAYER8,
        training={"global_batch_size": 128, "micro_batch_size": 1},
        parallelism={"data_parallel": 8},
    )
    assert s.gradient_accumulation_steps == 16 and simulate(s).metrics.periodic is None
    assert simulate(s, periodic=True).metrics.periodic["simulated"] == [2, 3, 4]


def test_extrapolation_is_linear_and_refuses_what_is_not():
    tree = lambda m: {"t": 2.0 + 0.5 * m, "n": 3 * m, "name": "x", "rows": [m, 7.0]}  # noqa: E731
    out = extrapolate([(k, tree(k)) for k in (4, 8, 12)], 100)
    assert out == {"t": 52.0, "n": 300, "name": "x", "rows": [100, 7.0]}
    with pytest.raises(NotPeriodic, match=r"\.t is not linear"):
        extrapolate([(k, {"t": float(k * k)}) for k in (4, 8, 12)], 100)
    with pytest.raises(NotPeriodic, match="differs"):
        extrapolate([(4, {"s": "a"}), (8, {"s": "a"}), (12, {"s": "b"})], 100)
    with pytest.raises(NotPeriodic, match="different entries"):
        extrapolate([(4, {"a": 1.0}), (8, {"a": 1.0}), (12, {"b": 1.0})], 100)


def test_the_stage_step_limit_binds_only_where_every_micro_batch_is_replayed(monkeypatch):
    """Issue 33 item 3: the 2^20 stage-step limit is on what is replayed one by one. A schedule the periodic replay
    covers simulates a few short runs, so a scenario past the nominal limit runs; asking for every micro-batch
    (periodic=False: --exact, a trace or a report) is refused with the arithmetic."""
    import simulator.api as api
    from simulator.errors import ScenarioError

    monkeypatch.setattr(api, "MAX_STAGE_MICROBATCHES", 200)  # 64 micro-batches x 4 stages = 256 > 200
    s = make(
        model=LAYER8,
        parallelism={"pipeline_parallel": 4, "data_parallel": 2, "pipeline_schedule": "1f1b"},
        training={"global_batch_size": 128, "micro_batch_size": 1},
    )
    r = simulate(s)
    assert r.metrics.periodic["microbatches"] == 64
    with pytest.raises(ScenarioError) as e:
        simulate(s, periodic=False)
    assert str(e.value) == (
        "training: 64 micro-batches x 4 pipeline chunks = 256 stage steps to replay one by one (a trace, report or "
        "--exact asks for every one); the simulator's limit is 200"
    )


def test_run_exact_replays_every_micro_batch_and_says_what_it_cost():
    import json

    from typer.testing import CliRunner

    from simulator.cli import app

    runner = CliRunner()
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    args = ["run", str(root / "scenarios" / "published" / "nar21-t1-1t.yaml"), "--quiet"]
    fast = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    exact = json.loads(runner.invoke(app, [*args, "--json", "--exact"]).stdout)
    assert fast["periodic"] and not exact.get("periodic")
    assert exact["iteration_time_s"] == pytest.approx(fast["iteration_time_s"], rel=1e-9)
    assert exact["tasks"] > fast["tasks"]
    r = runner.invoke(app, [*args, "--exact"])
    assert "exact: every one of the 512 micro-batches replayed" in r.stdout
