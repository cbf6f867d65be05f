"""Writes never replace what is at the target (issue 34 item 1): a character device or FIFO is written through,
a directory is refused with one line, a cost table's --out is a missing path, an empty directory or a table
directory (never a user's file renamed aside), and no hidden .old / .tmp file is left behind."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from test_importers import old_layout
from typer.testing import CliRunner

from simulator.cli import app

runner = CliRunner()
is_root = hasattr(os, "geteuid") and os.geteuid() == 0


def error_of(args: list[str]) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def char_device(tmp_path: Path) -> Path:
    """A character device to write to: a copy of /dev/null's node made with os.mknod in the test's directory
    as root (so a regression replaces a throwaway node, not the machine's /dev/null); /dev/null otherwise."""
    if not is_root:
        return Path("/dev/null")
    node = tmp_path / "null"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.stat("/dev/null").st_rdev)
    return node


def hidden_leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("option, name", [("--trace", "t.json"), ("--report", "r.html")])
def test_a_character_device_is_written_through_and_stays_a_device(tmp_path, option, name):
    device = char_device(tmp_path)
    r = runner.invoke(app, ["run", "quickstart", option, str(device), "--quiet"])
    assert r.exit_code == 0, r.output
    assert stat.S_ISCHR(os.stat(device).st_mode)
    assert hidden_leftovers(device.parent) == [] or device.parent == Path("/dev")


def test_a_fifo_receives_the_whole_trace(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = bytearray()

    def read() -> None:
        with open(fifo, "rb") as f:
            got.extend(f.read())

    reader = threading.Thread(target=read)
    reader.start()
    r = runner.invoke(app, ["run", "quickstart", "--trace", str(fifo), "--quiet"])
    reader.join(timeout=60)
    assert r.exit_code == 0, r.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert got.startswith(b'{"traceEvents"') and got.endswith(b"}")
    assert hidden_leftovers(tmp_path) == []


def test_a_directory_is_refused_before_anything_runs(tmp_path):
    assert (
        error_of(["run", "quickstart", "--trace", str(tmp_path)])
        == f"error: --trace {tmp_path}: is a directory"
    )


def nccl_log(tmp_path: Path) -> str:
    log = tmp_path / "all_reduce_perf.txt"
    log.write_text(old_layout([1024, 1 << 20]))
    return str(log)


def import_args(tmp_path: Path, out: Path) -> list[str]:
    return [
        "calibrate",
        "import",
        "nccl-tests",
        nccl_log(tmp_path),
        "--gpu",
        "a100-sxm4-80gb",
        "--out",
        str(out),
    ]


def test_a_table_out_that_is_a_file_or_device_is_refused_and_left_as_it_was(tmp_path):
    user_file = tmp_path / "notes.txt"
    user_file.write_text("mine")
    message = error_of(import_args(tmp_path, user_file))
    assert message.startswith(f"error: --out {user_file}: exists and is not a directory")
    assert user_file.read_text() == "mine" and hidden_leftovers(tmp_path) == []
    device = char_device(tmp_path)
    assert "exists and is not a directory" in error_of(import_args(tmp_path, device))
    assert stat.S_ISCHR(os.stat(device).st_mode)


def test_a_table_out_holding_other_files_is_refused_an_empty_one_taken(tmp_path):
    other = tmp_path / "work"
    other.mkdir()
    (other / "data.csv").write_text("1,2\n")
    assert error_of(import_args(tmp_path, other)) == (
        f"error: --out {other}: holds other files and no table.yaml: give a new or empty directory, or a table "
        "directory"
    )
    assert (other / "data.csv").read_text() == "1,2\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert runner.invoke(app, import_args(tmp_path, empty)).exit_code == 0
    assert (empty / "table.yaml").is_file()
    # adding to the table swaps a complete copy in and leaves nothing hidden beside it
    assert runner.invoke(app, import_args(tmp_path, empty)).exit_code == 0
    assert hidden_leftovers(tmp_path) == []


def test_an_import_into_a_broken_table_says_how_to_get_out(tmp_path):
    table = tmp_path / "t"
    assert runner.invoke(app, import_args(tmp_path, table)).exit_code == 0
    with open(table / "table.yaml", "a") as f:
        f.write("gpu: [\n")
    message = error_of(import_args(tmp_path, table))
    assert message.startswith(f"error: --out {table}: holds a table that cannot be read (")
    assert message.endswith("repair or delete that file, or write to a new directory")


def test_sweep_results_where_a_directory_sits_is_one_error_before_anything_runs(tmp_path):
    (tmp_path / "results.csv").mkdir()
    args = ["sweep", "quickstart", "--vary", "training.micro_batch_size=1,2", "--out", str(tmp_path)]
    assert error_of(args) == (
        f"error: --out {tmp_path}: results.csv there is not a regular file (the sweep writes its results to it)"
    )
    assert not (tmp_path / "points.jsonl").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_report_target_that_refuses_the_bytes_is_one_error_line_after_the_work(tmp_path):
    """Issue 63: /dev/full passes the up-front check (a character device is written through) and refuses the
    bytes: sweep --report and compare --report end with one error line and exit 2, no traceback; the sweep's
    points are kept and the line says where."""
    line = error_of(["compare", "quickstart", "quickstart", "--report", "/dev/full"])
    assert "output /dev/full: cannot write" in line
    out = tmp_path / "sw"
    sweep = ["sweep", "quickstart", "--vary", "training.micro_batch_size=1,2", "--out", str(out)]
    line = error_of([*sweep, "--report", "/dev/full"])
    assert "cannot write" in line and f"the sweep's points and results are in {out}" in line
    assert (out / "points.jsonl").is_file()
