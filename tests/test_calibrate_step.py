"""clustersim calibrate step: one profile parameter fitted to one measured step, the profile then used by run."""

import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simulator import load_scenario
from simulator.api import simulate
from simulator.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "scenarios/quickstart-gpt3-1.3b-ddp-8xa100.yaml")
TORCHTITAN = str(ROOT / "simulator/validation/torchtitan-2024.yaml")


@pytest.fixture(scope="module")
def simulated():
    return simulate(load_scenario(QUICKSTART)).metrics


@pytest.mark.parametrize(
    ("option", "scale", "metric"),
    [("--measured", 1.25, "iteration_time_s"), ("--tokens-per-s-per-gpu", 0.8, "tokens_per_s_per_gpu")],
)
def test_a_measured_step_gives_a_profile_that_run_reproduces(tmp_path, simulated, option, scale, metric):
    """A step measured 25% slower than simulated (or 20% fewer tokens/s): gemm_efficiency is lowered until the
    simulation matches; `run --framework FILE` then gives the measurement within 0.5%, names the profile and says
    how it was made; the profile keeps no published-run fit (cross-validation leaves it alone)."""
    target = getattr(simulated, metric) * scale
    out = tmp_path / "my-stack.yaml"
    got = runner.invoke(app, ["calibrate", "step", QUICKSTART, option, f"{target:.6g}", "--write", str(out)])
    assert got.exit_code == 0, got.output
    profile = yaml.safe_load(out.read_text())
    assert profile["name"] == "my-stack" and profile["gemm_efficiency"] < 0.892
    assert "calibrate step" in profile["fitted"] and "one measured step" in profile["accuracy"]
    assert "fit_cases" not in profile and "fit_params" not in profile
    ran = runner.invoke(app, ["run", QUICKSTART, "--framework", str(out), "--json"])
    assert ran.exit_code == 0, ran.output
    m = json.loads(ran.stdout)
    assert m[metric] == pytest.approx(target, rel=0.005)
    assert m["framework"] == "my-stack"
    assert m["framework_fitted"].startswith("clustersim calibrate step") and option in m["framework_fitted"]


def test_a_faster_measurement_raises_the_level_and_says_when_it_cannot(tmp_path, simulated):
    """10% faster than simulated: gemm_efficiency rises; 5x faster: beyond its bound (1.3), said in a warning."""
    out = tmp_path / "fast.yaml"

    def step(scale: float):
        measured = f"{scale * simulated.iteration_time_s:.6g}"
        return runner.invoke(
            app, ["calibrate", "step", QUICKSTART, "--measured", measured, "--write", str(out)]
        )

    got = step(0.9)
    assert got.exit_code == 0 and yaml.safe_load(out.read_text())["gemm_efficiency"] > 0.892
    got = step(0.2)
    assert got.exit_code == 0 and "stopped at the bound of gemm_efficiency" in got.output


def test_the_fit_says_how_well_the_step_fixes_the_parameter_and_refuses_what_it_cannot(tmp_path, simulated):
    """The quickstart's step is mostly matmuls: 10% off gemm_efficiency moves it about 8%, said as a sensitivity
    and as what a 1% measurement error does to the fit (its inverse). The same GPU-bound step does not depend on the
    host's kernel-launch cost at all: fitting that to it is refused, one line, exit 2, no profile written."""
    from simulator.frameworks import get_framework
    from simulator.validation.calibrate import elasticity, scaled

    out = tmp_path / "p.yaml"
    measured = f"{1.1 * simulated.iteration_time_s:.6g}"
    got = runner.invoke(app, ["calibrate", "step", QUICKSTART, "--measured", measured, "--write", str(out)])
    assert got.exit_code == 0, got.output
    start = get_framework("pytorch-2024")
    lower = simulate(load_scenario(QUICKSTART), framework=scaled(start, "gemm_efficiency", 0.9)).metrics
    expected = abs(math.log(lower.iteration_time_s / simulated.iteration_time_s) / math.log(0.9))
    assert 0.5 < expected < 1.0
    text = " ".join(got.output.split())
    assert f"sensitivity: the step moves {expected:.2f}% per 1% of gemm_efficiency" in text
    assert f"moves the fit by {1 / expected:.1f}%" in text
    case = {"id": "q", **yaml.safe_load(Path(QUICKSTART).read_text())}
    case["published"] = {"metric": "iteration_time_s", "value": simulated.iteration_time_s}
    assert elasticity(case, start, "gemm_efficiency") == pytest.approx(expected, rel=1e-9)
    host = runner.invoke(
        app,
        ["calibrate", "step", QUICKSTART, "--measured", measured, "--param", "host.forward_kernel_s"]
        + ["--write", str(tmp_path / "h.yaml")],
    )
    assert host.exit_code == 2 and "this step hardly depends on it" in host.output
    assert not (tmp_path / "h.yaml").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--measured", "1s", "--mfu", "0.4"], "give one measurement"),
        ([], "give one measurement"),
        (["--measured", "fast"], "--measured: expected a duration"),
        (
            ["--measured", "1s", "--param", "gemm_efficiency,memory_efficiency"],
            "one measured step identifies one",
        ),
        (["--measured", "1s", "--param", "speed"], "--param: unknown 'speed'"),
        (["--tokens-per-s-per-gpu", "inf"], "--tokens-per-s-per-gpu: must be a finite number above 0"),
        (["--tokens-per-s-per-gpu", "0"], "--tokens-per-s-per-gpu: must be a finite number above 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    got = runner.invoke(app, ["calibrate", "step", QUICKSTART, *args, "--write", str(tmp_path / "p.yaml")])
    assert got.exit_code == 2 and message in got.output and "Traceback" not in got.output
    assert not (tmp_path / "p.yaml").exists()


def test_validate_one_run_measures_the_workflow_per_source():
    """validate --one-run: per source with 4+ runs of a profile, the GEMM level fitted to the smallest run (of
    those, the most sensitive to it), the others predicted with it and filed by their relation to it. torchtitan's
    runs (docs/calibration.md): 8 A100 runs fitted on one, the other 7 within 6%; the H100 set fitted on its BF16
    run, its FP8 runs beside."""
    got = runner.invoke(app, ["validate", "--one-run", "--cases", TORCHTITAN, "--json"])
    assert got.exit_code == 0, got.output
    out = json.loads(got.stdout)
    sources = {r["source"]: r for r in out["sources"]}
    a100 = sources["TTA100"]
    # of its runs on the fewest GPUs, the one whose step the GEMM level moves most is the one fitted
    assert a100["fitted_on"] == "TTA100-L2-70B-FULL"
    assert (
        a100["same GPU and precision"]["n"] == 7 and a100["same GPU and precision"]["max_abs_error_pct"] < 6.0
    )
    assert (
        a100["gemm_efficiency"][0] == pytest.approx(0.892)
        and a100["gemm_efficiency"][1] != a100["gemm_efficiency"][0]
    )
    assert out["overall"]["same GPU and precision"]["median_abs_error_pct"] < 5.0
    assert out["overall"]["other precision"]["n"] == 10


def test_one_run_moves_to_the_next_step_where_the_fit_stops_at_its_bound(tmp_path):
    """A measured step 3x faster than the profile's lies beyond what the GEMM level can explain (calibrate step warns
    so): the workflow fits the next most sensitive of the fewest-GPU runs instead, as a user heeding it would."""
    data = yaml.safe_load(Path(TORCHTITAN).read_text())
    for case in data["cases"]:
        if case["id"] == "TTA100-L2-70B-FULL":
            case["published"]["value"] *= 3 if case["published"]["metric"] != "iteration_time_s" else 1 / 3
    fast = tmp_path / "fast.yaml"
    fast.write_text(yaml.safe_dump(data))
    got = runner.invoke(app, ["validate", "--one-run", "--cases", str(fast), "--json"])
    assert got.exit_code == 0, got.output
    a100 = {r["source"]: r for r in json.loads(got.stdout)["sources"]}["TTA100"]
    assert a100["fitted_on"] not in ("TTA100-L2-70B-FULL", None)
    assert a100["same GPU and precision"]["n"] == 7


def test_validate_one_run_refuses_a_file_without_a_source_of_four_runs(tmp_path):
    few = tmp_path / "few.yaml"
    cases = yaml.safe_load(Path(TORCHTITAN).read_text())["cases"][:3]
    few.write_text(yaml.safe_dump({"cases": cases}))
    got = runner.invoke(app, ["validate", "--one-run", "--cases", str(few)])
    assert got.exit_code == 2 and "no source has 4 or more speed runs" in got.output


def test_a_calibrated_profile_carries_the_one_run_bar_and_says_so_in_json_table_and_html(tmp_path, simulated):
    """The profile names the step it was calibrated on (GPU, precision, GPUs); a run with it prints the one-run
    workflow's measured error for its distance from that step (accuracy.yaml one_run: the same GPU and precision
    here, another GPU on an H100), and the JSON, the terminal table and the HTML report say so."""
    from simulator.metrics.error_bar import SAME, stored

    out = tmp_path / "mine.yaml"
    measured = f"{1.1 * simulated.iteration_time_s:.6g}"
    assert (
        runner.invoke(
            app, ["calibrate", "step", QUICKSTART, "--measured", measured, "--write", str(out)]
        ).exit_code
        == 0
    )
    assert yaml.safe_load(out.read_text())["calibrated_on"] == {
        "gpu": "a100-sxm4-80gb",
        "precision": "bf16",
        "gpus": 8,
    }
    report = tmp_path / "r.html"
    m = json.loads(
        runner.invoke(
            app, ["run", QUICKSTART, "--framework", str(out), "--json", "--report", str(report)]
        ).stdout
    )
    assert m["framework_calibrated_on"] == {"gpu": "a100-sxm4-80gb", "precision": "bf16", "gpus": 8}
    row = stored()["one_run"][SAME]
    speed = m["accuracy"]["speed"]
    assert speed["n"] == row["n"] >= 100 and speed["median_abs_pct"] == row["median_abs_pct"]
    assert "calibrated on one measured step" in speed["scope"] and SAME in speed["scope"]
    page = report.read_text()
    assert "calibrated on" in page and "one measured step: 8 a100-sxm4-80gb, bf16" in page
    table = runner.invoke(app, ["run", QUICKSTART, "--framework", str(out)]).stdout
    assert "Profile calibrated on" in table and "calibrated on one measured step" in table
    h100 = tmp_path / "h100.yaml"
    s = yaml.safe_load(Path(QUICKSTART).read_text())
    s["cluster"]["topology"] = "dgx-h100"
    h100.write_text(yaml.safe_dump(s))
    other = json.loads(runner.invoke(app, ["run", str(h100), "--framework", str(out), "--json"]).stdout)
    assert "other GPU" in other["accuracy"]["speed"]["scope"]
    assert other["accuracy"]["speed"]["n"] == stored()["one_run"]["other GPU"]["n"]


def test_a_profile_with_a_gpus_own_factor_is_fitted_where_the_factor_applies(tmp_path):
    """llm-foundry-2023 holds an H100 factor of its own (gemm_efficiency 0.986 under gpus: h100-sxm5-80gb): on an
    H100 step the fit moves that factor, not the profile's unused one, so run reproduces a step 15% slower than
    simulated; the profile's other entries keep their ratios to it (0.986 x r on H100, 1.0 x r elsewhere)."""
    s = yaml.safe_load(Path(QUICKSTART).read_text())
    s["cluster"]["topology"], s["framework"] = "dgx-h100", "llm-foundry-2023"
    scenario = tmp_path / "h100.yaml"
    scenario.write_text(yaml.safe_dump(s))
    target = 1.15 * simulate(load_scenario(scenario)).metrics.iteration_time_s
    out = tmp_path / "mine.yaml"
    got = runner.invoke(
        app, ["calibrate", "step", str(scenario), "--measured", f"{target:.6g}", "--write", str(out)]
    )
    assert got.exit_code == 0, got.output
    profile = yaml.safe_load(out.read_text())
    on_h100 = profile["gpus"]["h100-sxm5-80gb"]["gemm_efficiency"]
    assert on_h100 < 0.986 and profile["gemm_efficiency"] == pytest.approx(on_h100 / 0.986, rel=1e-9)
    ran = json.loads(runner.invoke(app, ["run", str(scenario), "--framework", str(out), "--json"]).stdout)
    assert ran["iteration_time_s"] == pytest.approx(target, rel=0.005)


def test_a_fit_that_stops_at_the_ceiling_writes_a_profile_that_loads(tmp_path):
    """A step 2.5x faster than megatron-2022 simulates the quickstart: the GEMM level stops at 1.5, the most a
    profile file takes (it went to 2.09 and wrote a file run refused), with the bound's warning."""
    out = tmp_path / "fast.yaml"
    args = ["calibrate", "step", QUICKSTART, "--framework", "megatron-2022", "--measured", "0.3s"]
    got = runner.invoke(app, [*args, "--write", str(out)])
    assert got.exit_code == 0 and "stopped at the bound" in got.output, got.output
    assert yaml.safe_load(out.read_text())["gemm_efficiency"] <= 1.5
    assert runner.invoke(app, ["run", QUICKSTART, "--framework", str(out), "--json"]).exit_code == 0
