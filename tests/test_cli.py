"""The command line: tables, JSON, traces, schema, and one clear message with exit code 2 for bad input."""

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator.cli import app

runner = CliRunner()

GOOD = """
name: tiny
model: {num_layers: 2, hidden_size: 512, num_attention_heads: 8, seq_length: 512, vocab_size: 1000}
cluster: {topology: dgx-a100, num_nodes: 1}
training: {global_batch_size: 16, micro_batch_size: 2, precision: bf16}
parallelism: {zero_stage: 1}
"""


def write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_run_json_has_the_documented_keys(tmp_path):
    r = runner.invoke(app, ["run", write(tmp_path, GOOD), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    for key in [
        "iteration_time_s",
        "tokens_per_s",
        "tokens_per_s_per_gpu",
        "samples_per_s",
        "model_tflops_per_gpu",
        "mfu",
        "hfu",
        "bubble_fraction",
        "oom",
        "events",
        "wall_s",
    ]:
        assert key in d
    assert set(d["breakdown"]) == {"forward_s", "backward_s", "optimizer_s"}
    assert {"exposed_s", "overlapped_s"} <= set(d["comm"])
    assert {
        "params",
        "grads",
        "optimizer",
        "activations",
        "buffers",
        "peak",
        "capacity",
        "host",
        "host_capacity",
        "nvme",
        "step",
        "step_extra",
        "context",
        "nccl",
        "fragmentation",
        "reserve",
        "graphs",
        "reserved",
        "device",
    } == set(d["memory_gib"])
    b = d["breakdown"]
    assert b["forward_s"] + b["backward_s"] + b["optimizer_s"] == pytest.approx(
        d["iteration_time_s"], rel=1e-9
    )


def test_run_table_and_trace(tmp_path):
    trace = tmp_path / "t.json"
    r = runner.invoke(app, ["run", write(tmp_path, GOOD), "--trace", str(trace)])
    assert r.exit_code == 0 and "Iteration time" in r.output
    events = json.loads(trace.read_text())["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert complete and all({"name", "ts", "dur", "pid", "tid"} <= set(e) for e in complete)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names[0].startswith("rank 0") and names[1].startswith("links")  # one simulated rank, the links')


def test_a_name_that_looks_like_markup_is_printed_as_written(tmp_path):
    """A scenario's name heads the table's column: rich markup in it ('[/x]', found by tests/test_hostile.py)
    is the user's text, printed as written, not a MarkupError."""
    for name in ("[/x]", "[red]a[/red]", "[bold"):
        text = GOOD.replace("name: tiny", f"name: '{name}'")
        for command in (["run"], ["compare"]):
            r = runner.invoke(app, [*command, write(tmp_path, text)])
            assert r.exception is None and r.exit_code == 0, (name, command, r.output)
            assert name in r.output


def test_compare_side_by_side(tmp_path):
    a = write(tmp_path, GOOD, "a.yaml")
    b = write(tmp_path, GOOD.replace("zero_stage: 1", "zero_stage: 3"), "b.yaml")
    r = runner.invoke(app, ["compare", a, b, "--json"])
    assert r.exit_code == 0
    assert [x["strategy"] for x in json.loads(r.output)] == ["zero-1, DP8", "zero-3, DP8"]


def test_compare_shows_every_row_and_exits_3_when_one_does_not_fit(tmp_path):
    a = write(tmp_path, GOOD, "a.yaml")
    big = GOOD.replace(
        "model: {num_layers: 2, hidden_size: 512, num_attention_heads: 8, seq_length: 512, vocab_size: 1000}",
        "model: {preset: llama2-7b, seq_length: 4096}",
    ).replace("name: tiny", "name: too-big")
    b = write(tmp_path, big.replace("zero_stage: 1", "zero_stage: 0"), "b.yaml")
    r = runner.invoke(app, ["compare", a, b, "--json"])
    assert r.exit_code == 3, r.output
    rows = json.loads(r.stdout)
    assert [(x["name"], x["oom"]) for x in rows] == [("tiny", False), ("too-big", True)]
    line = " ".join(r.stderr.split())
    assert "out of memory: too-big (GPU: " in line and "> 80 GiB)" in line and "tiny" not in line
    assert runner.invoke(app, ["compare", a, a, "--json"]).exit_code == 0


def test_schema_is_json_schema():
    r = runner.invoke(app, ["schema"])
    schema = json.loads(r.output)
    assert {"model", "cluster", "training", "parallelism"} <= set(schema["properties"])


BASE = """model: {preset: gpt3-175b}
training: {global_batch_size: 1536, micro_batch_size: 4, precision: fp16}
"""


@pytest.mark.parametrize(
    "text,message",
    [
        (
            BASE
            + "cluster: {topology: dgx-a100, num_nodes: 192}\nparallelism: {tensor_parallel: 8, pipeline_parallel: 12, data_parallel: 10}\n",
            "parallelism: tensor_parallel(8) x pipeline_parallel(12) x context_parallel(1) x data_parallel(10) = 960, but the cluster has 1536 GPUs",
        ),
        (
            BASE + "cluster: {topology: dgx-a100, num_nodes: 2}\nparallelism: {tensor_parallel: 5}\n",
            "model.num_attention_heads (96) is not divisible by tensor_parallel (5)",
        ),
        (
            BASE + "cluster: {topology: dgx-z900}\n",
            "cluster.topology: unknown topology 'dgx-z900'; available: dgx-a100, dgx-b200, dgx-b300, dgx-h100, dgx-h200",
        ),
        (BASE + "cluster: {topology: dgx-a100, num_nodes: 2\n", "YAML syntax error at line 4"),
        (
            BASE + "cluster: {topology: dgx-a100}\nparallelism: {zero_stage: 4}\n",
            "parallelism.zero_stage: Input should be 0, 1, 2 or 3",
        ),
        (
            BASE + "cluster: {topology: dgx-a100}\nparallelism: {tensor_paralel: 2}\n",
            "did you mean 'tensor_parallel'",
        ),
        (
            BASE + "cluster: {topology: dgx-a100, num_nodes: 5}\n",
            "training.global_batch_size (1536) is not divisible by micro_batch_size (4) x data_parallel (40) = 160",
        ),
        (
            "model: {preset: gpt-9}\ncluster: {topology: dgx-a100}\ntraining: {global_batch_size: 8}\n",
            "unknown model preset 'gpt-9'",
        ),
        (BASE.replace("fp16", "bf16") + "cluster: {topology: dgx2-v100}\n", "v100-sxm-32gb has no bf16 peak"),
        (BASE + "cluster: {topology: dgx-a100, gpu: b300}\n", "cluster.gpu: unknown GPU 'b300'"),
    ],
)
def test_bad_input_gives_one_message_and_exit_code_2(tmp_path, text, message):
    r = runner.invoke(app, ["run", write(tmp_path, text)])
    assert r.exit_code == 2
    assert message in " ".join(r.output.split())
    assert "Traceback" not in r.output


def test_a_mistyped_preset_or_topology_name_gets_the_closest_one(tmp_path):
    """A name one character off is suggested; a name like no shipped one is not (dgx-z900 above)."""
    text = BASE.replace("gpt3-175b", "gpt3-175") + "cluster: {topology: dgx-h1000}\n"
    line = " ".join(runner.invoke(app, ["run", write(tmp_path, text)]).output.split())
    assert "unknown model preset 'gpt3-175' (did you mean 'gpt3-175b'?); available:" in line
    text = BASE + "cluster: {topology: dgx-h1000}\n"
    line = " ".join(runner.invoke(app, ["run", write(tmp_path, text)]).output.split())
    assert "unknown topology 'dgx-h1000' (did you mean 'dgx-h100'?); available: dgx-a100" in line


def test_missing_file(tmp_path):
    r = runner.invoke(app, ["run", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 2 and "file not found" in r.output


def test_hugging_face_config(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 32,
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "intermediate_size": 14336,
                "max_position_embeddings": 8192,
                "vocab_size": 128256,
                "hidden_act": "silu",
                "rms_norm_eps": 1e-5,
                "rope_theta": 500000.0,
                "tie_word_embeddings": False,
            }
        )
    )
    text = (
        "model: {hf_config: config.json, seq_length: 2048}\ncluster: {topology: dgx-h100}\n"
        "training: {global_batch_size: 16}\nparallelism: {fsdp: {}}\n"
    )
    r = runner.invoke(app, ["run", write(tmp_path, text), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["params_billion"] == pytest.approx(8.03, abs=0.01)


def test_an_hf_config_without_hidden_act_takes_its_model_type_default_and_says_so(tmp_path):
    import json as _json

    cfg = {
        "model_type": "llama",
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_attention_heads": 8,
        "num_hidden_layers": 4,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
    }
    (tmp_path / "config.json").write_text(_json.dumps(cfg))
    (tmp_path / "s.yaml").write_text(
        "name: hf\nmodel: {hf_config: config.json, seq_length: 2048}\ncluster: {topology: dgx-a100}\n"
        "training: {global_batch_size: 8}\n"
    )
    r = CliRunner().invoke(app, ["run", str(tmp_path / "s.yaml"), "--json"])
    assert r.exit_code == 0, r.output
    assert "no hidden_act; a llama without one uses silu (SwiGLU MLP)" in r.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [
                "plan",
                "--model",
                "gpt3-1.3b",
                "--gpus",
                "0",
                "--topology",
                "dgx-a100",
                "--global-batch-size",
                "8",
            ],
            "error: clustersim plan: Invalid value for '--gpus'",
        ),
        (["run"], "error: clustersim run: Missing argument 'scenario'."),
        (["bogus"], "error: clustersim: No such command 'bogus'."),
    ],
)
def test_click_usage_errors_are_one_error_line_and_exit_2(args, message):
    """The installed command (simulator.cli.main), not the Typer app: Click's own refusals as every other one."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "simulator", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr


def test_main_freezes_the_collector_only_when_the_process_exits(monkeypatch, capsys):
    """main() has gc.freeze run at exit (the shutdown then skips traversing every object: 55 ms of the
    quickstart's 68 ms exit); while its caller goes on (a test), nothing is frozen."""
    import gc
    import subprocess

    from simulator.cli import main

    frozen = None
    for _ in range(2):
        monkeypatch.setattr(sys, "argv", ["clustersim", "scenarios"])
        with pytest.raises(SystemExit) as e:
            main()
        assert e.value.code == 0
        # from the second call on: the first frees frozen objects its lazy imports replace (the count falls)
        frozen = gc.get_freeze_count() if frozen is None else frozen
    assert "quickstart" in capsys.readouterr().out
    assert gc.get_freeze_count() == frozen
    # atexit handlers run last-registered first: one registered before main() sees what main's left
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: sys.stderr.write(f'frozen at exit: {gc.get_freeze_count()}'))\n"
        "from simulator.cli import main\n"
        "sys.argv = ['clustersim', 'scenarios']\n"
        "main()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "quickstart" in r.stdout
    count = int(r.stderr.rsplit("frozen at exit: ", 1)[1])
    assert count > 10_000, r.stderr  # the modules, classes and functions of every import


def test_scenarios_list_one_line_each_with_gpus_model_and_layout():
    """clustersim scenarios on a wide terminal: one line per scenario, grouped by folder. The quickstart is GPT-3
    1.3B with DDP on 8 A100: 24 x (12 h^2 + 13 h) + (vocabulary + positions) x h + 2 h (the final norm; the head
    is tied) = 1,317,654,528 parameters at h 2,048, vocabulary 51,200, 2,048 positions."""
    h = 2048
    assert 24 * (12 * h * h + 13 * h) + (51200 + 2048) * h + 2 * h == 1_317_654_528
    r = runner.invoke(app, ["scenarios"], env={"COLUMNS": "220"})
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 220
    assert any("what it is" in line for line in lines)
    (quick,) = [line for line in lines if line.strip().startswith("quickstart-gpt3-1.3b-ddp-8xa100")]
    assert quick.split()[1:6] == ["8", "A100", "1.32B", "bf16", "DP8"]
    assert "The first thing to run: GPT-3 1.3B" in quick
    (moe,) = [line for line in lines if line.strip().startswith("deepseek-v3-ep64-1024xh100")]
    assert "1,024 H100" in moe and "671B/" in moe and "TP2+SP PP16 DP32 EP64 ZeRO-1" in moe
    assert any(line.strip() == "published/" for line in lines)
    rows = json.loads(runner.invoke(app, ["scenarios", "--json"]).stdout)
    (q,) = [x for x in rows if x["name"] == "quickstart-gpt3-1.3b-ddp-8xa100"]
    assert (q["set"], q["gpus"], q["model"], q["layout"]) == ("", "8 A100", "1.32B bf16", "DP8")


def test_scenarios_list_on_a_narrow_terminal_is_two_lines_each():
    """80 columns (a pipe) cannot hold the table: each scenario's name, then its GPUs, model and layout."""
    r = runner.invoke(app, ["scenarios"], env={"COLUMNS": "80"})
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    i = lines.index("  quickstart-gpt3-1.3b-ddp-8xa100")
    assert lines[i + 1] == "    8 A100, 1.32B bf16, DP8"


def test_a_scenarios_description_is_its_first_sentence(tmp_path):
    from simulator.scenario.shipped import describe

    f = tmp_path / "x.yaml"
    f.write_text("# Llama 3 405B (Dubey et al. 2024, Sec. 3.3): TP 8. More here.\n# And here.\nname: x\n")
    assert describe(f) == "Llama 3 405B (Dubey et al. 2024, Sec. 3.3): TP 8."
    f.write_text("name: x\n")
    assert describe(f) == ""


def test_scenarios_filter_by_any_column_and_refuse_what_matches_nothing():
    rows = json.loads(runner.invoke(app, ["scenarios", "moe", "--json"]).stdout)
    assert {r["name"] for r in rows} == {
        "deepseek-v3-dualpipe-2048xh800",
        "deepseek-v3-ep64-1024xh100",
        "gpt-oss-120b-ep8-64xh100",
        "llama4-maverick-ep16-256xh100",
        "mixtral-8x7b-ep8-16xh100",
        "qwen3-235b-fp8-256xh100",
        "qwen3-30b-a3b-mxfp8-8xgb200",
    }
    rows = json.loads(
        runner.invoke(app, ["scenarios", "GB200", "--json"]).stdout
    )  # the GPUs column, any case
    assert rows and all("GB200" in r["gpus"] for r in rows)
    r = runner.invoke(app, ["scenarios", "zzz"])
    assert (
        r.exit_code == 2
        and "no shipped scenario's name, folder, GPUs, model or layout contains 'zzz'" in (r.output)
    )


def test_the_command_listing_shows_each_summary_as_one_flowing_line():
    """`clustersim --help` lists each command with its docstring's first paragraph joined into one line, so
    the terminal wraps it (Typer kept the source's line breaks: ragged lines at 80 columns)."""
    from simulator.cli import app

    assert len(app.registered_commands) >= 9
    for info in app.registered_commands:
        summary = info.short_help
        assert summary and "\n" not in summary and "  " not in summary, info.callback.__name__
        assert summary == " ".join(info.callback.__doc__.split("\n\n")[0].split())


def test_first_hour_details(tmp_path):
    """Issue 63: init lists every shipped topology; a 1T model reads 1.01T, not 1.01e+03B; a bf16 run beside an FP8
    one in compare shows '-' for the FP8 / FP4 MFU, not 0.0%."""
    from simulator.hardware.topology import TOPOLOGY_DIR
    from simulator.report.listing import _billions
    from simulator.report.table import ROWS

    target = tmp_path / "s.yaml"
    assert CliRunner().invoke(app, ["init", str(target)]).exit_code == 0
    line = next(x for x in target.read_text().splitlines() if "topology:" in x)
    assert all(p.stem in line for p in TOPOLOGY_DIR.glob("*.yaml"))
    assert _billions(1.01e12) == "1.01T" and _billions(1.3e9) == "1.3B"
    row = next(r for r in ROWS if r[0] == "MFU vs the FP8 / FP4 peak")

    class Bf16:
        fp8 = None

    assert row[1](Bf16()) == "-"


def test_durations_and_long_arguments_in_messages():
    """Issue 63: --budget's message said 'between 1 s and 30 days' and took 0.5 s: it now says the range it takes
    (above 0, at most 30 days); a long run of blanks is refused at once (the pattern no longer backtracks over it);
    a 5,000-digit argument is cut in the error line."""
    from simulator.cli.calibrate import parse_duration
    from simulator.errors import ScenarioError
    from simulator.report.console import shortened

    assert parse_duration("1h 30m", "--budget") == 5400 and parse_duration("90", "--budget") == 90
    assert parse_duration("0.5s", "--budget") == 0.5  # the message states the range it keeps: above 0
    with pytest.raises(ScenarioError, match=r"0s is not a duration above 0 and at most 30 days"):
        parse_duration("0s", "--budget")
    with pytest.raises(ScenarioError, match="expected a duration"):
        parse_duration("1" + " " * 100_000 + "x", "--budget")
    text = shortened(f"--tp: got '{'9' * 5000}' here")
    assert text == f"--tp: got '{'9' * 99}...(5,002 characters) here"
    assert shortened("x" * 300) == "x" * 300  # a long path is shown whole
    out = CliRunner().invoke(app, ["plan", "--model", "gpt3-1.3b", "--gpus", "8", "--tp", "9" * 5000])
    assert out.exit_code == 2 and len(out.output) < 500, out.output


def test_version_is_printed():
    from importlib.metadata import version

    out = CliRunner().invoke(app, ["--version"])
    assert out.exit_code == 0 and out.output.strip() == f"clustersim {version('clustersim')}"


def test_framework_option_on_run_compare_memory_and_sweep(tmp_path, monkeypatch):
    """Issue 65 item 2: --framework NAME|FILE on run, compare, memory and sweep replaces the scenario's profile; a file of
    one's own (relative to the working directory) runs as an unseen stack and its error bar says so."""
    runner = CliRunner()
    named = runner.invoke(app, ["run", "quickstart", "--framework", "megatron-2022", "--json"])
    assert named.exit_code == 0, named.output
    assert json.loads(named.stdout)["framework"] == "megatron-2022"
    profile = Path(__file__).resolve().parents[1] / "simulator" / "frameworks" / "pytorch-2024.yaml"
    (tmp_path / "mine.yaml").write_text(profile.read_text().replace("name: pytorch-2024", "name: my-stack"))
    monkeypatch.chdir(tmp_path)
    own = json.loads(runner.invoke(app, ["run", "quickstart", "--framework", "mine.yaml", "--json"]).stdout)
    assert own["framework"] == "my-stack"
    assert own["accuracy"]["speed"]["note"].startswith("a profile of your own is an unseen stack (my-stack")
    both = runner.invoke(
        app, ["compare", "quickstart", "quickstart", "--framework", "megatron-2022", "--json"]
    )
    assert [r["framework"] for r in json.loads(both.stdout)] == ["megatron-2022"] * 2
    assert (
        runner.invoke(app, ["memory", "quickstart", "--framework", "megatron-2022", "--json"]).exit_code == 0
    )
    bad = runner.invoke(app, ["run", "quickstart", "--framework", "nope"])
    assert bad.exit_code == 2 and "unknown framework 'nope'" in bad.output
    # sweep: every point runs the profile (a relative file found from the working directory, not the base's)
    base = str(Path(__file__).resolve().parents[1] / "scenarios" / "quickstart-gpt3-1.3b-ddp-8xa100.yaml")
    swept = runner.invoke(
        app,
        ["sweep", base, "--vary", "training.micro_batch_size=1,2", "--out", "out", "--framework", "mine.yaml"]
        + ["--workers", "1", "--json"],
    )
    assert swept.exit_code == 0, swept.output
    points = [json.loads(line) for line in (tmp_path / "out" / "points.jsonl").read_text().splitlines()]
    assert [p["metrics"]["framework"] for p in points] == ["my-stack"] * 2
    both_ways = runner.invoke(
        app, ["sweep", base, "--vary", "framework=ideal", "--out", "o2", "--framework", "ideal"]
    )
    assert both_ways.exit_code == 2
    assert "--framework: the sweep varies framework itself; give one or the other" in both_ways.output
