"""Every file a user hands in goes through one bounded reader (issue 34 items 2, 3 and 5): cost tables, Kineto
traces, nccl-tests logs and the sweep's points.jsonl fail as scenario files do, with one line naming the file
(and line) and the reason; importers skip or refuse rows a table cannot hold and say which."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
from test_importers import gpu_trace, old_layout
from test_output_targets import error_of
from typer.testing import CliRunner

from simulator.calibration.importers import kineto
from simulator.cli import app
from simulator.errors import ScenarioError
from simulator.tables.io import read_table

runner = CliRunner()
HUGE = "9" * 5000  # over Python's 4,300-digit limit for int(): ValueError in every YAML / JSON reader


def nccl_table(tmp_path: Path) -> Path:
    log = tmp_path / "all_reduce_perf.txt"
    log.write_text(old_layout([1024, 1 << 20]))
    out = tmp_path / "t"
    args = ["calibrate", "import", "nccl-tests", str(log), "--gpu", "a100-sxm4-80gb", "--out", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    return out


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            "all_reduce,inf,1,8,4096,20,20,,fp32,,",
            "line 4: column 'ranks': expected a finite number (got 'inf')",
        ),
        (
            "all_reduce,8,1,8,1e400,20,20,,fp32,,",
            "line 4: column 'bytes': expected a finite number (got '1e400')",
        ),
        (f"all_reduce,8,1,8,{HUGE},20,20,,fp32,,", "line 4: column 'bytes': expected a finite number"),
        (
            'all_reduce,8,1,8,"' + "9" * 200_000 + '",20,20,,fp32,,',
            "line 4: not readable CSV (field larger than",
        ),
    ],
    ids=["inf int", "1e400", "5000 digits", "200 kB field"],
)
def test_a_cost_table_cell_out_of_range_is_one_line_with_file_and_line(tmp_path, line, expected):
    table = nccl_table(tmp_path)
    with open(table / "collectives.csv", "a") as f:
        f.write(line + "\n")
    message = error_of(["run", "quickstart", "--kernels", str(table)])
    assert message.startswith(f"error: {table / 'collectives.csv'} {expected}"), message


@pytest.mark.parametrize("suffix", ["table.yaml", "scenario", "deepspeed"])
def test_an_integer_over_python_s_digit_limit_is_one_line_in_every_reader(tmp_path, suffix):
    if suffix == "table.yaml":
        table = nccl_table(tmp_path)
        with open(table / "table.yaml", "a") as f:
            f.write(f"x: {HUGE}\n")
        args, label = ["run", "quickstart", "--kernels", str(table)], f"{table / 'table.yaml'}"
    elif suffix == "scenario":
        path = tmp_path / "s.yaml"
        path.write_text(f"name: {HUGE}\n")
        args, label = ["run", str(path)], str(path)
    else:
        (tmp_path / "ds.json").write_text(f'{{"train_batch_size": {HUGE}}}')
        path = tmp_path / "s.yaml"
        path.write_text(
            "name: x\nmodel: {preset: gpt3-125m}\ncluster: {topology: dgx-a100}\n"
            "training: {global_batch_size: 8}\nparallelism: {}\ndeepspeed_config: ds.json\n"
        )
        args, label = ["run", str(path)], f"deepspeed_config: {tmp_path / 'ds.json'}"
    message = error_of(args)
    assert message.startswith(f"error: {label}: a number too long to read ("), message
    assert "digits" in message


def test_kineto_traces_are_bounded_in_size_nesting_and_numbers(tmp_path, monkeypatch):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert error_of(["calibrate", "import", "kineto", str(deep), "--out", str(tmp_path / "k")]) == (
        f"error: {deep}: nested too deep to read"
    )
    big = tmp_path / "big.json"
    big.write_text(f'{{"traceEvents": [{{"ph": "X", "dur": {HUGE}}}]}}')
    assert "a number too long to read" in error_of(
        ["calibrate", "import", "kineto", str(big), "--out", str(tmp_path / "k")]
    )
    # a small gzip that inflates past the limit is refused as it inflates, not after
    monkeypatch.setattr(kineto, "MAX_TRACE_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [], "pad": "' + b" " * (8 << 20) + b'"}'))
    assert bomb.stat().st_size < 64 << 10
    assert error_of(["calibrate", "import", "kineto", str(bomb), "--out", str(tmp_path / "k")]) == (
        f"error: {bomb}: inflates to more than 1 MiB (the limit)"
    )
    assert not (tmp_path / "k").exists()


def import_error(log: Path, tmp_path: Path) -> str:
    """The one error line of importing ``log`` as nccl-tests output (into a table under ``tmp_path``)."""
    out = str(tmp_path / "x")
    return error_of(["calibrate", "import", "nccl-tests", str(log), "--gpu", "a100-sxm4-80gb", "--out", out])


@pytest.mark.parametrize(
    "doc, expected",
    [
        (
            {"results": [{"size": 8, "out_of_place": {"time": 5}}], "args": 5},
            "a field of the wrong type (TypeError",
        ),
        (
            {"results": [{"size": 8, "out_of_place": {"time": 5}}], "config": {"iterations": "x"}},
            "a field of the wrong type (ValueError",
        ),
        (
            {"results": [{"size": 8, "out_of_place": {"time": 5}}], "config": {"iterations": 1e400}},
            "a field of the wrong type (OverflowError",
        ),
        (
            {"results": [{"size": 8, "out_of_place": {"time": 1e400}}]},
            "results[0]: size 8 B, time inf us: not finite; the file is refused",
        ),
        (
            {
                "results": [{"size": 8, "out_of_place": {"time": 5}}],
                "config": {"devices": [{"hostname": [1]}] * 2},
            },
            "a field of the wrong type (TypeError",
        ),
    ],
    ids=["args not a list", "iterations a word", "iterations inf", "time inf", "hostname a list"],
)
def test_nccl_tests_json_of_the_wrong_types_is_one_line(tmp_path, doc, expected):
    doc.setdefault("config", {}).setdefault("devices", [{"hostname": "a"}, {"hostname": "a"}])
    log = tmp_path / "all_reduce.json"
    log.write_text(json.dumps(doc).replace("Infinity", "1e400"))
    message = import_error(log, tmp_path)
    assert message.startswith(f"error: {log}: {expected}"), message


def test_an_infinite_time_in_an_nccl_tests_log_refuses_the_log_with_its_line(tmp_path):
    log = tmp_path / "all_reduce_perf.txt"
    text = old_layout([1024, 1 << 20]).splitlines()
    row = next(i for i, line in enumerate(text) if line.strip().startswith("1024 "))
    header = next(line for line in text if line.lstrip("#").split()[:2] == ["size", "count"])
    cells = text[row].split()
    cells[5 if "root" in header else 4] = "inf"
    text[row] = "  ".join(cells)
    log.write_text("\n".join(text) + "\n")
    message = import_error(log, tmp_path)
    assert message == f"error: {log} line {row + 1}: time 'inf' is not a finite number; the log is refused"


def test_a_kernel_row_with_a_nan_time_is_skipped_said_and_the_table_reads(tmp_path):
    trace = gpu_trace()
    kernels = [
        e for e in trace["traceEvents"] if e.get("cat") == "kernel" and not e["name"].startswith("nccl")
    ]
    kernels[0]["dur"] = float("nan")  # Python's json writes and reads NaN
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    out = tmp_path / "table"
    r = runner.invoke(
        app, ["calibrate", "import", "kineto", str(path), "--out", str(out), "--gpu", "a100-sxm4-80gb"]
    )
    assert r.exit_code == 0, r.output
    assert "row skipped: median_us is nan, not a finite number" in r.stderr
    table = read_table(out)
    assert table.kernels and all(math.isfinite(k.median_us) for k in table.kernels)


def test_a_corrupted_points_file_is_reported_by_line_and_those_points_run_again(tmp_path):
    out = tmp_path / "sw"
    args = ["sweep", "quickstart", "--vary", "training.micro_batch_size=1,2,4", "--out", str(out), "--quiet"]
    assert runner.invoke(app, args).exit_code == 0
    good = [json.loads(x) for x in (out / "points.jsonl").read_text().splitlines()]
    no_key, no_status, bad_metrics = dict(good[0], key=["x"]), dict(good[1]), dict(good[2], metrics=[1])
    del no_status["status"]
    lines = [json.dumps(no_key), json.dumps(no_status), json.dumps(bad_metrics)]
    (out / "points.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b'\xff\xfe\n[1, 2]\n{"key": \n')
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "3 points: 3 simulated, 0 already done" in r.stdout
    for expected in [
        "points.jsonl line 1: no key (a string)",
        "points.jsonl line 2: status None is not one of ok, oom, invalid, error",
        "points.jsonl line 3: metrics is not a mapping",
        "points.jsonl line 4: not UTF-8",
        "points.jsonl line 5: a list, not a record",
        "points.jsonl line 6: not a JSON record",
    ]:
        assert expected in r.stderr, r.stderr
    assert len((out / "points.jsonl").read_text().splitlines()) == 3  # the bad lines gone, each point once
    r = runner.invoke(app, args)
    assert "0 simulated, 3 already done" in r.stdout and "warning" not in r.stderr


def test_sweep_values_and_paths_a_results_file_cannot_hold_are_said_up_front(tmp_path):
    out = tmp_path / "o"
    big = 10**23
    message = error_of(["sweep", "quickstart", "--vary", f"model.vocab_size={big},50000", "--out", str(out)])
    assert (
        message
        == f"error: sweep: model.vocab_size: {big} is beyond a 64-bit integer (no scenario field is that large)"
    )
    assert not out.exists()
    markup = tmp_path / "m[/x]"
    r = runner.invoke(
        app, ["sweep", "quickstart", "--vary", "training.micro_batch_size=1", "--out", str(markup)]
    )
    assert r.exit_code == 0, r.output
    assert f"results: {markup}/results.csv" in r.stdout


def test_an_interrupt_while_the_results_are_written_says_how_to_rebuild_them(tmp_path, monkeypatch):
    from simulator.study import sweep

    def interrupted(rows, out):
        (out / "results.csv.tmp").write_text("half")
        raise KeyboardInterrupt

    out = tmp_path / "sw"
    args = [
        "sweep",
        "quickstart",
        "--vary",
        "training.micro_batch_size=1,2",
        "--out",
        str(out),
        "--workers",
        "1",
    ]
    monkeypatch.setattr(sweep, "write_results", interrupted)
    r = runner.invoke(app, args)
    assert r.exit_code == 130
    assert "interrupted while writing results.csv: run the same command again to rebuild it" in r.stdout
    assert not (out / "results.csv.tmp").exists() and not (out / "results.csv").exists()
    monkeypatch.undo()
    r = runner.invoke(app, args)
    assert r.exit_code == 0 and "0 simulated, 2 already done" in r.stdout
    assert len((out / "results.csv").read_text().splitlines()) == 3


def test_an_nccl_tests_import_records_the_gpu_the_log_names_and_refuses_another(tmp_path):
    """The rank lines name the device (issue 32 item 6): the table is labelled with it, --gpu naming another GPU
    is refused, and logs of two GPUs never go into one table."""
    from test_importers import new_layout

    a100, h100 = tmp_path / "all_reduce_perf.txt", tmp_path / "all_gather_perf.log"
    a100.write_text(old_layout([1024, 1 << 20]))  # "... device 0 [0x00] A100-SXM4-80GB"
    h100.write_text(new_layout([1024, 1 << 30]))  # "... NVIDIA H100 80GB HBM3"
    out = tmp_path / "t"
    r = runner.invoke(app, ["calibrate", "import", "nccl-tests", str(a100), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert read_table(out).meta.gpu == "a100-sxm4-80gb"
    args = ["calibrate", "import", "nccl-tests", str(h100), "--out", str(tmp_path / "u")]
    assert (
        error_of([*args, "--gpu", "a100-sxm4-80gb"])
        == "error: --gpu a100-sxm4-80gb: the logs were measured on h100-sxm5-80gb"
    )
    both = ["calibrate", "import", "nccl-tests", str(a100), str(h100), "--out", str(tmp_path / "v")]
    assert error_of(both) == (
        "error: the logs were measured on a100-sxm4-80gb, h100-sxm5-80gb: one table holds one GPU's rows"
    )


def test_a_cpu_trace_labelled_as_a_gpu_is_warned(tmp_path):
    trace = gpu_trace()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") != "kernel"]
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(trace))
    args = [
        "calibrate",
        "import",
        "kineto",
        str(path),
        "--out",
        str(tmp_path / "t"),
        "--gpu",
        "a100-sxm4-80gb",
    ]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert (
        "the trace has no GPU kernels (a CPU trace): its rows are CPU times, labelled a100-sxm4-80gb"
        in r.stderr
    )


def test_a_gzip_bomb_is_refused_by_its_ratio_before_it_fills_memory(monkeypatch):
    """Issue 63: a bomb was inflated to the 512 MiB limit before the refusal; now it stops once it has inflated
    GUNZIP_MAX_RATIO times what it consumed (past GUNZIP_RATIO_AFTER: 32 MiB; 1 MiB here), and a trace-like file
    inflating ten times passes."""
    from simulator.scenario import files

    monkeypatch.setattr(files, "GUNZIP_RATIO_AFTER", 1 << 20)
    monkeypatch.setattr(files, "_GUNZIP_STEP", 1 << 20)
    bomb = gzip.compress(b"\0" * (16 << 20))
    with pytest.raises(ScenarioError, match=r"times its compressed size \(over 300: a gzip bomb"):
        files.gunzip(bomb, "bomb.gz", 512 << 20)
    events = b",".join(b'{"name":"op%d","ph":"X","ts":%d,"dur":5}' % (i, i) for i in range(100_000))
    assert files.gunzip(gzip.compress(events), "t.gz", 512 << 20) == events
