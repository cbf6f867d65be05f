"""Importers: a PyTorch profiler trace recorded here (and the GPU form of the format), nccl-tests logs in both
column layouts, with MPI prefixes and as JSON; bad input is one line naming the file and line, exit code 2."""

import gzip
import json
import statistics

import pytest
from typer.testing import CliRunner

from simulator.calibration.importers import match_gpu
from simulator.calibration.importers.kineto import import_trace
from simulator.calibration.importers.nccl_tests import parse_nccl_tests
from simulator.cli import app
from simulator.errors import ScenarioError
from simulator.tables.io import read_table

runner = CliRunner()


# -- PyTorch profiler -----------------------------------------------------------------------------------------------
def record_cpu_trace(path):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    x = torch.randn(64, 128, requires_grad=True)
    w1, w2 = torch.randn(512, 128, requires_grad=True), torch.randn(128, 512, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            h = F.layer_norm(x, (128,))
            h = F.gelu(F.linear(h, w1))  # 64x128 @ 128x512
            y = F.linear(h, w2)  # 64x512 @ 512x128
            F.cross_entropy(y, torch.zeros(64, dtype=torch.long)).backward()
    prof.export_chrome_trace(str(path))


def test_a_cpu_trace_recorded_by_torch_profiler_becomes_kernel_rows(tmp_path):
    trace = tmp_path / "trace.json"
    record_cpu_trace(trace)
    kernels, colls, info = import_trace(trace)
    by = {(k.op, k.direction, k.m, k.n, k.k): k for k in kernels}
    assert ("gemm", "forward", 64, 512, 128) in by and ("gemm", "forward", 64, 128, 512) in by
    assert ("layernorm", "forward", 64, 128, 0) in by and ("layernorm", "backward", 64, 128, 0) in by
    assert ("gelu", "forward", 64, 512, 0) in by and ("cross_entropy", "forward", 64, 128, 0) in by
    assert any(k.op == "gemm" and k.direction == "backward" for k in kernels)  # under autograd
    # a row's time is the median of that op's durations in the trace (a CPU trace: the op ran on the CPU)
    events = json.loads(trace.read_text())["traceEvents"]
    durs = [
        e["dur"] for e in events if e.get("name") == "aten::native_layer_norm" and e.get("cat") == "cpu_op"
    ]
    assert by[("layernorm", "forward", 64, 128, 0)].median_us == pytest.approx(statistics.median(durs))
    assert by[("layernorm", "forward", 64, 128, 0)].repeats == 3
    assert not colls and info["gpu_trace"] is False
    # gzipped, through the command line
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(trace.read_bytes()))
    r = runner.invoke(app, ["calibrate", "import", "kineto", str(gz), "--out", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output
    table = read_table(tmp_path / "t")
    assert table.meta.gpu == "cpu" and len(table.kernels) == len(kernels)


def gpu_trace() -> dict:
    """The GPU form of a Kineto trace: CPU ops, the runtime launches under them, kernels with the launching op's
    External id, and NCCL's kernel under PyTorch's record_param_comms."""

    def op(name, ts, dur, ext, dims=None, tid=1, **args):
        a = {"External id": ext, "Input Dims": dims or [], "Input type": ["c10::BFloat16"] * 3, **args}
        return {
            "ph": "X",
            "cat": "cpu_op",
            "name": name,
            "pid": 1,
            "tid": tid,
            "ts": ts,
            "dur": dur,
            "args": a,
        }

    def kernel(name, ts, dur, ext):
        return {
            "ph": "X",
            "cat": "kernel",
            "name": name,
            "pid": 0,
            "tid": 7,
            "ts": ts,
            "dur": dur,
            "args": {"External id": ext, "correlation": ext},
        }

    comms = {
        "Collective name": "allreduce",
        "In msg nelems": 1048576,
        "Out msg nelems": 1048576,
        "Group size": 8,
        "dtype": "BFloat16",
    }
    events = [
        op("aten::linear", 0, 50, 1, [[2048, 4096], [12288, 4096], []]),
        op("aten::addmm", 5, 40, 2, [[12288], [2048, 4096], [4096, 12288], [], []]),
        kernel("sm80_xmma_gemm_bf16bf16_bf16f32", 30, 700.0, 2),
        op("aten::addmm", 800, 30, 3, [[12288], [2048, 4096], [4096, 12288], [], []]),
        kernel("sm80_xmma_gemm_bf16bf16_bf16f32", 900, 720.0, 3),
        op("aten::native_layer_norm", 2000, 20, 4, [[2048, 4096], [], [4096], [4096], []]),
        kernel("vectorized_layer_norm_kernel", 2010, 15.0, 4),
        op("c10d::allreduce_", 3000, 60, 5, [[[1048576]]]),
        op("record_param_comms", 3005, 50, 6, [[1048576]], **comms),
        op("nccl:all_reduce", 3010, 40, 7, [[1048576]]),
        kernel(
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 3050, 85.0, 7
        ),
        op("aten::copy_", 4000, 5, 8, [[10], [10]]),
        kernel("elementwise_copy_kernel", 4001, 2.0, 8),
    ]
    return {"deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}], "traceEvents": events}


def test_a_gpu_trace_maps_kernels_to_their_aten_op_and_nccl_kernels_to_collective_rows(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(gpu_trace()))
    kernels, colls, info = import_trace(path, nodes=1)
    gemm = next(k for k in kernels if k.op == "gemm")
    assert (gemm.m, gemm.n, gemm.k, gemm.dtype) == (2048, 12288, 4096, "bf16")
    assert (
        gemm.median_us == pytest.approx(710.0) and gemm.repeats == 2 and gemm.host_us == pytest.approx(35.0)
    )
    (ln,) = [k for k in kernels if k.op == "layernorm"]
    assert (ln.m, ln.n, ln.median_us, ln.host_us) == (2048, 4096, 15.0, 20.0)
    (ar,) = colls
    assert (ar.op, ar.ranks, ar.nodes, ar.ranks_per_node, ar.bytes) == ("all_reduce", 8, 1, 8, 2 * 1048576)
    assert (ar.median_us, ar.algorithm, ar.protocol) == (85.0, "ring", "LL")
    assert info["skipped"] == {"aten::copy_": 1}  # not a table kind: reported, not guessed
    assert match_gpu(info["device"]["name"]) == "a100-sxm4-80gb"


def test_a_truncated_or_foreign_trace_is_one_error_naming_the_file(tmp_path):
    good = json.dumps(gpu_trace())
    (tmp_path / "cut.json").write_text(good[: len(good) // 2])
    with pytest.raises(ScenarioError, match=r"cut.json: not valid JSON: line 1: .*truncated"):
        import_trace(tmp_path / "cut.json")
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(good.encode())[:100])
    with pytest.raises(ScenarioError, match="truncated or corrupt gzip"):
        import_trace(tmp_path / "cut.json.gz")
    odd = {
        "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": "soon", "dur": 1, "tid": 1}]
    }
    (tmp_path / "odd.json").write_text(json.dumps(odd))
    with pytest.raises(ScenarioError, match="odd.json: an event is not in the profiler's format"):
        import_trace(tmp_path / "odd.json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    r = runner.invoke(
        app, ["calibrate", "import", "kineto", str(tmp_path / "other.json"), "--out", str(tmp_path / "t")]
    )
    assert r.exit_code == 2 and "no 'traceEvents' list" in r.output and not (tmp_path / "t").exists()


# -- nccl-tests -----------------------------------------------------------------------------------------------------
def alpha_beta_us(size: float, n: int) -> float:
    return 20.0 + 2 * (n - 1) / n * size / 200e3  # 20 us + ring all-reduce at 200 GB/s busbw


def old_layout(sizes, n=8) -> str:
    """nccl-tests before 2.13: no root column, float 'error' column, 'Pid' rank lines without 'Group'."""
    lines = [
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 validation: 1 ",
        "#",
        "# Using devices",
        *[
            f"#   Rank {r:2d} Pid  4242{r} on     node01 device {r:2d} [0x{r:02x}] A100-SXM4-80GB"
            for r in range(n)
        ],
        "#",
        "#                                                       out-of-place                       in-place          ",
        "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error",
        "#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ",
    ]
    for s in sizes:
        t = alpha_beta_us(s, n)
        lines.append(
            f"{s:12d}  {s // 4:12d}     float     sum  {t:7.2f}  {s / t / 1e3:6.2f}  {0:6.2f}  0e+00  {t:7.2f}  0.00  0.00  0e+00"
        )
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 99.0 ", "#"]
    return "\n".join(lines) + "\n"


def new_layout(sizes, n=16, hosts=2, prefix=True) -> str:
    """nccl-tests 2.13+: a root column and '#wrong'; mpirun --tag-output prefixes on every line."""
    lines = [
        "# nccl-tests version 2.14.1 nccl-headers=22304 nccl-library=22304",
        "# Collective test starting: all_gather_perf",
        "# nThread 1 nGpus 1 minBytes 1024 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 50 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
        *[
            f"#  Rank {r:2d} Group  0 Pid  1000{r} on     node{r // (n // hosts):02d} device {r % (n // hosts):2d} [0000:07:00] NVIDIA H100 80GB HBM3"
            for r in range(n)
        ],
        "#",
        "#                                                              out-of-place                       in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ",
    ]
    for s in sizes:
        t = alpha_beta_us(s, n) / 2
        lines.append(
            f"{s:12d}  {s // 2:12d}      half    none      -1  {t:7.2f}  1.00  1.00       0  {t:7.2f}  1.00  1.00       0"
        )
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 99.0 "]
    tag = [f"[1,{i % 4}]<stdout>:" for i in range(len(lines))] if prefix else [""] * len(lines)
    return "\n".join(t + line for t, line in zip(tag, lines, strict=True)) + "\n"


def test_nccl_tests_logs_in_both_column_layouts_become_collective_rows(tmp_path):
    sizes = [8, 1024, 1 << 20, 1 << 27]
    old = tmp_path / "all_reduce_perf.txt"
    old.write_text(old_layout(sizes))
    rows = parse_nccl_tests(old)
    assert [(r.op, r.ranks, r.nodes, r.ranks_per_node, r.repeats) for r in rows] == [
        ("all_reduce", 8, 1, 8, 20)
    ] * 4
    assert [r.bytes for r in rows] == sizes
    assert [r.median_us for r in rows] == pytest.approx([round(alpha_beta_us(s, 8), 2) for s in sizes])
    new = tmp_path / "ag.log"
    new.write_text(new_layout([1024, 1 << 30]))
    rows = parse_nccl_tests(new)  # op from 'Collective test starting', 2 hosts from the rank lines
    assert [(r.op, r.ranks, r.nodes, r.ranks_per_node, r.dtype, r.repeats) for r in rows] == [
        ("all_gather", 16, 2, 8, "fp16", 50)
    ] * 2
    assert rows[1].median_us == pytest.approx(round(alpha_beta_us(1 << 30, 16) / 2, 2))


def test_nccl_tests_json_output_is_read(tmp_path):
    doc = {
        "version": 3,
        "args": ["./build/reduce_scatter_perf", "-b", "8", "-e", "1G", "-J", "rs.json"],
        "config": {"iterations": 20, "devices": [{"rank": r, "hostname": f"h{r // 4}"} for r in range(8)]},
        "results": [
            {"size": 4096, "count": 1024, "type": "float", "out_of_place": {"time": 25.5, "alg_bw": 0.1}},
            {
                "size": 1 << 26,
                "count": 1 << 24,
                "type": "float",
                "out_of_place": {"time": 700.0, "alg_bw": 96},
            },
        ],
    }
    path = tmp_path / "rs.json"
    path.write_text(json.dumps(doc))
    rows = parse_nccl_tests(path)
    assert [(r.op, r.ranks, r.nodes, r.ranks_per_node, r.bytes, r.median_us) for r in rows] == [
        ("reduce_scatter", 8, 2, 4, 4096, 25.5),
        ("reduce_scatter", 8, 2, 4, 1 << 26, 700.0),
    ]


def test_bad_nccl_tests_input_is_one_line_with_the_file_and_line_and_writes_nothing(tmp_path):
    lines = old_layout([8, 1024]).splitlines()
    assert lines[16].split()[0] == "1024"  # line 17 of the file
    lines[16] = "        1024           256     float     sum    fast"
    bad = tmp_path / "all_reduce_perf.log"
    bad.write_text("\n".join(lines))
    r = runner.invoke(app, ["calibrate", "import", "nccl-tests", str(bad), "--out", str(tmp_path / "t")])
    assert r.exit_code == 2 and "all_reduce_perf.log line 17: cannot read size and time" in r.output
    assert not (tmp_path / "t").exists()
    empty = tmp_path / "sendrecv_perf.log"
    empty.write_text(old_layout([]).replace("# Out of bounds", "# cut here"))
    with pytest.raises(ScenarioError, match="has no rows"):
        parse_nccl_tests(empty)
    unknown = tmp_path / "run.log"
    unknown.write_text(old_layout([8]))
    with pytest.raises(ScenarioError, match="pass --op"):
        parse_nccl_tests(unknown)


def test_imported_nccl_tests_rows_drive_the_collective_cost(tmp_path):
    log = tmp_path / "all_reduce_perf.txt"
    log.write_text(old_layout([1 << 20, 1 << 24, 1 << 28]))
    r = runner.invoke(
        app,
        [
            "calibrate",
            "import",
            "nccl-tests",
            str(log),
            "--out",
            str(tmp_path / "t"),
            "--topology",
            "dgx-a100",
        ],
    )
    assert r.exit_code == 0, r.output
    from conftest import make

    from simulator.api import simulate

    s = make(parallelism={"tensor_parallel": 8}, training={"global_batch_size": 8}).model_copy(
        update={"kernels": str(tmp_path / "t")}
    )
    res = simulate(s)
    assert res.comm.standalone_time_s("all_reduce", "tp", 1 << 24) == pytest.approx(
        alpha_beta_us(1 << 24, 8) * 1e-6, rel=1e-3
    )
    assert res.comm.source("all_reduce", "tp", 1 << 24) == "measured"


def test_nccl_tests_json_whose_args_name_no_program_asks_for_the_op(tmp_path):
    """Issue 63: args [" "] was an IndexError; without a program name the operation must come from --op."""
    doc = {
        "version": 3,
        "args": [" "],
        "config": {"devices": [{"rank": r, "hostname": "h0"} for r in range(8)]},
        "results": [{"size": 4096, "count": 1024, "type": "float", "out_of_place": {"time": 25.5}}],
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ScenarioError, match="pass --op"):
        parse_nccl_tests(path)
    assert [r.op for r in parse_nccl_tests(path, "all_gather")] == ["all_gather"]


def test_a_trace_number_longer_than_a_float_is_refused_as_one_line():
    """Issue 63: a 400-digit duration in a Kineto trace was an OverflowError in float()."""
    from simulator.scenario.files import parse_json

    with pytest.raises(ScenarioError, match="an integer of 400 digits exceeds what a float holds"):
        parse_json('{"traceEvents": [{"ph": "X", "dur": ' + "9" * 400 + "}]}", "trace.json")
    assert parse_json('{"dur": 123456789012345678901234567890}', "t") == {
        "dur": 123456789012345678901234567890
    }
