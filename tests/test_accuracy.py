"""The error bar every run reports: the error of its cell (profile, GPU generation, job size) on measured runs the
code had not seen, each at the worse of first contact and left out of every fit (simulator/validation/accuracy.py,
first_contact.py, metrics/error_bar.py)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.frameworks import get_framework
from simulator.metrics import error_bar
from simulator.validation import accuracy, first_contact
from simulator.validation.runner import load_cases
from simulator.validation.signs import speed_error_pct


def test_speed_errors_are_signed_the_same_way_for_times_and_throughputs():
    """+ = simulated faster than measured: 1.6 s simulated against 2.0 s measured is 25% fast, as 125 tokens/s
    against 100 is."""
    assert speed_error_pct("iteration_time_s", published=2.0, predicted=1.6) == pytest.approx(25.0)
    assert speed_error_pct("tokens_per_s_per_gpu", published=100.0, predicted=125.0) == pytest.approx(25.0)
    assert speed_error_pct("model_tflops_per_gpu", published=200.0, predicted=150.0) == pytest.approx(-25.0)


def test_summary_by_hand():
    """|errors| 1, 2, 5, 10, 20: median 5; 90th percentile (inclusive) at rank 0.9 x 4 = 3.6, 10 + 0.6 x 10 = 16;
    mean signed (-10 + 5 + 1 + 2 + 20) / 5 = 3.6."""
    g = accuracy.summary([-10.0, 5.0, 1.0, 2.0, 20.0], Counter(a=3, b=2))
    assert g == {
        "n": 5,
        "median_abs_pct": 5.0,
        "p90_abs_pct": 16.0,
        "max_abs_pct": 20.0,
        "mean_signed_pct": 3.6,
        "sets": {"a": 3, "b": 2},
    }


def test_a_run_counts_with_the_worse_of_first_contact_and_left_out():
    def case(first, left):
        return accuracy.CaseError(
            "f", "c", "speed", "p", "ampere", 8, (), today=1.0, left_out=left, first=first
        )

    assert case(None, -3.0).bar == -3.0  # no first contact: left out
    assert case(8.0, -3.0).bar == 8.0
    assert case(2.0, -12.0).bar == -12.0  # the code grew worse on it since first contact
    assert case(2.0, 2.0).bar == 2.0


@pytest.fixture(scope="module")
def measured():
    """Everything but the published runs' refits, which the file keeps (their recomputation is the slow test)."""
    return accuracy.measure(error_bar.stored()["leave_one_source_out"])


def test_the_shipped_error_bars_are_those_of_the_simulator_as_it_stands(measured):
    """A change that moves a prediction rewrites accuracy.yaml (python -m simulator.validation.accuracy)."""
    stored = error_bar.stored()
    assert (
        set(stored)
        == set(measured)
        == {"speed", "memory", "families", "files", "leave_one_source_out", "one_run"}
    )
    for kind, rows in measured["families"].items():  # each model family's record
        assert set(stored["families"][kind]) == set(rows), kind
        for family, g in rows.items():
            s = stored["families"][kind][family]
            assert (s["n"], s["sets"]) == (g["n"], g["sets"]), (kind, family)
            assert s["p90_abs_pct"] == pytest.approx(g["p90_abs_pct"], abs=0.02), (kind, family)
    for kind in ("speed", "memory"):
        assert set(stored[kind]) == set(measured[kind]), kind
        for key, g in measured[kind].items():
            s = stored[kind][key]
            assert (s["n"], s["sets"], s["first_contact"]) == (g["n"], g["sets"], g["first_contact"]), (
                kind,
                key,
            )
            for field in ("median_abs_pct", "p90_abs_pct", "max_abs_pct", "mean_signed_pct"):
                assert s[field] == pytest.approx(g[field], abs=0.02), (kind, key, field)
            assert s["today"] == pytest.approx(g["today"], abs=0.02), (kind, key)
    for name, f in measured["files"].items():
        for column in ("today", "left_out", "first_contact", "bar"):
            assert stored["files"][name][column] == pytest.approx(f[column], abs=0.02), (name, column)
    assert set(stored["one_run"]) == set(measured["one_run"])  # a calibrated profile's bar, by relation
    for rel, g in measured["one_run"].items():
        s = stored["one_run"][rel]
        assert (s["n"], s["sets"]) == (g["n"], g["sets"]), rel
        for field in ("median_abs_pct", "p90_abs_pct", "max_abs_pct", "mean_signed_pct"):
            assert s[field] == pytest.approx(g[field], abs=0.02), (rel, field)


@pytest.mark.slow
def test_the_published_runs_left_out_errors_are_those_of_the_refits_as_they_stand():
    """The published runs' leave-one-source-out errors the file keeps are the refits' (about 4 min)."""
    fresh = accuracy.published_left_out()
    stored = error_bar.stored()["leave_one_source_out"]
    assert set(fresh) == set(stored)
    for case_id, row in fresh.items():
        assert stored[case_id]["error_pct"] == pytest.approx(row["error_pct"], abs=0.01), case_id
        assert stored[case_id]["how"] == row["how"], case_id


def test_runs_a_profile_was_fitted_on_count_left_out_not_in_sample():
    """llm-foundry-2023 is fitted on MosaicML's MPT runs of published.yaml alone: left out, those runs and the 207 of
    MosaicML's own tables (llm-foundry.yaml, the same source) run with the reference factors; megatron-2021's are
    refitted on MEG20 without NAR21."""
    stored = error_bar.stored()["leave_one_source_out"]
    fitted = accuracy.fitted_case_ids()
    assert {"MPT-A100-125M", "MPT-H100-7B", "NAR21-T1-1.7B", "MCORE-H100-70B"} <= fitted <= set(stored)
    assert stored["MPT-A100-125M"]["how"] == "reference"
    assert stored["NAR21-T1-1.7B"]["how"].startswith("refitted on")
    files = error_bar.stored()["files"]["llm-foundry speed"]
    assert (
        files["left_out"]["median_abs_pct"] > files["today"]["median_abs_pct"]
    )  # in sample today, not left out


def test_every_shipped_case_has_a_first_contact_record():
    """Every case of every shipped validation file, but the exempt published suite, has its first-contact row
    (python -m simulator.validation.first_contact STEM before any change it prompts)."""
    records = first_contact.stored()
    for stem in accuracy.HELD_OUT:
        if stem in first_contact.EXEMPT:
            continue
        ids = {str(c["id"]) for c in load_cases(accuracy.HERE / f"{stem}.yaml")}
        missing = ids - set(records.get(stem, {}))
        assert not missing, f"{stem}: no first-contact record for {sorted(missing)[:5]}"
        for case_id in ids:
            row = records[stem][case_id]
            assert len(row["commit"]) >= 7 and row["status"] in ("ok", "off", "oom", "failed", "not stated")


def test_first_contact_reads_as_the_record_says():
    """deepspeed.yaml's Azure ZeRO-3 175B run, first predicted by 5ea8f4f1409d at 253.7 TFLOP/s against 204.49
    measured: +24.1% fast."""
    row = first_contact.stored()["deepspeed"]["DS-AZ22-175B-ZERO3"]
    assert row["run_by"] == "5ea8f4f1409d"
    assert first_contact.signed_error(row) == ("speed", pytest.approx(100 * (253.745531 / 204.49 - 1)))
    assert first_contact.signed_error({"status": "not stated"}) is None


def test_a_large_job_gets_the_error_of_large_jobs():
    """Over 512 GPUs, megatron-2022 on A100 has DeepSpeed's six public runs of 1,024-3,360 GPUs: the bar is theirs,
    and it says the simulation runs faster than they did; at 64 GPUs it is the 9-512 GPU runs'."""
    big = [c for c in load_cases(accuracy.HERE / "deepspeed.yaml") if c["cluster"]["num_nodes"] * 8 > 512]
    bar = error_bar.held_out("megatron-2022", "ampere", 1024)["speed"]
    assert bar["scope"] == "megatron-2022 on ampere at over 512 GPUs" and "note" not in bar
    assert bar["n"] == len(big) == 6 and bar["sets"] == {"deepspeed": 6}
    assert bar["mean_signed_pct"] > 10
    assert error_bar.scale_of(513) == "over 512 GPUs" and error_bar.scale_of(512) == "9-512 GPUs"
    assert (
        error_bar.held_out("megatron-2022", "ampere", 64)["speed"]["scope"]
        == "megatron-2022 on ampere at 9-512 GPUs"
    )
    assert error_bar.held_out("ideal", "ampere", 8) is None


def _cells(kind="speed"):
    """Every filled (profile, generation, job size) cell of the record."""
    groups = error_bar.stored()[kind]
    out = []
    for key, g in groups.items():
        name, _, rest = key.partition(" on ")
        if name != error_bar.ANY_PROFILE and " at " in rest and g["n"] >= error_bar.MIN_RUNS:
            arch, scale = rest.split(" at ")
            gpus = {"up to 8 GPUs": 8, "9-512 GPUs": 64, "over 512 GPUs": 1024}[scale]
            out.append((name, arch, gpus, g))
    return out


def test_a_run_on_an_unseen_gpu_gets_a_bar_at_least_as_wide_as_the_seen_ones():
    """MI300X (cdna3) has no measured run: every profile's bar there is the widest of its neighbouring cells, which
    hold the same profile on the generations it was measured on, and says so."""
    assert _cells()
    for name, _, gpus, g in _cells():
        unseen = error_bar.held_out(name, "cdna3", gpus)["speed"]
        assert unseen["p90_abs_pct"] >= g["p90_abs_pct"], (name, gpus)
        assert unseen["note"].startswith(f"only 0 measured runs for {name} on cdna3 at")


def test_a_profile_of_ones_own_is_an_unseen_stack_with_a_bar_at_least_as_wide():
    """A profile of one's own (a calibrated copy of a shipped one) gets the widest shipped profile's bar on its GPU
    generation and job size: never narrower than the shipped profile it was copied from."""
    from simulator.api import simulate
    from simulator.report.table import error_bar_lines
    from simulator.scenario.shipped import shipped_scenarios

    for name, arch, gpus, g in _cells():
        own = error_bar.held_out(name, arch, gpus, own=True)["speed"]
        assert own["p90_abs_pct"] >= g["p90_abs_pct"], (name, arch, gpus)
        assert own["note"].startswith("a profile of your own is an unseen stack")
    shipped = simulate(shipped_scenarios()["quickstart-gpt3-1.3b-ddp-8xa100"])
    mine = get_framework("pytorch-2024").model_copy(update={"gemm_efficiency": 0.5})
    m = simulate(shipped.scenario, framework=mine).metrics
    assert m.accuracy["speed"]["note"].startswith(
        "a profile of your own is an unseen stack (pytorch-2024 on ampere"
    )
    assert "(a profile of your own is an unseen stack (pytorch-2024 on ampere" in error_bar_lines(m)[0]


def test_run_reports_its_error_bar_and_why_it_is_a_neighbours():
    """The quickstart runs pytorch-2024 on 8 A100: no measured run of that profile at up to 8 A100s, so the bar is
    the widest neighbouring cell's, and the table and JSON say so."""
    out = CliRunner().invoke(app, ["run", "quickstart", "--json"])
    assert out.exit_code == 0, out.output
    bar = json.loads(out.output)["accuracy"]["speed"]
    assert bar["note"] == (
        "only 0 measured runs for pytorch-2024 on ampere at up to 8 GPUs: the widest neighbouring cell"
    )
    ring = error_bar.neighbours("pytorch-2024", "ampere", "up to 8 GPUs", error_bar.stored()["speed"], False)[
        0
    ]
    assert bar["scope"] in ring
    groups = error_bar.stored()["speed"]
    assert bar["p90_abs_pct"] == max(
        groups[c]["p90_abs_pct"] for c in ring if groups.get(c, {}).get("n", 0) >= 5
    )
    table = CliRunner().invoke(app, ["run", "quickstart"])
    assert table.exit_code == 0, table.output
    text = " ".join(table.output.split())
    assert "Speed error bar, median / p90" in text
    assert (
        f"Speed error bar: {bar['scope']} (only 0 measured runs for pytorch-2024 on ampere at up to 8 GPUs: the widest "
        f"neighbouring cell), {bar['n']} measured runs the code had not seen" in text
    )


def test_model_families_by_hand():
    """A dense GPT is no family; DeepSeek-V3 is MoE with MLA; Nemotron-H is a hybrid Mamba-2 stack; GPT-OSS is
    MoE with a sliding window."""
    from simulator.scenario.loader import load_scenario
    from simulator.scenario.shipped import shipped_scenarios

    shipped = shipped_scenarios()

    def fam(name):
        return error_bar.families(load_scenario(shipped[name]).model)

    assert fam("quickstart-gpt3-1.3b-ddp-8xa100") == ()
    assert fam("nemotron-h-8b-tp2-64xh100") == ("hybrid Mamba-2 layers",)
    assert {"mixture of experts", "multi-latent attention"} <= set(fam("deepseek-v3-ep64-1024xh100"))
    assert fam("gpt-oss-120b-ep8-64xh100") == ("mixture of experts", "sliding-window attention")


def test_a_model_family_the_record_barely_holds_is_an_unseen_workload():
    """The record holds fewer than 5 runs of chunked local attention (Llama 4's): such a run's bar says so and is
    the widest of the neighbouring cells an unseen stack gets and the few runs it has, never narrower than the run's
    own cell; a family the record holds 5 or more runs of (MoE; hybrid Mamba-2 stacks since Megatron-Bridge's 26.06
    rows) widens the bar to its own record where that is wider."""
    record = error_bar.stored()["families"]["speed"]
    assert record.get("chunked local attention", {"n": 0})["n"] < error_bar.MIN_RUNS
    assert record["mixture of experts"]["n"] >= error_bar.MIN_RUNS
    assert record["hybrid Mamba-2 layers"]["n"] >= error_bar.MIN_RUNS
    for name, arch, gpus, _ in _cells():
        plain = error_bar.held_out(name, arch, gpus)["speed"]
        chunked = error_bar.held_out(name, arch, gpus, kinds=("chunked local attention",))["speed"]
        assert chunked["p90_abs_pct"] >= plain["p90_abs_pct"], (name, arch, gpus)
        assert "of models with chunked local attention: an unseen workload" in chunked["note"]
        # GPT-OSS's runs (sliding windows): a family further off than every neighbour widens the bar to its own
        windowed = error_bar.held_out(name, arch, gpus, kinds=("sliding-window attention",))["speed"]
        assert windowed["p90_abs_pct"] >= record["sliding-window attention"]["p90_abs_pct"]
        for family in ("mixture of experts", "hybrid Mamba-2 layers"):
            bar = error_bar.held_out(name, arch, gpus, kinds=(family,))["speed"]
            assert bar["p90_abs_pct"] == max(plain["p90_abs_pct"], record[family]["p90_abs_pct"])
            assert ("note" in bar) == (bar["p90_abs_pct"] > plain["p90_abs_pct"] or "note" in plain)


def test_a_run_of_an_unseen_family_reports_it():
    """`run` of the shipped Llama 4 Maverick scenario (chunked local attention, which the record barely holds): the
    JSON's bar names the family, and the table's line says why."""
    out = CliRunner().invoke(app, ["run", "llama4-maverick-ep16-256xh100", "--json"])
    assert out.exit_code == 0, out.output
    bar = json.loads(out.output)["accuracy"]["speed"]
    assert (
        "models with chunked local attention: an unseen workload, the widest neighbouring cell" in bar["note"]
    )
