"""clustersim validate: predicted vs published, errors, summaries, and no crash on bad cases."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from simulator import load_scenario, simulate
from simulator.cli import app
from simulator.errors import ScenarioError
from simulator.validation.runner import load_cases, summarize

runner = CliRunner()

GOOD = {
    "model": {
        "num_layers": 2,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "seq_length": 512,
        "vocab_size": 1000,
    },
    "cluster": {"topology": "dgx-a100", "num_nodes": 1},
    "training": {"global_batch_size": 16, "micro_batch_size": 2, "precision": "bf16"},
    "parallelism": {"data_parallel": 8},
}
CASES = f"""
cases:
  - id: TOY-GOOD
    model: {json.dumps(GOOD["model"])}
    cluster: {json.dumps(GOOD["cluster"])}
    training: {json.dumps(GOOD["training"])}
    parallelism: {json.dumps(GOOD["parallelism"])}
    published: {{metric: iteration_time_s, value: 0.010, source: "toy"}}
  - id: TOY-BAD
    model: {json.dumps(GOOD["model"])}
    cluster: {json.dumps(GOOD["cluster"])}
    training: {json.dumps(GOOD["training"])}
    parallelism: {{tensor_parallel: 3}}
    published: {{metric: iteration_time_s, value: 1.0, source: "toy"}}
  - id: OTHER-OOM
    model: {{num_layers: 48, hidden_size: 8192, num_attention_heads: 64, seq_length: 2048, vocab_size: 51200}}
    cluster: {{topology: dgx-a100, num_nodes: 1}}
    training: {{global_batch_size: 8, micro_batch_size: 1, precision: bf16}}
    parallelism: {{data_parallel: 8}}
    published: {{metric: tokens_per_s_per_gpu, value: 1000, source: "toy"}}
"""


@pytest.fixture
def cases_file(tmp_path):
    p = tmp_path / "cases.yaml"
    p.write_text(CASES)
    return str(p)


def test_validate_json_reports_signed_errors_and_summaries(cases_file):
    r = runner.invoke(app, ["validate", "--cases", cases_file, "--json"])
    assert r.exit_code == 1, r.output  # TOY-BAD failed and OTHER-OOM is out of memory: not a pass
    d = json.loads(r.output)
    by_id = {c["id"]: c for c in d["cases"]}
    expected = simulate(load_scenario({**GOOD, "name": "x"})).metrics.iteration_time_s
    assert by_id["TOY-GOOD"]["predicted"] == pytest.approx(expected)
    assert by_id["TOY-GOOD"]["error_pct"] == pytest.approx(100 * (expected / 0.010 - 1))
    assert by_id["TOY-BAD"]["status"] == "failed" and by_id["TOY-BAD"]["predicted"] is None
    assert by_id["OTHER-OOM"]["status"] == "oom"
    errors = [abs(by_id[i]["error_pct"]) for i in ("TOY-GOOD", "OTHER-OOM")]
    assert d["summary"]["n"] == 2
    assert d["summary"]["max_abs_error_pct"] == pytest.approx(max(errors))
    assert d["summary"]["median_abs_error_pct"] == pytest.approx(sum(errors) / 2)
    assert set(d["by_source"]) == {"TOY", "OTHER"}


def test_cross_validate_json_is_one_json_document(cases_file):
    """--cross-validate --json prints the JSON alone (the two summary lines came after it, so it did not parse);
    without --json the table ends with both lines, out of sample first."""
    r = runner.invoke(
        app, ["validate", "--cases", cases_file, "--filter", "good", "--cross-validate", "--json"]
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    (case,) = d["cases"]
    assert case["id"] == "TOY-GOOD" and case["out_of_sample_profile"] == "unchanged"
    assert case["out_of_sample_error_pct"] == pytest.approx(case["in_sample_error_pct"])
    assert d["in_sample"]["n"] == d["out_of_sample"]["n"] == 1
    r = runner.invoke(app, ["validate", "--cases", cases_file, "--filter", "good", "--cross-validate"])
    last = r.stdout.strip().splitlines()[-2:]
    assert last[0].startswith("validation (out of sample, leave one source out): 1 cases")
    assert last[1].startswith("validation (in sample): 1 cases")


def test_validate_table_filter_and_summary_line(cases_file):
    r = runner.invoke(app, ["validate", "--cases", cases_file, "--filter", "good"])
    assert r.exit_code == 0
    assert "TOY-GOOD" in r.output and "OTHER-OOM" not in r.output
    assert "validation: 1 cases, median |error|" in r.output


def test_validate_check_exits_1_when_the_gate_is_missed(cases_file):
    r = runner.invoke(app, ["validate", "--cases", cases_file, "--filter", "good", "--check"])
    assert r.exit_code == 1 and "gate missed" in r.output


def test_bad_cases_file_and_empty_filter_exit_2(tmp_path, cases_file):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cases:\n  - id: X\n    published: {metric: speed, value: 1}\n")
    assert runner.invoke(app, ["validate", "--cases", str(bad)]).exit_code == 2
    r = runner.invoke(app, ["validate", "--cases", cases_file, "--filter", "nothing-matches"])
    assert r.exit_code == 2 and "no case id contains" in r.output


def test_the_built_in_suite_holds_every_published_case_with_its_source():
    cases = load_cases()
    assert len(cases) == 44
    assert all(c["published"].get("source") and c["published"].get("level") for c in cases)


def test_summary_of_nothing():
    assert summarize([])["n"] == 0


@pytest.mark.parametrize(
    "size,states,none,selective",
    [
        ("22B", 45.56, 59.25, 9.56),
        ("175B", 45.56, 66.84, 12.35),
        ("530B", 31.64, 114.02, 23.08),
        ("1T", 32.96, 131.25, 26.56),
    ],
)
def test_per_gpu_memory_matches_korthikanti_fig1_within_10_percent(size, states, none, selective):
    """Korthikanti et al. 2022 Fig. 1 (GiB per GPU of the first stage): model states, and activations with
    tensor parallelism only ("none") and with sequence parallelism + selective recompute."""
    case = next(c for c in load_cases() if c["id"] == f"KOR22-{size}-full")
    got = []
    for mode, sp in (("none", False), ("selective", True)):
        d = {k: case[k] for k in ("model", "cluster", "training", "parallelism")}
        d["training"] = {**d["training"], "activation_recompute": mode}
        d["parallelism"] = {**d["parallelism"], "sequence_parallel": sp}
        got.append(simulate(load_scenario(d)).program.ranks[0].memory)
    gib = 2**30
    assert (got[0].params + got[0].grads + got[0].optimizer) / gib == pytest.approx(states, rel=0.10)
    assert got[0].activations / gib == pytest.approx(none, rel=0.10)
    assert got[1].activations / gib == pytest.approx(selective, rel=0.10)


def test_the_deepspeed_cases_simulate_and_each_names_its_source_and_assumptions():
    """simulator/validation/deepspeed.yaml: public DeepSpeed runs at scale (kept out of the gated suite, see
    docs/deepspeed.md); every case must simulate, fit in memory and say where it comes from."""
    from pathlib import Path

    from simulator.validation.runner import run_cases

    path = Path(__file__).resolve().parents[1] / "simulator" / "validation" / "deepspeed.yaml"
    cases = load_cases(path)
    assert len(cases) == 8 and all(c["published"]["source"] and c.get("assumptions") for c in cases)
    results = run_cases(cases)
    # simulated and fitting in memory; "off" marks those further from the published figure than 25%
    assert all(r.status in ("ok", "off") for r in results) and len(results) == 8
    assert all((r.status == "off") == (abs(r.error_pct) > 25) for r in results)


def test_the_held_out_multi_node_runs_simulate_and_name_their_rows():
    """simulator/validation/vtrain-multi.yaml: vTrain's 109 multi-node Megatron-DeepSpeed runs, held out (no profile
    is fitted on them); every case must simulate, fit in memory and name its source row, once."""
    from pathlib import Path

    from simulator.validation.runner import run_cases

    path = Path(__file__).resolve().parents[1] / "simulator" / "validation" / "vtrain-multi.yaml"
    cases = load_cases(path)
    rows = [int(c["published"]["source"].split(" row ")[1].split(",")[0]) for c in cases]
    assert sorted(rows) == list(range(109))
    assert {c["cluster"]["num_nodes"] * 8 for c in cases} == {64, 256, 512}
    assert all(c["published"]["value"] > 0 for c in cases)
    assert {r.status for r in run_cases(cases)} <= {"ok", "off"}


def test_the_held_out_full_node_runs_simulate_and_name_their_rows():
    """simulator/validation/vtrain-8gpu.yaml: vTrain's 720 single-node runs on all 8 GPUs, held out (the 2- and
    4-GPU rows of the same CSV are the fitted small-run set); every case names its CSV row, once, simulates and
    fits in memory. Measured 2026-11-27: mean |error| 7.3%, mean signed -0.4%; tensor-parallel 8 at micro-batch 1
    (two heads per rank, Megatron's softmax in fp32 torch ops) 19-23% fast, 28-32% before that fallback was priced."""
    from pathlib import Path

    from simulator.validation.runner import run_cases

    path = Path(__file__).resolve().parents[1] / "simulator" / "validation" / "vtrain-8gpu.yaml"
    cases = load_cases(path)
    rows = [int(c["published"]["source"].split(" row ")[1]) for c in cases]
    assert len(rows) == len(set(rows)) == 720 and max(rows) < 1440
    p = [c["parallelism"] for c in cases]
    assert all(x["tensor_parallel"] * x["pipeline_parallel"] * x["data_parallel"] == 8 for x in p)
    assert {r.status for r in run_cases(cases)} <= {"ok", "off"}


def test_torchtitans_2024_runs_are_held_out_and_simulate():
    """simulator/validation/torchtitan-2024.yaml: torchtitan's own 2024 tables (FSDP2 on 64 A100; Llama 3.1 405B in
    2D on 128 H100; December 2024's 8B and 405B runs with context and pipeline parallelism), held out: every case
    names its source commit, simulates and fits in memory; the A100 rows and the 405B pipelines without context
    parallelism stay within 10% (measured 2026-11-26: A100 median 2.2%, max 9.0%; 3D and 4D at CP 1 -0.8% to +2.3%)."""
    from pathlib import Path

    from simulator.validation.runner import run_cases

    path = Path(__file__).resolve().parents[1] / "simulator" / "validation" / "torchtitan-2024.yaml"
    cases = load_cases(path)
    assert len(cases) == 23
    assert all(("@3faaa1a0d" in c["published"]["source"]) != c["id"].startswith("TT2412") for c in cases)
    assert all("@d4c86e375" in c["published"]["source"] for c in cases if c["id"].startswith("TT2412"))
    results = {r.id: r for r in run_cases(cases)}
    assert {r.status for r in results.values()} <= {"ok", "off"}
    close = [
        i
        for i in results
        if i.startswith("TTA100") or i.startswith("TT2412-405B-PP8") or i.endswith("4D-CP1")
    ]
    assert len(close) == 11 and max(abs(results[i].error_pct) for i in close) < 10


def test_the_projects_own_h100_rank_measurements_are_held_out_and_close():
    """simulator/validation/h100-rank.yaml: one rank of torchtitan's Llama 3 8B FSDP2 step measured on a lent H100
    (benchmarks/torchtitan_step.py, communication free), at 32k tokens and at 262k over CP 8 with torch's ring
    attention, and the allocated peak of its Llama 3 70B at TP 8: within 3.5% (measured 2026-11-26: +1.5%, +3.2%,
    +1.3%, +1.3%, -0.2%; the CP 8 row was +7.2% before torch's ring merges were costed, the 70B -13.8% before the
    vocabulary-parallel loss's extra copy; the 32k row -0.8% before FSDP2's copies were costed, -1.3% before the
    checkpoint's early stop skipped each block's w2 GEMM in recomputation, which moved the CP 8 row from +2.6%)."""
    from pathlib import Path

    from simulator.validation.runner import run_cases

    path = Path(__file__).resolve().parents[1] / "simulator" / "validation" / "h100-rank.yaml"
    cases = load_cases(path)
    assert len(cases) == 5 and all("measured by this project" in c["published"]["source"] for c in cases)
    results = run_cases(cases)
    assert {r.status for r in results} == {"ok"}
    assert max(abs(r.error_pct) for r in results) < 3.5


def test_cross_validation_refits_each_profile_without_the_source_it_predicts(monkeypatch):
    """Leave one source out: a profile fitted on the source is refitted on its other fit cases, else on other
    sources' cases that run it on the GPU architecture and precision it was fitted on, else falls back to the
    reference (its fitted factors at 1); a profile never fitted on the source is left as it is."""
    from simulator.frameworks import get_framework
    from simulator.validation import crossval

    cases = load_cases()
    calls = []

    def fake_fit(keep, start, params, **kw):
        calls.append(([c["id"] for c in keep], start, params))
        return start.model_copy(update={"gemm_efficiency": 0.5})

    monkeypatch.setattr(crossval, "fit", fake_fit)
    mcore = get_framework("megatron-core-2024")
    mcore_ids = {c["id"] for c in cases if c["id"].startswith("MCORE")}
    # its fit cases are all MCORE: nothing else runs it in published.yaml, so the reference
    ref, how = crossval.without(mcore, mcore_ids, cases, "megatron-core-2024")
    assert how == "reference" and ref.gemm_efficiency == 1.0 and ref.memory_efficiency == 1.0 and not calls
    # Megatron-LM 2021 was fitted on NAR21 (A100, fp16): without NAR21 it is refitted on MEG20's runs in that
    # regime, its six A100 runs (not its two V100 ones: the fit's factors multiply the GPU's own kernel tables)
    nar = {c["id"] for c in cases if c["id"].startswith("NAR21")}
    refit, how = crossval.without(get_framework("megatron-2021"), nar, cases, "megatron-2021")
    ids, start, params = calls[-1]
    assert (
        how == "refitted on 6 other cases" and all(i.startswith("MEG20-A100") for i in ids) and len(ids) == 6
    )
    assert start.gemm_efficiency == 1.0 and params == ["gemm_efficiency", "memory_efficiency"]
    assert refit.gemm_efficiency == 0.5
    # a source the profile never saw: unchanged
    same, how = crossval.without(
        get_framework("megatron-2021"), {"MEG20-A100-TP1-1B"}, cases, "megatron-2021"
    )
    assert how == "unchanged" and same == get_framework("megatron-2021")
    # the per-GPU factor fitted on an MPT run goes with the source
    foundry = crossval.reference(get_framework("llm-foundry-2023"))
    assert "h100-sxm5-80gb" not in foundry.gpus and foundry.gemm_efficiency == 1.0


def test_measured_peak_memory_is_a_validation_metric_and_no_run_that_trained_simulates_oom():
    """Issue 31 item 4: simulator/validation/memory.yaml holds measured peak memory (the 2-node Megatron-DeepSpeed
    report, torchtitan's FSDP runs); the predicted value is the simulated peak allocation where the source reports
    that (DeepSpeed, Megatron) and what the caching allocator holds where it reports that (torchtitan's memory
    line: reserved), the median error is within the issue's 8%, and none of the runs that trained is flagged out of
    memory."""
    import statistics
    from pathlib import Path

    from simulator.validation.runner import case_scenario, run_case

    cases = load_cases(Path(__file__).resolve().parents[1] / "simulator" / "validation" / "memory.yaml")
    metrics = {c["id"]: c["published"]["metric"] for c in cases}
    assert len(cases) == 28 and set(metrics.values()) == {"peak_memory_gib", "reserved_memory_gib"}
    assert all((m == "reserved_memory_gib") == i.startswith("TT") for i, m in metrics.items())
    results = [run_case(c) for c in cases]
    assert all(r.status in ("ok", "off") for r in results), [(r.id, r.status, r.message) for r in results]
    # issue 31 asks 8%: 4.7% measured 2026-11-26 (13.7% before the loss's sequence, the phases, the allocator's
    # holes and the first pipeline stage's whole-vocabulary embedding gradient were modelled)
    assert statistics.median(abs(r.error_pct) for r in results) <= 8.0
    cp1 = next(i for i, c in enumerate(cases) if c["id"] == "TT2412-8B-CP1-MEM")
    first, eight = (simulate(load_scenario(case_scenario(cases[i]))).metrics for i in (0, cp1))
    assert results[0].predicted == first.memory_gib["peak"]
    assert results[cp1].predicted == eight.memory_gib["reserved"] > eight.memory_gib["peak"]


def test_llm_foundrys_throughput_tables_are_held_out_and_hold_at_every_sequence_length():
    """simulator/validation/llm-foundry.yaml: every row of MosaicML's llm-foundry throughput tables that is not in
    published.yaml (207 runs: MPT 125M-70B, 512-65,536 tokens, 8-512 H100 / A100 80GB / A100 40GB), held out:
    each names the README's commit, none repeats a published case, every run fits in memory (they all trained) and
    the median error stays within 8% up to 4,096 tokens and from 16,384 up (measured 2026-11-26: 4.1% over 140
    runs and 3.9% over 45). Before the profile ran what MPT ran (its Triton attention, flash-attn's fused loss), the
    long runs were 50-85% too fast and 61 runs simulated out of memory."""
    import statistics
    from pathlib import Path

    from simulator.validation.runner import run_cases

    root = Path(__file__).resolve().parents[1] / "simulator" / "validation"
    cases = load_cases(root / "llm-foundry.yaml")
    assert len(cases) == 207 and all("@8c8dd48" in c["published"]["source"] for c in cases)
    published = load_cases(root / "published.yaml")
    shapes = {
        (
            c["model"]["hidden_size"],
            c["model"]["seq_length"],
            c["cluster"]["num_nodes"],
            c["training"]["micro_batch_size"],
        )
        for c in published
        if str(c["id"]).startswith("MPT-A100")
    }
    a100 = [c for c in cases if c["group"] == "LF-A100"]
    assert not [
        c
        for c in a100
        if (
            c["model"]["hidden_size"],
            c["model"]["seq_length"],
            c["cluster"]["num_nodes"],
            c["training"]["micro_batch_size"],
        )
        in shapes
    ]
    results = {r.id: r for r in run_cases(cases)}
    assert {r.status for r in results.values()} <= {"ok", "off"}
    short = [results[c["id"]].error_pct for c in cases if c["model"]["seq_length"] <= 4096]
    assert len(short) == 140 and statistics.median(abs(e) for e in short) < 8
    long = [results[c["id"]].error_pct for c in cases if c["model"]["seq_length"] >= 16384]
    assert len(long) == 45 and statistics.median(abs(e) for e in long) < 8


def test_the_summary_says_which_way_the_simulation_leans_whatever_the_metric():
    """1.6 s simulated against 2.0 s measured is +25% (faster); 90 tokens/s against 100 is -10%: signed speed +7.5%.
    A memory case leans apart (+: simulated larger): 44 GiB against 40 is +10%."""
    from simulator.validation.runner import CaseResult, summarize, summary_line

    def row(metric, published, predicted):
        return CaseResult("c", "s", metric, published, predicted, 100 * (predicted / published - 1), "ok")

    s = summarize(
        [
            row("iteration_time_s", 2.0, 1.6),
            row("tokens_per_s_per_gpu", 100.0, 90.0),
            row("peak_memory_gib", 40.0, 44.0),
        ]
    )
    assert s["mean_signed_speed_pct"] == pytest.approx(7.5)
    assert s["mean_signed_memory_pct"] == pytest.approx(10.0)
    assert summary_line(s).endswith(
        "signed speed +7.5% (+: simulated faster), signed memory +10.0% (+: simulated larger)"
    )


def test_case_ids_are_names_and_each_names_one_case(tmp_path):
    """Issue 63: a duplicate id, or a list as an id, is refused naming the case (errors, first-contact records and
    cross-validation key cases by id)."""
    case = {
        "model": {"preset": "gpt3-125m"},
        "cluster": {"topology": "dgx-a100"},
        "training": {"global_batch_size": 8, "micro_batch_size": 1},
        "published": {"metric": "iteration_time_s", "value": 1.0},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"cases": [{"id": "A", **case}, {"id": "A", **case}]}))
    with pytest.raises(ScenarioError, match=r"cases\[1\]\.id 'A' is also cases\[0\]'s"):
        load_cases(path)
    path.write_text(yaml.safe_dump({"cases": [{"id": ["A"], **case}]}))
    with pytest.raises(ScenarioError, match=r"cases\[0\]\.id must be a name"):
        load_cases(path)
