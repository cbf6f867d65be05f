"""`clustersim calibrate kernels` on the CPU: the round trip table -> run, resuming, and the collectives runner.
Needs PyTorch (the optional `calibrate` extra); skipped without it. GPU runs use the same code with CUDA events."""

import json

import pytest
from typer.testing import CliRunner

from simulator.api import simulate
from simulator.cli import app
from simulator.scenario.loader import load_scenario
from simulator.tables.format import CostTable
from simulator.tables.io import read_table, write_table
from simulator.tables.lookup import table_pass

torch = pytest.importorskip("torch")
runner = CliRunner()
# CPU tables used for an A100 scenario warn that they were measured elsewhere; the first test checks it
pytestmark = pytest.mark.filterwarnings("ignore:--kernels .* kernels measured on cpu")

TINY = """
name: tiny-gpt
framework: ideal
model: {num_layers: 2, hidden_size: 128, num_attention_heads: 4, seq_length: 64, vocab_size: 512}
cluster: {topology: dgx-a100, num_nodes: 1, gpus_per_node: GPUS}
training: {global_batch_size: 2, micro_batch_size: 2, precision: fp32}
parallelism: {tensor_parallel: GPUS}
"""


def scenario(tmp_path, gpus=1):
    path = tmp_path / f"tiny{gpus}.yaml"
    path.write_text(TINY.replace("GPUS", str(gpus)))
    return path


def calibrate(tmp_path, path, *extra):
    out = tmp_path / "table"
    r = runner.invoke(
        app,
        ["calibrate", "kernels", str(path), "--out", str(out), "--device", "cpu", "--repeats", "3", *extra],
    )
    assert r.exit_code == 0, r.output
    return out, r.output


def test_calibrated_table_makes_compute_measured_and_the_iteration_follows_its_rows(tmp_path):
    path = scenario(tmp_path)
    out, text = calibrate(tmp_path, path, "--no-collectives")
    table = read_table(out)
    assert table.meta.gpu == "cpu" and table.kernels and "measured now" in text
    s = load_scenario(path).model_copy(update={"kernels": str(out)})
    with pytest.warns(UserWarning, match="kernels measured on cpu"):
        r = simulate(s)
    assert r.metrics.cost_sources["compute"]["measured"] >= 0.95
    # one GPU, no communication: the iteration is the sum, over every kernel run, of its row plus a launch gap
    rows = {(k.op, k.direction, k.m, k.n, k.k, k.batch): k.seconds for k in table.kernels}
    launch = r.cluster.gpu.kernel_launch_s
    expected = 0.0
    for t in r.program.tasks:
        for op in t.ops:
            key = (op.kernel, table_pass(op.kernel, op.direction), op.m, op.n, op.k, op.batch)
            expected += rows[key] + launch if key in rows else r.compute.op_time_s(op)
    assert r.metrics.iteration_time_s == pytest.approx(expected, rel=1e-9)
    # the same table with every kernel twice as slow: the compute time follows (a table ignored would not)
    slow = CostTable(
        table.meta, [k.__class__(**{**k.__dict__, "median_us": 2 * k.median_us}) for k in table.kernels], []
    )
    write_table(tmp_path / "slow", slow)
    r2 = simulate(s.model_copy(update={"kernels": str(tmp_path / "slow")}))
    measured = sum(rows.values())
    assert r2.metrics.iteration_time_s > r.metrics.iteration_time_s + 0.5 * measured


def test_a_second_run_resumes_and_measures_nothing_again(tmp_path):
    path = scenario(tmp_path)
    out, _ = calibrate(tmp_path, path, "--no-collectives")
    before = read_table(out).kernels
    _, text = calibrate(tmp_path, path, "--no-collectives")
    assert "(0 measured now" in text
    assert read_table(out).kernels == before


def test_collectives_are_timed_in_one_process_per_rank(tmp_path):
    path = scenario(tmp_path, gpus=2)
    out, _ = calibrate(tmp_path, path)
    colls = read_table(out).collectives
    assert colls and {(c.op, c.ranks, c.nodes) for c in colls} == {("all_reduce", 2, 1)}
    tp_bytes = {c.bytes for c in colls}
    assert 2 * 64 * 128 * 4 in tp_bytes  # the TP all-reduce of one b x s x h fp32 activation
    # a CPU table's collectives describe loopback gloo, not the DGX: runs keep modelling them
    r = simulate(load_scenario(path).model_copy(update={"kernels": str(out)}))
    assert "collectives measured with cpu" in " ".join(r.metrics.cost_tables["notes"])


def test_without_pytorch_the_command_says_how_to_get_it(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_torch(name, *a, **k):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    r = runner.invoke(
        app,
        ["calibrate", "kernels", str(scenario(tmp_path)), "--out", str(tmp_path / "t"), "--device", "cpu"],
    )
    assert r.exit_code == 2 and "pip install 'clustersim[calibrate]'" in r.output


def test_json_of_a_calibrated_run_names_the_table(tmp_path):
    path = scenario(tmp_path)
    out, _ = calibrate(tmp_path, path, "--no-collectives")
    r = runner.invoke(app, ["run", str(path), "--kernels", str(out), "--json"])
    assert r.exit_code == 0
    d = json.loads(r.stdout)  # the calibrated table over the shipped one of the GPU
    assert d["cost_tables"]["table"] == f"{out} over a100-sxm4-80gb"
    assert d["cost_sources"]["compute"]["measured"] >= 0.95
    r = runner.invoke(app, ["run", str(path), "--kernels-only", str(out), "--json"])
    d = json.loads(r.stdout)
    assert d["cost_tables"]["table"] == str(out) and d["cost_sources"]["compute"]["measured"] >= 0.95


def test_the_estimate_is_said_before_and_a_budget_stops_new_shapes(tmp_path):
    """Issue 32 item 7: before the first shape is timed the command says how many there are and about how long
    they take here (a probe of the device's matmul and copy rates); --budget stops starting new shapes once
    spent, saves what is done and says how many are left; a later run goes on from the table."""
    path = scenario(tmp_path)
    out = tmp_path / "t"
    args = ["calibrate", "kernels", str(path), "--out", str(out), "--device", "cpu", "--repeats", "1"]
    r = runner.invoke(app, [*args, "--no-collectives", "--budget", "0.001s"])
    assert r.exit_code == 0, r.output
    said = " ".join(r.stderr.split())  # the console wraps at its width
    assert (
        " shapes to time on cpu (0 kept from before): about " in said and "--budget 0.001s stops it" in said
    )
    assert "--budget 0.001s spent: " in said and " shapes left, saved so far" in said
    left = int(said.split("--budget 0.001s spent: ")[1].split()[0])
    shapes = int(said.split()[0])
    assert 0 < left < shapes  # one shape was timed before the budget was checked again
    r = runner.invoke(app, [*args, "--no-collectives"])
    assert r.exit_code == 0 and f"({left} measured now, {shapes - left} kept from before)" in r.stdout


def test_durations_read_as_people_write_them():
    from simulator.cli.calibrate import parse_duration
    from simulator.errors import ScenarioError

    assert [parse_duration(x, "--budget") for x in ("90s", "10m", "1h30m", "2h", "45", "0.5m")] == [
        90,
        600,
        5400,
        7200,
        45,
        30,
    ]
    for bad in ("", "soon", "10x", "0s", "40d"):
        with pytest.raises(ScenarioError, match="--budget"):
            parse_duration(bad, "--budget")


def test_ctrl_c_inside_a_shape_keeps_its_finished_samples_as_a_row(tmp_path, monkeypatch):
    """Issue 32 item 7: Ctrl-C during a shape's timed calls keeps the samples already taken (the row says how
    many), saves the table and stops; the next run goes on from the shapes after it."""
    from simulator.calibration import torch_ops

    calls = {"n": 0}
    real = torch_ops.kernel_call

    def flaky(*args, **kw):
        fn = real(*args, **kw)

        def call():
            calls["n"] += 1
            if calls["n"] == torch_ops.WARMUP + 3 + 1:  # the 4th timed call of the first shape
                raise KeyboardInterrupt
            return fn()

        return call

    monkeypatch.setattr(torch_ops, "kernel_call", flaky)
    path = scenario(tmp_path)
    out = tmp_path / "t"
    args = ["calibrate", "kernels", str(path), "--out", str(out), "--device", "cpu", "--repeats", "5"]
    r = runner.invoke(app, [*args, "--no-collectives"])
    assert r.exit_code == 130, r.output
    assert "interrupted: what was measured is saved" in " ".join(r.stderr.split())
    from simulator.tables.io import read_table

    rows = read_table(out).kernels
    assert len(rows) == 1 and rows[0].repeats == 3 and rows[0].median_us > 0


def test_a_grouped_gemm_shape_runs_every_experts_rows_by_its_own_weights():
    from simulator.calibration.importers.kineto import KINDS
    from simulator.calibration.torch_ops import kernel_call

    out = kernel_call("grouped_gemm", "forward", "fp32", 16, 24, 32, 4, "cpu")()
    assert tuple(out.shape) == (4 * 16, 24)  # 4 experts x 16 rows, each [16, 32] @ [32, 24]
    with pytest.raises(ValueError, match="grouped GEMM"):
        kernel_call("grouped_gemm", "forward", "fp8", 16, 24, 32, 4, "cpu")
    # a profiler trace's torch._grouped_mm becomes the same row: [rows, k] x [experts, k, n] -> m = rows / experts
    kind, _, shape_of = KINDS["aten::_grouped_mm"]
    assert (kind, shape_of([[64, 32], [4, 32, 24], [4]])) == ("grouped_gemm", (16, 24, 32, 4))
