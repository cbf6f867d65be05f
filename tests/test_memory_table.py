"""clustersim memory: per-GPU memory across data-parallel strategies and recompute choices (study/memory_table.py)."""

import json

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.scenario.loader import load_scenario
from simulator.study.memory_table import memory_table
from simulator.workload.transformer import build_workload

QUICKSTART = "quickstart-gpt3-1.3b-ddp-8xa100"


def rows_by(s):
    return {(r.strategy, r.recompute): r for r in memory_table(s)}


def test_model_states_follow_the_zero_paper_across_strategies():
    """Mixed-precision Adam, 8 data-parallel ranks (Rajbhandari et al. SC20 Fig. 1): DDP keeps 2 + 2 + 12 bytes per
    parameter; ZeRO-1 shards the 12 over 8, ZeRO-2 the gradients too, ZeRO-3 the weights too."""
    s = load_scenario(_path(QUICKSTART))
    psi = build_workload(s).params_per_rank / 2**30
    rows = rows_by(s)
    ddp, z1, z2, z3 = (rows[(k, "none")].gib for k in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"))
    assert ddp["optimizer"] == pytest.approx(12 * psi, rel=1e-9)
    assert z1["optimizer"] == pytest.approx(12 * psi / 8, rel=1e-9)
    assert (ddp["grads"], z1["grads"]) == (pytest.approx(2 * psi, rel=1e-9), pytest.approx(2 * psi, rel=1e-9))
    assert z2["grads"] == pytest.approx(2 * psi / 8, rel=1e-9)
    assert z3["params"] < z2["params"] == pytest.approx(2 * psi, rel=1e-9)
    assert rows[("DDP", "full")].gib["activations"] < rows[("DDP", "none")].gib["activations"]
    assert rows[("DDP", "none")].current and sum(r.current for r in rows.values()) == 1


def test_a_strategy_the_scenario_cannot_take_is_one_row_with_its_reason():
    s = load_scenario(_path("llama3.1-70b-fp8-64xh100", "fp8"))
    rows = memory_table(s)
    zero2 = [r for r in rows if r.strategy == "ZeRO-2"]
    assert len(zero2) == 1 and zero2[0].gib is None and "pipeline_parallel (4)" in zero2[0].reason
    assert [r.recompute for r in rows if r.current] == ["none"]


def test_cli_table_and_json():
    r = CliRunner().invoke(app, ["memory", QUICKSTART, "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert {d["strategy"] for d in data} >= {
        "DDP",
        "ZeRO-1",
        "ZeRO-2",
        "ZeRO-3",
        "FSDP",
        "ZeRO-Infinity (NVMe)",
    }
    assert all(d["fits"] for d in data)  # 1.3B on 80 GB fits every way
    table = CliRunner().invoke(app, ["memory", QUICKSTART]).output
    assert "GiB per GPU (80 GiB GPUs)" in table and "ZeRO-3" in table


def _path(name, sub=""):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "scenarios"
    return root / sub / f"{name}.yaml"
