"""Generated hostile inputs for the surfaces beyond scenario files (issue 34): cost-table directories, Kineto traces
(JSON and gzip), nccl-tests logs (text and JSON), the sweep's points.jsonl and sweep files, plan's arguments and
output targets. The contract is test_hostile.py's: exit 0, 2 (one ``error:`` line, nothing written) or 3, never a
traceback or a hang; and a character device given as an output is still one afterwards.

Default run: 25 examples per generator; ``pytest -m slow``: 1,000 each (7,000 cases)."""

from __future__ import annotations

import copy
import gzip
import json
import os
import stat
from pathlib import Path

import pytest
from conftest import TINY
from hypothesis import strategies as st
from test_hostile import HOSTILE as SHARED
from test_hostile import _dump, _fresh, _run, check_cli, mutated
from test_importers import gpu_trace, old_layout

FAST, SLOW = 25, 1000
HOSTILE = SHARED.map(copy.deepcopy)  # its sampled [] and {} are shared objects: a copy each time, or cycles
BASE = {"name": "hostile", **copy.deepcopy(TINY)}
TABLE_META = {"name": "t", "gpu": "a100-sxm4-80gb", "description": "d", "method": "m"}
KERNEL_HEADER = "op,dtype,m,n,k,batch,median_us,direction,repeats,spread_pct,host_us,name"
KERNEL_ROW = ["gemm", "bf16", "1024", "1024", "1024", "1", "50.0", "forward", "5", "", "", "x"]
COLL_HEADER = "op,ranks,nodes,ranks_per_node,bytes,median_us,repeats,spread_pct,dtype,algorithm,protocol"
COLL_ROW = ["all_reduce", "8", "1", "8", "1048576", "40.0", "20", "", "bf16", "", ""]
CELLS = st.one_of(
    st.sampled_from(
        ["", "0", "-1", "nan", "inf", "-inf", "1e400", "9" * 5000, "x", "[/x]", "\x00", '"', "1.5"]
    ),
    st.text(max_size=8).filter(lambda t: "\n" not in t and "\r" not in t),
)


def _scenario(d: Path, **extra) -> Path:
    return _dump({**BASE, **extra}, d / "s.yaml", "yaml")


@st.composite
def table_dirs(draw) -> dict:
    """table.yaml (mutated) and CSV rows with hostile cells."""
    rows = []
    for _ in range(draw(st.integers(0, 3))):
        row = list(draw(st.sampled_from([KERNEL_ROW, COLL_ROW])))
        for _ in range(draw(st.integers(1, 3))):
            row[draw(st.integers(0, len(row) - 1))] = draw(CELLS)
        rows.append(row)
    return {
        "meta": draw(st.one_of(mutated(TABLE_META), HOSTILE)),
        "rows": rows,
        "header": draw(st.booleans()),
    }


def table_case(work: Path, data) -> int:
    d = _fresh(work)
    t = d / "table"
    t.mkdir()
    (t / "table.yaml").write_text(json.dumps(data["meta"]))
    kernels = [",".join(json.dumps(c) if "," in c else c for c in r) for r in data["rows"] if r[1] != "8"]
    colls = [",".join(json.dumps(c) if "," in c else c for c in r) for r in data["rows"] if r[1] == "8"]
    (t / "kernels.csv").write_text("\n".join(([KERNEL_HEADER] if data["header"] else []) + kernels) + "\n")
    (t / "collectives.csv").write_text("\n".join([COLL_HEADER] + colls) + "\n")
    return check_cli(["run", str(_scenario(d)), "--quiet", "--json", "--kernels", str(t)], [])


@st.composite
def traces(draw) -> tuple[bytes, bool]:
    trace = gpu_trace()
    events = trace["traceEvents"]
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(events) - 1))
        keep = isinstance(events[i], dict) and events[i]
        events[i] = draw(
            st.one_of(mutated(events[i], ("dur", "ts", "args", "name")), HOSTILE) if keep else HOSTILE
        )
    if draw(st.booleans()):
        trace = draw(st.one_of(mutated({k: v for k, v in trace.items() if k != "traceEvents"}), HOSTILE))
        if isinstance(trace, dict) and draw(st.booleans()):
            trace["traceEvents"] = events
    raw = json.dumps(trace).encode()
    if draw(st.booleans()):
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw, draw(st.booleans())


def kineto_case(work: Path, data) -> int:
    raw, zipped = data
    d = _fresh(work)
    path = d / ("t.json.gz" if zipped else "t.json")
    path.write_bytes(gzip.compress(raw) if zipped else raw)
    out = d / "table"
    return check_cli(["calibrate", "import", "kineto", str(path), "--out", str(out)], [out])


@st.composite
def nccl_logs(draw) -> tuple[str, str]:
    if draw(st.booleans()):  # text: tokens of the table replaced
        lines = old_layout([8, 1024, 1 << 20]).splitlines()
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(lines) - 1))
            cells = lines[i].split()
            if cells:
                cells[draw(st.integers(0, len(cells) - 1))] = draw(CELLS)
            lines[i] = "  ".join(cells)
        return "all_reduce_perf.txt", "\n".join(lines)
    doc = {
        "args": ["./build/all_reduce_perf", "-b", "8"],
        "config": {"iterations": 20, "devices": [{"hostname": "a"}, {"hostname": "a"}]},
        "results": [{"size": 1024, "type": "float", "out_of_place": {"time": 12.5}}],
    }
    return "all_reduce.json", json.dumps(draw(st.one_of(mutated(doc), HOSTILE)))


def nccl_case(work: Path, data) -> int:
    name, text = data
    d = _fresh(work)
    (d / name).write_text(text, encoding="utf-8", errors="surrogatepass")
    out = d / "table"
    args = ["calibrate", "import", "nccl-tests", str(d / name), "--gpu", "a100-sxm4-80gb", "--out", str(out)]
    return check_cli(args, [out])


RECORD = {
    "key": "k",
    "assignment": {"training.micro_batch_size": 1},
    "status": "ok",
    "reason": "",
    "metrics": {},
}


@st.composite
def points_files(draw) -> bytes:
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["record", "hostile", "bytes"]))
        if kind == "record":
            lines.append(json.dumps(draw(mutated(RECORD)), default=str).encode())
        elif kind == "hostile":
            lines.append(json.dumps(draw(HOSTILE), default=str).encode())
        else:
            lines.append(draw(st.binary(max_size=40)).replace(b"\n", b" "))
    return b"\n".join(lines) + b"\n"


def points_case(work: Path, data) -> int:
    d = _fresh(work)
    out = d / "sw"
    out.mkdir()
    (out / "points.jsonl").write_bytes(data)
    args = ["sweep", str(_scenario(d)), "--vary", "training.micro_batch_size=1,2", "--out", str(out)]
    return check_cli([*args, "--workers", "1", "--quiet"], [])


SWEEP = {"base": "s.yaml", "vary": {"training.micro_batch_size": [1, 2]}, "out": "o", "zip": False}


def sweep_file_case(work: Path, data) -> int:
    d = _fresh(work)
    _scenario(d)
    here = os.getcwd()
    os.chdir(d)  # the file's out: and report: are relative to where the sweep runs
    try:
        return check_cli(
            ["sweep", str(_dump(data, d / "sweep.yaml", "yaml")), "--workers", "1", "--quiet"], []
        )
    finally:
        os.chdir(here)


PLAN_VALUES = st.one_of(
    st.sampled_from(
        [
            "0",
            "-1",
            "3",
            "8",
            "12",
            "16",
            "1e9",
            "nan",
            "x",
            "[/x]",
            "",
            "9" * 5000,
            "gpt3-125m",
            "1,2,4",
            "fp8",
        ]
    ),
    st.integers(-5, 64).map(str),
)


@st.composite
def plan_args(draw) -> tuple[bool, list[str]]:
    """From a model name, or from a scenario (a small MoE one: expert sizes that do not divide its 4 experts,
    sizes that divide nothing, issue 63 item 4)."""
    from_scenario = draw(st.booleans())
    if from_scenario:
        args = {"--gpus": "8"}
        keys = ["--gpus", "--ep", "--tp", "--pp", "--cp", "--mbs", "--top", "--precision", "--sharding"]
    else:
        args = {"--model": "gpt3-125m", "--gpus": "8", "--topology": "dgx-a100", "--global-batch-size": "16"}
        keys = [*args, "--seq", "--top", "--precision", "--tokens", "--price", "--attention"]
    for _ in range(draw(st.integers(1, 3))):
        args[draw(st.sampled_from(keys))] = draw(PLAN_VALUES)
    return from_scenario, [x for kv in args.items() for x in kv]


def plan_case(work: Path, data) -> int:
    from_scenario, args = data
    if from_scenario:
        from test_hostile_moe_gpu import MOE

        args = ["--scenario", str(_dump(MOE, _fresh(work) / "moe.yaml", "yaml")), *args]
    return check_cli(["plan", *args, "--top", "1", "--quiet", "--json"], [])


def _target(d: Path, kind: str) -> Path:
    if kind == "missing":
        return d / "out.json"
    if kind == "file":
        (d / "out.json").write_text("old")
        return d / "out.json"
    if kind == "dir":
        (d / "out.json").mkdir()
        return d / "out.json"
    if kind == "no parent":
        return d / "nowhere" / "out.json"
    if kind == "long":
        return d / ("a" * 300)
    if kind == "/dev/full" and Path("/dev/full").exists():
        return Path("/dev/full")
    if kind == "fifo-less device" and os.geteuid() == 0:
        os.mknod(d / "null", 0o666 | stat.S_IFCHR, os.stat("/dev/null").st_rdev)
        return d / "null"
    return Path("/dev/null")


def _target_args(d: Path, option: str) -> list[str]:
    """The command that writes to the target: run's --trace / --report, an import's --out, and the writers that
    write after the work (issue 63 item 5): a sweep's and a comparison's report, plan's scenarios."""
    if option == "--out":
        (d / "log.txt").write_text(old_layout([1024]))
        return ["calibrate", "import", "nccl-tests", str(d / "log.txt"), "--gpu", "a100-sxm4-80gb", "--out"]
    scenario = str(_scenario(d))
    if option == "sweep --report":
        vary = ["--vary", "training.micro_batch_size=1,2", "--workers", "1"]
        return ["sweep", scenario, *vary, "--out", str(d / "sweep"), "--quiet", "--report"]
    if option == "compare --report":
        return ["compare", scenario, scenario, "--quiet", "--report"]
    if option == "plan --write-scenario":
        return ["plan", "--scenario", scenario, "--top", "1", "--quiet", "--json", "--write-scenario"]
    return ["run", scenario, "--quiet", option]


def target_case(work: Path, data) -> int:
    option, kind = data
    d = _fresh(work)
    target = _target(d, kind)
    device = kind == "fifo-less device" or str(target) in ("/dev/null", "/dev/full")
    code = check_cli([*_target_args(d, option), str(target)], [])
    if device:
        assert stat.S_ISCHR(os.stat(target).st_mode), target
    assert not [p for p in d.iterdir() if p.name.endswith(".old")], list(d.iterdir())
    return code


TARGETS = st.tuples(
    st.sampled_from(
        ["--trace", "--report", "--out", "sweep --report", "compare --report", "plan --write-scenario"]
    ),
    st.sampled_from(
        ["missing", "file", "dir", "no parent", "long", "fifo-less device", "/dev/null", "/dev/full"]
    ),
)

GENERATORS = {
    "cost_table": (table_case, table_dirs()),
    "kineto": (kineto_case, traces()),
    "nccl_tests": (nccl_case, nccl_logs()),
    "points": (points_case, points_files()),
    "sweep_file": (sweep_file_case, st.one_of(mutated(SWEEP), HOSTILE)),
    "plan": (plan_case, plan_args()),
    "output_target": (target_case, TARGETS),
}


@pytest.fixture
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("surfaces")


@pytest.mark.parametrize("name", list(GENERATORS))
def test_hostile_surfaces_get_one_line_and_exit_2(name, work):
    _run(name, FAST, work, GENERATORS)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(GENERATORS))
def test_hostile_surfaces_nightly(name, work):
    _run(name, SLOW, work, GENERATORS)
