"""clustersim calibrate step --trace: the step time and the GPU's compute / exposed-communication / idle time read
from a PyTorch profiler trace of one rank (calibration/step_trace.py), the profile fitted to it, the trace's
kernels written as a cost table with --table."""

import json
from pathlib import Path

import pytest
import yaml
from test_importers import gpu_trace
from typer.testing import CliRunner

from simulator import load_scenario
from simulator.api import simulate
from simulator.calibration.step_trace import read_step
from simulator.cli import app

runner = CliRunner()
QUICKSTART = str(Path(__file__).resolve().parents[1] / "scenarios/quickstart-gpt3-1.3b-ddp-8xa100.yaml")


def span(name: str, ts: float, dur: float, cat: str = "kernel", tid: int = 7) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur}


def write(tmp_path: Path, events: list[dict], device: str = "NVIDIA A100-SXM4-80GB") -> Path:
    path = tmp_path / "step.json"
    path.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": device}], "traceEvents": events}))
    return path


def steps(durations_us: list[float]) -> list[dict]:
    """ProfilerStep spans back to back from t = 0, as profile.step() writes them (PyTorch 2.x: user_annotation),
    with their GPU-side twins, which do not count."""
    out, t = [], 0.0
    for i, d in enumerate(durations_us):
        out.append(span(f"ProfilerStep#{i + 1}", t, d, "user_annotation", tid=1))
        out.append(span(f"ProfilerStep#{i + 1}", t + 5, d * 3, "gpu_user_annotation"))
        t += d
    return out


def step_args(trace: Path, out: Path, *extra: str) -> list[str]:
    return ["calibrate", "step", QUICKSTART, "--trace", str(trace), *extra, "--write", str(out)]


def test_the_step_and_its_parts_by_hand(tmp_path):
    """Four steps of 2,000 (warm-up, left out), 1,000, 1,200 and 1,100 us: the step is their median, 1,100 us.
    In the counted window [2,000, 5,300] us: compute kernels on two streams at 2,100-2,700 and 2,500-3,000 (900 us
    together), a memcpy at 4,000-4,100; NCCL at 2,900-3,400 (400 us of it alone) and 5,200-5,400 (100 us inside
    the window, alone). Per step: compute 1,000 / 3 us, communication alone 500 / 3 us. A kernel in the warm-up
    step counts nowhere."""
    events = steps([2000, 1000, 1200, 1100]) + [
        span("sm80_xmma_gemm", 100, 1500),  # warm-up step
        span("sm80_xmma_gemm", 2100, 600),
        span("flash_fwd_kernel", 2500, 500, tid=8),
        span("Memcpy DtoD", 4000, 100, "gpu_memcpy"),
        span("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 2900, 500, tid=9),
        span("ncclKernel_AllGather_RING_LL_Sum_int8_t", 5200, 200, tid=9),
    ]
    got = read_step(write(tmp_path, events))
    assert got.steps == 3 and got.step_s == pytest.approx(1100e-6)
    assert got.compute_s == pytest.approx(1000e-6 / 3)
    assert got.nccl_only_s == pytest.approx(500e-6 / 3)
    assert got.idle_s == pytest.approx(1100e-6 - 1500e-6 / 3)
    assert "first of 4 left out" in got.how


def test_without_profiler_steps_the_kernels_span_one_step(tmp_path):
    """No ProfilerStep spans: one step from the first kernel's start (300 us) to the last one's end (1,800 us),
    said to be a lower bound; two steps are both counted."""
    got = read_step(write(tmp_path, [span("gemm", 300, 700), span("ncclDevKernel_Send", 1500, 300)]))
    assert got.steps == 1 and got.step_s == pytest.approx(1500e-6) and "lower bound" in got.how
    two = read_step(write(tmp_path, [*steps([1000, 3000]), span("gemm", 100, 200)]))
    assert two.steps == 2 and two.step_s == pytest.approx(2000e-6)


def test_a_trace_step_gives_a_profile_that_run_reproduces(tmp_path):
    """A trace whose steps last 1.25x the simulated quickstart step: the profile written reproduces it within
    0.5% under run --framework, and says it came from the trace and how its step was read."""
    target_us = simulate(load_scenario(QUICKSTART)).metrics.iteration_time_s * 1.25e6
    events = [*steps([3 * target_us, target_us, target_us]), span("sm80_xmma_gemm", target_us * 3.1, 1e5)]
    trace, out = write(tmp_path, events), tmp_path / "traced.yaml"
    got = runner.invoke(app, ["calibrate", "step", QUICKSTART, "--trace", str(trace), "--write", str(out)])
    assert got.exit_code == 0, got.output
    assert "traced" in got.stdout and "simulated after" in got.stdout and "GPU idle" in got.stdout
    profile = yaml.safe_load(out.read_text())
    assert "--trace" in profile["fitted"] and "ProfilerStep" in profile["fitted"]
    ran = runner.invoke(app, ["run", QUICKSTART, "--framework", str(out), "--json"])
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.stdout)["iteration_time_s"] == pytest.approx(target_us / 1e6, rel=0.005)


def test_table_writes_the_traced_kernels_and_fits_with_them(tmp_path):
    """--table: the trace's GEMM, layer-norm and NCCL rows land in a table directory for the A100; the profile
    is fitted with it layered, and run with --framework and --kernels reproduces the traced step."""
    target_us = simulate(load_scenario(QUICKSTART)).metrics.iteration_time_s * 1.2e6
    events = gpu_trace()["traceEvents"] + steps([target_us, target_us])
    trace, out, table = write(tmp_path, events), tmp_path / "p.yaml", tmp_path / "mine"
    args = step_args(trace, out, "--table", str(table))
    got = runner.invoke(app, args)
    assert got.exit_code == 0, got.output
    assert "stands in for host time" in got.output  # the traced GPU is idle nearly all of the step
    meta = yaml.safe_load((table / "table.yaml").read_text())
    assert meta["gpu"] == "a100-sxm4-80gb" and "calibrate step" in meta["sources"][0]["source"]
    assert (
        "gemm" in (table / "kernels.csv").read_text()
        and "all_reduce" in (table / "collectives.csv").read_text()
    )
    assert f"--kernels {table}" in yaml.safe_load(out.read_text())["fitted"]
    ran = runner.invoke(app, ["run", QUICKSTART, "--framework", str(out), "--kernels", str(table), "--json"])
    m = json.loads(ran.stdout)
    assert m["iteration_time_s"] == pytest.approx(target_us / 1e6, rel=0.005)
    assert m["cost_tables"]["table"]


@pytest.mark.parametrize(
    ("events", "device", "extra", "message"),
    [
        ([span("aten::mm", 0, 10, "cpu_op")], "NVIDIA A100-SXM4-80GB", [], "no GPU kernels in the trace"),
        (gpu_trace()["traceEvents"], "NVIDIA H100 80GB HBM3", ["--table", "t"], "traced on h100-sxm5-80gb"),
        ([span("gemm", 0, 10)], "NVIDIA A100-SXM4-80GB", ["--measured", "1s"], "give one measurement"),
    ],
)
def test_bad_traces_are_one_line_and_exit_2(tmp_path, events, device, extra, message):
    trace = write(tmp_path, events, device)
    extra = [str(tmp_path / x) if x == "t" else x for x in extra]
    args = step_args(trace, tmp_path / "p.yaml", *extra)
    got = runner.invoke(app, args)
    assert got.exit_code == 2 and message in got.output, got.output
    assert not (tmp_path / "p.yaml").exists()


def test_table_without_a_trace_is_refused(tmp_path):
    args = ["calibrate", "step", QUICKSTART, "--measured", "1s", "--table", str(tmp_path / "t")]
    got = runner.invoke(app, [*args, "--write", str(tmp_path / "p.yaml")])
    assert got.exit_code == 2 and "--table" in got.output and "--trace" in got.output
