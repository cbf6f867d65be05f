"""clustersim sweep: the grid, resuming, invalid points kept as rows, Dask giving the local results, the CLI."""

import copy
import csv
import json
from pathlib import Path

import pytest
import yaml
from conftest import TINY
from typer.testing import CliRunner

from simulator.cli import app
from simulator.errors import ScenarioError
from simulator.study import grid as sweep_grid
from simulator.study import sweep as sw

BASE = {"name": "tiny", **copy.deepcopy(TINY), "framework": "ideal"}


@pytest.fixture
def base_file(tmp_path) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(BASE))
    return path


def grid(**vary) -> sweep_grid.Sweep:
    return sweep_grid.Sweep(BASE, None, tuple(vary), tuple(tuple(v) for v in vary.values()))


def test_cartesian_and_zipped_grids():
    g = grid(**{"training.micro_batch_size": [1, 2], "cluster.num_nodes": [1, 2, 4]})
    assert g.size == 6 and len(list(g.assignments())) == 6
    a, b = "training.micro_batch_size", "cluster.num_nodes"
    z = sweep_grid.Sweep(BASE, None, (a, b), ((1, 2), (3, 4)), zipped=True)
    assert list(z.assignments()) == [{a: 1, b: 3}, {a: 2, b: 4}]
    with pytest.raises(ScenarioError, match="as many"):
        sweep_grid.Sweep(BASE, None, (a, b), ((1, 2), (3,)), zipped=True)


def test_a_varied_field_must_be_a_scenario_field():
    """A misspelt field would make every point invalid for the same reason: one error before anything runs."""
    with pytest.raises(
        ScenarioError,
        match=r"parallelism has no field 'tensor_paralel' \(did you mean "
        r"'parallelism.tensor_parallel'\?\)",
    ):
        grid(**{"parallelism.tensor_paralel": [1, 2]})
    with pytest.raises(ScenarioError, match="parallelism.zero has no field 'prefetch'"):
        grid(**{"parallelism.zero.prefetch": [1]})
    with pytest.raises(ScenarioError, match="the scenario has no field 'a'"):
        grid(**{"a.b": [1]})
    # every key path of every shipped scenario is a field (the loader's model.preset / model.hf_config too)
    shipped = Path(__file__).resolve().parents[1] / "scenarios"

    def paths(d, prefix=()):
        for k, v in d.items():
            yield (*prefix, k)
            if isinstance(v, dict):
                yield from paths(v, (*prefix, k))

    seen = 0
    for f in shipped.rglob("*.yaml"):
        for path in paths(yaml.safe_load(f.read_text()) or {}):
            sweep_grid.check_field(".".join(path))
            seen += 1
    assert seen > 500


def test_vary_values_are_read_as_yaml_and_bad_specs_name_the_problem():
    assert sweep_grid.parse_vary("parallelism.tensor_parallel=1,2, 4") == (
        "parallelism.tensor_parallel",
        (1, 2, 4),
    )
    assert sweep_grid.parse_vary("cluster.topology=dgx-a100,dgx-h100")[1] == ("dgx-a100", "dgx-h100")
    assert sweep_grid.parse_vary("training.cuda_graphs=true,false")[1] == (True, False)
    for bad in ("tensor_parallel", "=1,2", "a..b=1", "x.y="):
        with pytest.raises(ScenarioError, match="--vary"):
            sweep_grid.parse_vary(bad)


def test_a_model_name_means_a_preset_and_the_same_scenario_has_the_same_key():
    assert sweep_grid.assign(BASE, {"model": "gpt3-1.3b"})["model"] == {"preset": "gpt3-1.3b"}
    (same,) = sw.resolve(grid(**{"training.micro_batch_size": [2]}))
    (other,) = sw.resolve(grid(**{"training.global_batch_size": [16]}))  # the base's own value, spelled out
    assert same.key == other.key


def test_a_rerun_simulates_nothing_and_invalid_points_are_rows_with_their_reason(tmp_path):
    g = grid(**{"parallelism.tensor_parallel": [1, 3], "training.micro_batch_size": [1, 2]})
    g, dropped = sweep_grid.derived_data_parallel(g)
    assert dropped  # tensor_parallel is varied: data_parallel is derived at each point
    first, rows = sw.run_sweep(g, tmp_path, workers=1)
    assert (first.points, first.ran, first.skipped, first.failed) == (
        4,
        2,
        0,
        2,
    )  # invalid points are not simulated
    bad = [r for r in rows if r["status"] == "invalid"]
    assert len(bad) == 2 and all(
        "num_attention_heads (4) is not divisible by tensor_parallel (3)" in r["reason"] for r in bad
    )
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 2 and all(r["iteration_time_s"] > 0 and r["gpus"] == 8 for r in ok)
    again, rows2 = sw.run_sweep(g, tmp_path, workers=1)
    assert (again.ran, again.skipped) == (0, 4)
    assert rows2 == rows
    with open(tmp_path / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["status"] for r in table] == [r["status"] for r in rows]
    assert {"parallelism.tensor_parallel", "training.micro_batch_size", "mfu", "memory_gib.peak"} <= set(
        table[0]
    )


def test_results_parquet_holds_every_row(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    _, rows = sw.run_sweep(grid(**{"training.micro_batch_size": [1, 2]}), tmp_path, workers=1)
    t = pq.read_table(tmp_path / "results.parquet")
    assert t.num_rows == 2 and t.column("iteration_time_s").to_pylist() == [
        r["iteration_time_s"] for r in rows
    ]


def test_an_interrupted_sweep_keeps_what_it_finished(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = sw.simulate_point

    def stop_on_second(scenario):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(scenario)

    monkeypatch.setattr(sw, "simulate_point", stop_on_second)
    g = grid(**{"training.global_batch_size": [16, 32, 64]})
    out, rows = sw.run_sweep(g, tmp_path, workers=1)
    assert out.interrupted and out.ran == 1 and len(rows) == 1
    monkeypatch.setattr(sw, "simulate_point", real)
    resumed, rows = sw.run_sweep(g, tmp_path, workers=1)
    assert (resumed.ran, resumed.skipped, len(rows)) == (2, 1, 3)


def test_a_process_pool_gives_the_inline_results(tmp_path):
    g = grid(**{"training.micro_batch_size": [1, 2, 4]})
    _, inline = sw.run_sweep(g, tmp_path / "a", workers=1)
    _, pooled = sw.run_sweep(g, tmp_path / "b", workers=2)
    drop = {"wall_s"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in inline] == [
        {k: v for k, v in r.items() if k not in drop} for r in pooled
    ]


def test_a_dask_local_cluster_gives_the_local_results(tmp_path):
    pytest.importorskip("dask.distributed")
    g = grid(**{"training.micro_batch_size": [1, 2]})
    _, local = sw.run_sweep(g, tmp_path / "local", workers=1)
    _, on_dask = sw.run_sweep(g, tmp_path / "dask", workers=2, dask="local")
    drop = {"wall_s"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in local] == [
        {k: v for k, v in r.items() if k not in drop} for r in on_dask
    ]


def test_cli_sweep_json_resume_sweep_file_and_report(tmp_path, base_file):
    runner = CliRunner()
    args = ["sweep", str(base_file), "--vary", "training.micro_batch_size=1,2", "--out", str(tmp_path / "o")]
    r = runner.invoke(app, [*args, "--workers", "1", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) | {"files": []} == {
        "points": 2,
        "ran": 2,
        "skipped": 0,
        "failed": 0,
        "oom": 0,
        "interrupted": False,
        "files": [],
        "bad_records": [],
    }
    r = runner.invoke(app, [*args, "--workers", "1", "--json"])
    assert json.loads(r.output)["ran"] == 0
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump({"base": "base.yaml", "vary": {"cluster.num_nodes": [1, 2]}}))
    (tmp_path / "base.yaml").write_text(base_file.read_text())
    report = tmp_path / "r.html"
    r = runner.invoke(
        app, ["sweep", str(spec), "--out", str(tmp_path / "f"), "--workers", "1", "--report", str(report)]
    )
    assert r.exit_code == 0, r.output
    assert "2 points: 1 simulated, 0 already done, 1 invalid" in r.output and report.stat().st_size > 100_000
    assert "Pareto front" not in report.read_text()  # one GPU count simulated: no front against GPUs


def test_sweep_report_charts_what_the_study_varies(tmp_path):
    """A pipeline study (pipeline size, schedule, micro-batches) gets a pipeline-bubble chart per varied field;
    iteration time against GPUs (the Pareto front) only where the simulated points differ in GPU count."""
    from simulator.study.report import write_sweep_report

    def rows(field, values, gpus):
        return [
            {
                "status": "ok",
                field: v,
                "gpus": g,
                "iteration_time_s": 1.0 + v / 10,
                "bubble_fraction": 0.1 * v,
            }
            for v, g in zip(values, gpus, strict=True)
        ]

    pipe = tmp_path / "pipe.html"
    write_sweep_report(
        rows("parallelism.pipeline_parallel", [1, 2, 4], [8, 8, 8]),
        ["parallelism.pipeline_parallel"],
        pipe,
        "p",
    )
    text = pipe.read_text()
    assert "pipeline bubble (share of the step) vs parallelism.pipeline_parallel" in text
    assert "Pareto front" not in text
    scale = tmp_path / "scale.html"
    write_sweep_report(rows("cluster.num_nodes", [1, 2, 4], [8, 16, 32]), ["cluster.num_nodes"], scale, "s")
    text = scale.read_text()
    assert "Pareto front" in text and "pipeline bubble" not in text


def test_a_sweep_files_base_may_name_a_shipped_scenario(tmp_path):
    """``base: quickstart`` in a sweep file takes the shipped scenario, as ``run quickstart`` and
    ``sweep quickstart`` do, where no file of that name sits beside the sweep file; one that does is taken first."""
    from simulator.study.grid import load_sweep_file

    spec = tmp_path / "sweep.yaml"
    spec.write_text("base: quickstart\nvary: {training.micro_batch_size: [1, 2]}\n")
    sweep, _ = load_sweep_file(spec)
    assert sweep.base["name"] == "gpt3-1.3b-ddp-8xa100" and sweep.values == ((1, 2),)
    (tmp_path / "quickstart").write_text("name: mine\nmodel: {preset: gpt3-125m}\n")
    assert load_sweep_file(spec)[0].base["name"] == "mine"
    spec.write_text("base: no-such-scenario\nvary: {training.micro_batch_size: [1]}\n")
    r = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "no-such-scenario: no such file, and no shipped scenario" in r.output
    spec.write_text(
        "base: " + "x" * 300 + "\nvary: {training.micro_batch_size: [1]}\n"
    )  # a name the system refuses
    r = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "base: name too long" in r.output


def test_cli_sweep_bad_input_is_one_line_and_exit_2(tmp_path, base_file):
    runner = CliRunner()
    cases = [
        (["sweep", str(base_file), "--vary", "tensor_parallel", "--out", str(tmp_path / "o")], "FIELD=v1,v2"),
        (["sweep", str(base_file), "--vary", "training.micro_batch_size=1"], "--out"),
        (["sweep", str(base_file), "--out", str(tmp_path)], "no vary"),
        (
            ["sweep", str(base_file), "--vary", "training.micro_batch_size=1", "--out", str(base_file)],
            "not a directory",
        ),
        (
            ["sweep", str(base_file), "--vary", "training.micro_bs=1", "--out", str(tmp_path / "o")],
            "did you mean",
        ),
        (
            [
                "sweep",
                str(base_file),
                "--vary",
                "training.micro_batch_size=1",
                "--out",
                str(tmp_path / "o"),
                "--report",
                "/nonexistent/r.html",
            ],
            "does not exist",
        ),
    ]
    for args, message in cases:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output and "Traceback" not in r.output


def test_ctrl_c_under_dask_saves_the_finished_points_and_prints_no_worker_tracebacks(tmp_path):
    """Issue 34 item 5: Ctrl-C reaches the whole process group; the Dask workers start with SIGINT ignored and the
    sweep alone stops the cluster, so stderr holds no worker traceback or distributed warning, the exit status
    is 130 and every finished point is in points.jsonl (a run resumes from it)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("dask.distributed")
    out = tmp_path / "sw"
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "  # as a terminal's shell does
        "from simulator.cli import main; sys.argv = ['clustersim'] + sys.argv[1:]; main()"
    )
    vary = [
        "--vary",
        "training.global_batch_size=2048,4096,8192,16384",
        "--vary",
        "cluster.nic_bandwidth_gbps=" + ",".join(str(100 * k) for k in range(1, 41)),
    ]
    args = [
        sys.executable,
        "-c",
        code,
        "sweep",
        "llama3-405b-4d-cp1-16384xh100",
        *vary,
        "--out",
        str(out),
        "--dask",
        "local",
        "--workers",
        "2",
        "--quiet",
    ]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    points = out / "points.jsonl"
    # a bound for a hung sweep only, not a timing: a loaded machine may take minutes to start the Dask cluster
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not (points.exists() and len(points.read_text().splitlines()) >= 3):
        if proc.poll() is not None:  # it ended on its own: the assertions below say how
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr and "distributed" not in stderr, stderr
    assert "interrupted: every finished point is saved" in stdout
    done = len(points.read_text().splitlines())
    assert 3 <= done < 160


def test_sweep_report_plots_grid_values_on_categorical_axes_in_grid_order():
    """Issue 32 item 5: each varied field is a categorical axis in the grid's order (numbers by value), so 100 and
    3,200 Gb/s sit evenly beside the values between instead of at a numeric axis's ends."""
    from simulator.study.report import metric_figures

    rows = [
        {
            "status": "ok",
            "cluster.nic_bandwidth_gbps": bw,
            "training.micro_batch_size": mbs,
            "iteration_time_s": 1.0 / bw,
        }
        for bw in (3200, 100, 400, 12.5)
        for mbs in (2, 1)
    ]
    figs = metric_figures(rows, ["cluster.nic_bandwidth_gbps", "training.micro_batch_size"])
    first = figs[0]
    assert first.layout.xaxis.type == "category"
    assert list(first.layout.xaxis.categoryarray) == ["12.5", "100", "400", "3200"]
    assert {x for trace in first.data for x in trace.x} == {"12.5", "100", "400", "3200"}
    assert list(figs[1].layout.xaxis.categoryarray) == ["1", "2"]


def test_the_traceback_of_an_interrupted_dask_sync_is_dropped_and_nothing_else():
    """distributed's ``sync`` schedules ``cancel`` on Ctrl-C; when the interrupt lands before its future exists
    the callback raises NameError, which tornado logs with a traceback (the race the Ctrl-C test above met)."""
    import logging

    from simulator.study.sweep import _interrupted_sync

    def record(error):
        return logging.LogRecord(
            "tornado.application",
            logging.ERROR,
            "",
            0,
            "Exception in callback",
            (),
            (type(error), error, None),
        )

    late = NameError("cannot access free variable 'future' where it is not associated with a value")
    assert not _interrupted_sync(record(late))
    assert _interrupted_sync(record(NameError("name 'x' is not defined")))
    assert _interrupted_sync(record(ValueError("future")))
    assert _interrupted_sync(
        logging.LogRecord("tornado.application", logging.ERROR, "", 0, "plain", (), None)
    )
