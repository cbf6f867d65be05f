"""clustersim plan: layouts screened by the estimate and confirmed by simulation, on cases known by hand."""

import json
import math
import re

import pytest
from typer.testing import CliRunner

from simulator import load_scenario
from simulator.cli import app
from simulator.errors import ScenarioError
from simulator.hardware.cluster import Cluster
from simulator.hardware.topology import cluster_spec
from simulator.study.layout import Layout
from simulator.study.layouts import candidates, hsdp_shards
from simulator.study.plan import Confirmed, plan, screen_accuracy


def plan_args(model: str, gpus: int, batch: int) -> list[str]:
    """``clustersim plan`` for ``model`` on ``gpus`` DGX A100 GPUs at global batch ``batch``."""
    return [
        "plan",
        "--model",
        model,
        "--topology",
        "dgx-a100",
        "--gpus",
        str(gpus),
        "--global-batch-size",
        str(batch),
    ]


PLAN_ARGS = plan_args("gpt3-1.3b", 8, 16)

runner = CliRunner()

MODEL = {
    "num_layers": 8,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "seq_length": 1024,
    "vocab_size": 32000,
}


def base(model=MODEL, batch=64, nodes=1):
    return load_scenario(
        {
            "name": "plan-test",
            "framework": "ideal",
            "model": {**model, "attention": "flash"},
            "cluster": {"topology": "dgx-a100", "num_nodes": nodes},
            "training": {"global_batch_size": batch, "micro_batch_size": 1, "precision": "bf16"},
        }
    )


def test_candidates_divide_the_model_the_batch_and_the_gpus():
    layouts = candidates(
        base(), 8, 8, {"shardings": ("ddp",), "recompute": ("none",), "micro_batch_sizes": (2,)}
    )
    assert Layout(1, 1, 1, 8, 1, 2, "ddp", "none") in layouts
    assert all(lay.tp * lay.pp * lay.cp * lay.dp == 8 for lay in layouts)
    assert all(8 % lay.pp == 0 and 16 % lay.tp == 0 and 64 % (lay.mbs * lay.dp) == 0 for lay in layouts)
    # interleaving only where the microbatches are a multiple of the stages
    assert all((64 // (lay.mbs * lay.dp)) % lay.pp == 0 for lay in layouts if lay.v > 1)


def test_a_small_model_on_one_node_is_best_data_parallel():
    """By hand: a 100M-parameter model fits whole on every GPU, so tensor parallelism only adds all-reduces to
    every layer and pipelining only adds a bubble; pure data parallelism, its gradient all-reduce hidden under
    backward, is fastest. The confirmed ranking puts TP1 PP1 DP8 first."""
    r = plan(
        base(), 8, top=6, options={"shardings": ("ddp",), "recompute": ("none",), "micro_batch_sizes": (2,)}
    )
    best = r["top"][0]
    assert (best["tp"], best["pp"], best["dp"], best["status"]) == (1, 1, 8, "ok")
    assert r["screened"] >= 6 and r["confirmed"] == 6
    others = [t for t in r["top"][1:] if t["status"] == "ok"]
    assert others and all(t["iteration_time_s"] > best["iteration_time_s"] for t in others)
    assert "beats" in r["why"]


def test_a_model_too_big_to_replicate_is_sharded():
    """By hand: 6.5B parameters need 16 B each with DDP, 104 GB per GPU, more than 80 GB; sharding the optimizer
    states (ZeRO-1: 2 + 2 + 12/8 B, 36 GB) or more, or splitting the model (TP x PP >= 2), fits. So no
    unsplit DDP layout is proposed, and every confirmed one fits."""
    big = {
        "num_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "seq_length": 2048,
        "vocab_size": 32000,
    }
    r = plan(base(big, batch=32), 8, top=3, options={"recompute": ("full",), "micro_batch_sizes": (1,)})
    for t in r["top"]:
        assert t["sharding"] != "ddp" or t["tp"] * t["pp"] > 1
    ok = [t for t in r["top"] if t["status"] == "ok"]
    assert ok and all(t["memory_gib"] < 80 for t in ok)


def test_cli_plan_json_and_bad_gpu_count():
    runner = CliRunner()
    r = runner.invoke(app, [*PLAN_ARGS, "--top", "2", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert {"screened", "screened_per_s", "confirmed", "top", "why"} <= set(d)
    assert d["confirmed"] == 2 and d["top"][0]["iteration_time_s"] > 0
    r = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "gpt3-1.3b",
            "--gpus",
            "12",
            "--topology",
            "dgx-a100",
            "--global-batch-size",
            "16",
        ],
    )
    assert r.exit_code == 2 and "whole number" in r.output


def test_stored_calculon_searches_load_as_scenarios_with_their_degrees():
    """benchmarks/calculon_compare.py reads Calculon's stored picks (docs/measurements/calculon-*.json): each is a
    valid scenario here with Calculon's tensor / pipeline / data degrees, batch and micro-batch."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    bench = root / "benchmarks" / "calculon_compare.py"
    if not bench.exists():
        pytest.skip("benchmarks/ not in this checkout")
    spec = importlib.util.spec_from_file_location("calculon_compare", bench)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, shape in mod.CASES.items():
        stored = json.loads((root / "docs" / "measurements" / f"calculon-{name}.json").read_text())
        assert stored["top"] and stored["executions"] > 1_000_000
        for row in stored["top"].values():
            e = row["execution"]
            s = mod.scenario_of(name, e)
            p = s.parallelism
            assert (p.tensor_parallel, p.pipeline_parallel, p.data_parallel) == (
                e["tensor_par"],
                e["pipeline_par"],
                e["data_par"],
            )
            assert p.tensor_parallel * p.pipeline_parallel * p.data_parallel == shape["gpus"]
            assert s.training.global_batch_size == e["batch_size"]
            assert s.training.micro_batch_size == e["microbatch_size"]
            assert row["stats"]["total_time"] > 0


def _screen(nodes: int):
    from simulator.hardware.cluster import Cluster
    from simulator.hardware.topology import cluster_spec
    from simulator.study.screen import Screen

    b = base(batch=nodes * 8 * 2, nodes=nodes)
    cluster = Cluster(cluster_spec(b), nodes)
    return Screen(b, cluster), cluster


def test_zero3_estimate_costs_every_deepspeed_call():
    """The screen costs DeepSpeed ZeRO-3 as the simulation's replay of its coordinator issues it: every
    all-gather (per module, prefetch, re-gather) and every bucket's reduce-scatter a ring of its own size, split
    by the phase whose compute can hide it. Here backward gathers nothing (the model is kept from its forward),
    so backward's calls are its reduce-scatters, one after another."""
    from simulator.strategy.state_bytes import grad_bytes, weight_bytes
    from simulator.strategy.zero import fetch_schedule

    screen, _ = _screen(16)
    lay = Layout(1, 1, 1, 128, 1, 1, "zero3", "none")
    _, f, b, rc, _, w, s, _ = screen._block_times(lay)
    fs = fetch_schedule(s, w)
    wb, gb = weight_bytes(s), grad_bytes(s, screen.framework)
    by_hand = {"forward": 0.0, "backward": 0.0}
    for g in fs.gathers:
        by_hand[g.block[1]] += screen.ring_s("all_gather", 128, 8, g.numel * wb)
    for r in fs.reduces:
        by_hand["backward"] += screen.ring_s("reduce_scatter", 128, 8, r.numel * gb)
    fwd, bwd, rs = screen._zero3_calls_s(s, w, 128, 8)
    assert (fwd, bwd, rs) == pytest.approx(
        (by_hand["forward"], by_hand["backward"], by_hand["backward"]), rel=1e-12
    )
    # with DeepSpeed's defaults (prefetch bucket 5e7 elements, reuse distance 1e9) this model is gathered once,
    # in prefetch calls of just over 5e7 elements each, and kept until its backward; the norms and biases (under
    # the 1e5-element persistence threshold: 8 x 13,312 + 2,048) stay whole on every rank
    assert fs.persistent == 8 * (4 * 1024 + 3 * 1024 + 1024 + 4 * 1024 + 1024) + 2 * 1024
    assert sum(g.numel for g in fs.gathers) == w.params_per_rank - fs.persistent
    assert len(fs.gathers) == math.ceil(w.params_per_rank / 5e7)
    e = screen.estimate(lay)
    gas = 2
    exposed = gas * (max(0.0, fwd - 8 * f) + max(0.0, bwd - 8 * (b + rc)))
    assert e.comm_s == pytest.approx(exposed, rel=1e-12) and exposed > 0


def test_zero3_backward_gathers_and_reductions_queue_on_one_nccl_stream():
    """With a reuse distance of 0 and no prefetching, every layer is gathered again for its backward, while its
    gradient buckets are reduce-scattered: both are the data-parallel group's collectives, which PyTorch runs on
    the group's one NCCL stream in issue order (strategy/zero3_replay.py DP_NCCL_STREAM), so the screen charges
    backward their sum, as the simulation runs them."""
    from simulator.hardware.cluster import Cluster
    from simulator.hardware.topology import cluster_spec
    from simulator.strategy.state_bytes import grad_bytes, weight_bytes
    from simulator.strategy.zero import fetch_schedule
    from simulator.study.screen import Screen

    b = base(nodes=16, batch=128)
    zero = b.parallelism.zero.model_copy(
        update={"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0, "reduce_bucket_size": 2e6}
    )
    b = b.model_copy(update={"parallelism": b.parallelism.model_copy(update={"zero": zero})})
    screen = Screen(b, Cluster(cluster_spec(b), 16))
    lay = Layout(1, 1, 1, 128, 1, 1, "zero3", "none")
    s, w = screen.scenario(lay), screen._block_times(lay)[5]
    fs = fetch_schedule(s, w)
    wb, gb = weight_bytes(s), grad_bytes(s, screen.framework)
    ag = [
        screen.ring_parts("all_gather", 128, 8, g.numel * wb) for g in fs.gathers if g.block[1] == "backward"
    ]
    rs = [screen.ring_parts("reduce_scatter", 128, 8, r.numel * gb) for r in fs.reduces]
    assert len(ag) > 8 and len(rs) > 8  # every layer re-gathered; buckets of 2e6 elements
    whole_ag, whole_rs = sum(a + t for a, t in ag), sum(a + t for a, t in rs)
    _, bwd, held = screen._zero3_calls_s(s, w, 128, 8)
    assert bwd == pytest.approx(whole_ag + whole_rs, rel=1e-12)
    assert held == pytest.approx(whole_rs, rel=1e-12)


def test_fsdp_estimate_pays_one_ring_latency_per_unit():
    """On 128 ranks the small model's FSDP calls are latency-bound (n - 1 ring steps each, one per unit and
    pass): the estimate follows the simulation within 10%, where one gather for the whole model would be
    half of it."""
    from simulator import simulate

    screen, cluster = _screen(16)
    lay = Layout(1, 1, 1, 128, 1, 1, "fsdp", "none")
    e = screen.estimate(lay)
    m = simulate(screen.scenario(lay), cluster=cluster).metrics
    assert e.iteration_s == pytest.approx(m.iteration_time_s, rel=0.10)
    _, f, b, rc, _, w, s, _ = screen._block_times(lay)
    whole = screen.ring_s("all_gather", 128, 8, w.params_per_rank * 2)
    assert e.compute_s + 2 * max(0.0, 2 * whole - 8 * (f + b)) < 0.6 * m.iteration_time_s


MOE = {
    **MODEL,
    "activation": "swiglu",
    "normalization": "rmsnorm",
    "position_embedding": "rope",
    "add_bias_linear": False,
    "tied_embeddings": False,
    "moe": {"num_experts": 16, "top_k": 2, "ffn_hidden_size": 4096},
}


def test_mixture_of_experts_layouts_fold_expert_parallelism_over_the_ranks():
    """Every MoE layout's ETP x EP divides its TP x CP x DP, EP divides the 16 experts, ETP is 1 or TP, and the
    sharding is one the MoE frameworks run (no ZeRO-3 or FSDP)."""
    layouts = candidates(base(MOE), 8, 8, {"recompute": ("none",), "micro_batch_sizes": (1,)})
    assert layouts and {lay.ep for lay in layouts} == {1, 2, 4, 8}
    for lay in layouts:
        assert (lay.tp * lay.cp * lay.dp) % (lay.ep * lay.etp) == 0 and 16 % lay.ep == 0
        assert lay.etp in (1, lay.tp) and lay.sharding in ("ddp", "zero1", "zero2")
    assert "EP8" in Layout(1, 1, 1, 8, 1, 1, "zero1", "none", 8, 1).label()


def test_plan_confirms_expert_parallel_layouts_by_simulation():
    """16 experts of 3 x 1024 x 4096 each on 8 layers: a whole copy's states (16 B per parameter) on every GPU
    wastes memory and time; the best confirmed layouts split the experts (EP > 1) and each simulates with its
    expert-parallel all-to-all."""
    r = plan(base(MOE, batch=32), 8, top=4, options={"recompute": ("none",), "micro_batch_sizes": (1,)})
    ok = [t for t in r["top"] if t["status"] == "ok"]
    assert ok and ok[0]["ep"] > 1
    assert all(t["iteration_time_s"] > 0 for t in ok)


def test_plan_at_80_columns_wraps_the_layout_and_never_cuts_a_number():
    r = CliRunner().invoke(app, [*PLAN_ARGS, "--top", "3"], env={"COLUMNS": "80"}, terminal_width=80)
    assert r.exit_code == 0, r.output
    table = [line for line in r.output.splitlines() if line.strip()[:1].isdigit()]
    assert table and all(
        len(line) <= 80 for line in r.output.splitlines() if "│" in line or line.startswith(" ")
    )
    assert "…" not in r.output  # no cell cut short
    d = json.loads(CliRunner().invoke(app, [*PLAN_ARGS, "--top", "3", "--json"]).output)
    for row in d["top"]:  # every simulated time appears whole in the table
        assert f"{row['iteration_time_s']:.3f}" in r.output


def test_plan_writes_runnable_scenarios_and_days_to_train(tmp_path):
    from simulator.api import simulate
    from simulator.scenario.loader import load_scenario

    out = tmp_path / "layouts"
    r = CliRunner().invoke(
        app, [*PLAN_ARGS, "--top", "2", "--tokens", "300B", "--write-scenario", str(out), "--json"]
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    files = sorted(out.glob("*.yaml"))
    assert [str(f) for f in files] == sorted(d["written"]) and len(files) == 2
    best = d["top"][0]
    again = simulate(load_scenario(files[0])).metrics.iteration_time_s
    assert again == pytest.approx(best["iteration_time_s"], rel=1e-9)  # the file is the layout simulated
    tokens_per_s = 16 * 2048 / best["iteration_time_s"]
    assert best["days_to_train"] == pytest.approx(300e9 / tokens_per_s / 86400, rel=1e-12)
    bad = CliRunner().invoke(app, [*PLAN_ARGS, "--tokens", "lots"])
    assert bad.exit_code == 2 and "--tokens" in bad.output


def test_constraints_narrow_the_search_and_each_bad_list_is_one_line():
    """--tp / --pp / --mbs / --sharding / --no-zero3 / --recompute / --max-memory-gib: every confirmed layout
    keeps to them, the budget holds in the simulation too; a bad list names the option."""
    args = plan_args("gpt3-350m", 16, 64)
    narrow = ["--tp", "1,2", "--pp", "1,2", "--mbs", "1,2", "--no-zero3", "--max-memory-gib", "12"]
    r = runner.invoke(app, [*args, *narrow, "--top", "4", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["memory_budget_gib"] == 12
    ok = [t for t in d["top"] if t["status"] == "ok"]
    assert ok
    for t in d["top"]:
        assert t["tp"] in (1, 2) and t["pp"] in (1, 2) and t["mbs"] in (1, 2)
        assert t["sharding"] not in ("zero3", "fsdp", "hsdp", "zero3-offload")
    assert all(t["memory_gib"] <= 12 for t in ok)
    for option, value, message in [
        ("--tp", "1,x", "error: --tp: expected whole numbers separated by commas, e.g. 1,2,4 (got '1,x')"),
        ("--pp", "0", "error: --pp: each size must be between 1 and 131,072 (got '0')"),
        (
            "--sharding",
            "zero4",
            "error: --sharding: zero4 is not one of ddp, zero1, zero2, zero3, fsdp, hsdp, zero2-offload, zero3-offload",
        ),
        ("--recompute", "some", "error: --recompute: some is not one of none, selective, full"),
        ("--emit", "nemo", "error: --emit: 'nemo' is not one of megatron, deepspeed, torchtitan"),
    ]:
        r = runner.invoke(app, [*args, option, value])
        assert r.exit_code == 2 and r.stderr.strip() == message, r.stderr


def test_near_duplicates_fold_into_one_row_and_a_tie_is_said_as_one():
    """Layouts of one shape that differ only in sharding / recompute and take the same time are one row, the
    others named beside it; no two confirmed rows of one shape are within 0.5%; the closing sentence never says
    'by 0.000 s'. (NCCL's SMs off: DDP's and ZeRO-1's reductions then overlap alike and the two tie.)"""
    s = base()
    s = s.model_copy(update={"cluster": s.cluster.model_copy(update={"nccl_sm_contention": False})})
    r = plan(s, 8, top=5, options={"micro_batch_sizes": (2,), "tp": (1,), "pp": (1,)})
    ok = [t for t in r["top"] if t["status"] == "ok"]
    assert r["collapsed"] > 0 and any(t["same_time"] for t in ok)
    for i, a in enumerate(ok):
        for b in ok[i + 1 :]:
            same_shape = all(a[k] == b[k] for k in ("tp", "pp", "cp", "dp", "v", "mbs"))
            assert not same_shape or abs(a["iteration_time_s"] - b["iteration_time_s"]) > 0.005 * min(
                a["iteration_time_s"], b["iteration_time_s"]
            )
    assert "0.000 s" not in r["why"]


def test_why_names_a_tie_and_the_lighter_layout():
    from simulator.study.plan import Confirmed, why

    def row(sharding, t, gib):
        return Confirmed(Layout(1, 1, 1, 8, 1, 2, sharding, "none"), t, t, 0.5, gib, 0.0, 0.01, t, "ok")

    text = why([row("ddp", 1.0000, 30.0), row("zero1", 1.0004, 20.0)])
    assert text.startswith(
        "TP1 PP1 DP8 mbs2 ddp rc:none and TP1 PP1 DP8 mbs2 zero1 rc:none take the same time"
    )
    # the lighter layout's own memory first (the sentence read "zero1 needs less memory (30.0 against 20.0)")
    assert text.endswith("TP1 PP1 DP8 mbs2 zero1 rc:none needs less memory (20.0 against 30.0 GiB per GPU)")
    assert "by 45.00 ms (4.3%)" in why([row("ddp", 1.0, 30.0), row("zero1", 1.045, 20.0)])


def test_why_never_reports_a_negative_wait():
    """Busy time and exposed communication overlap where a tensor-parallel all-reduce runs inside a step: what is
    left for waiting is then none, never negative (it read "-170400.1 us against -140197.3 us")."""
    from simulator.study.plan import Confirmed, seconds, why

    def row(t, busy, exposed):
        lay = Layout(2, 1, 1, 8, 1, 16, "ddp", "none")
        return Confirmed(lay, t, t, 0.5, 50.0, 0.0, exposed, busy, "ok")

    text = why([row(1.993, 1.99, 0.17), row(2.018, 1.90, 0.20)])
    assert "-" not in text.split("mostly in")[1], text
    assert seconds(-0.1704) == "-0.170 s" and seconds(-2e-5) == "-20.0 us" and seconds(12.34) == "12.3 s"


def test_a_layout_that_simulates_over_the_budget_says_why():
    """A layout that passes the screen and simulates over the budget is marked oom with both figures. (Since
    2026-12-06 the screen counts what the simulation adds, the CUDA context, NCCL's buffers, ZeRO's buckets, FP8
    copies, so a plan rarely meets one: the row is made from a simulated layout's numbers over a smaller budget.)"""
    from simulator.study.plan import _confirm, _confirmed
    from simulator.study.screen import Screen

    b = base()
    r = plan(b, 8, top=1, options={"micro_batch_sizes": (8,), "shardings": ("ddp",)})
    top = r["top"][0]
    lay = Layout(*(top[k] for k in ("tp", "pp", "cp", "dp", "v", "mbs", "sharding", "recompute")))
    screen = Screen(b, Cluster(cluster_spec(b), 1), None, 8)
    s = screen.scenario(lay)
    m = _confirm(s)
    budget = m["device_gib"] - 0.5
    c = _confirmed(screen.estimate(lay), s, m, budget, budget)
    assert c.status == "oom"
    assert f"GiB per GPU > {budget:.2f} GiB (--max-memory-gib); the screen estimated" in c.reason


def test_emit_gives_the_pick_in_each_framework_s_own_names():
    from simulator.study.emit import emit_text

    row = {
        "tp": 4,
        "pp": 2,
        "cp": 1,
        "dp": 8,
        "v": 2,
        "mbs": 1,
        "sharding": "zero1",
        "recompute": "full",
        "ep": 1,
        "etp": 1,
        "scenario": {"model": {"num_layers": 32, "seq_length": 4096}, "training": {"global_batch_size": 256}},
    }
    megatron = emit_text(row, "megatron")
    for arg in [
        "--tensor-model-parallel-size 4",
        "--pipeline-model-parallel-size 2",
        "--num-layers-per-virtual-pipeline-stage 8",
        "--sequence-parallel",
        "--micro-batch-size 1",
        "--global-batch-size 256",
        "--use-distributed-optimizer",
        "--recompute-granularity full",
    ]:
        assert arg in megatron, arg
    ds = json.loads(emit_text(row, "deepspeed"))  # valid JSON alone: the notes go beside it
    assert ds == {
        "train_batch_size": 256,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 32,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1},
    }
    import tomllib

    titan = tomllib.loads(emit_text(row, "torchtitan"))
    assert titan["parallelism"] == {
        "data_parallel_replicate_degree": 8,
        "data_parallel_shard_degree": 1,
        "tensor_parallel_degree": 4,
        "pipeline_parallel_degree": 2,
        "pipeline_parallel_schedule": "Interleaved1F1B",
        "pipeline_parallel_microbatch_size": 1,
        "pipeline_parallel_layers_per_stage": 8,
        "context_parallel_degree": 1,
    }
    assert titan["training"]["local_batch_size"] == 32 and titan["activation_checkpoint"]["mode"] == "full"
    # the scenario's overlaps, recompute modules and torch.compile, in each framework's names
    row = {**row, "recompute": "selective", "ep": 8}
    row["scenario"] = {
        **row["scenario"],
        "training": {
            "global_batch_size": 256,
            "compile": True,
            "recompute": {"modules": ["moe_act", "layernorm"]},
        },
        "parallelism": {"tp_comm_overlap": "async", "moe": {"overlap_a2a": True}},
    }
    megatron = emit_text(row, "megatron")
    assert (
        "--recompute-modules moe_act layernorm" in megatron
        and "--overlap-moe-expert-parallel-comm" in megatron
    )
    args = [line.rstrip(" \\") for line in megatron.splitlines() if not line.startswith("#")]
    assert "--tp-comm-overlap" not in args and "async TP is PyTorch's" in megatron
    titan = tomllib.loads(emit_text(row, "torchtitan"))
    assert titan["parallelism"]["enable_async_tensor_parallel"] is True and titan["compile"] == {
        "enable": True
    }


def test_emit_states_hsdp_as_torchtitan_s_replicate_and_shard_degrees():
    """HSDP over 8 of 64 data-parallel ranks: torchtitan's mesh replicate 8 x shard 8; Megatron-LM and DeepSpeed
    have no hybrid switch and say so, naming their nearest."""
    import tomllib

    from simulator.study.emit import emit_notes, emit_text

    row = {"tp": 1, "pp": 1, "cp": 1, "dp": 64, "v": 1, "mbs": 2, "sharding": "hsdp", "shard": 8}
    row |= {"recompute": "full", "ep": 1, "etp": 1, "scenario": {"training": {"global_batch_size": 256}}}
    titan = tomllib.loads(emit_text(row, "torchtitan"))["parallelism"]
    assert (titan["data_parallel_replicate_degree"], titan["data_parallel_shard_degree"]) == (8, 8)
    megatron = emit_text(row, "megatron")
    assert "--use-torch-fsdp2" in megatron and "# HSDP (shard groups of 8 ranks, 8 replicas)" in megatron
    ds = emit_text(row, "deepspeed")
    assert json.loads(ds)["zero_optimization"] == {"stage": 3}
    assert any("zero_hpz_partition_size: 8" in n for n in emit_notes(row, "deepspeed"))


def test_confirming_on_a_process_pool_gives_the_same_plan():
    """--jobs N simulates N layouts at once and folds them in estimate order: the same rows, times and folds as
    one at a time."""
    one = plan(base(), 8, top=4, options={"micro_batch_sizes": (2,), "jobs": 1})
    two = plan(base(), 8, top=4, options={"micro_batch_sizes": (2,), "jobs": 2})
    keys = ("layout", "iteration_time_s", "status", "same_time")
    assert [tuple(t[k] for k in keys) for t in one["top"]] == [tuple(t[k] for k in keys) for t in two["top"]]
    assert one["collapsed"] == two["collapsed"] and one["why"] == two["why"]


def test_plan_says_what_validation_says_of_its_profile():
    """Issue 32 item 4: the caveat line under the table is the profile's own accuracy note (held out first); every
    shipped profile that published runs validate has one."""
    from simulator.frameworks import get_framework

    r = plan(base(), 8, top=1, options={"micro_batch_sizes": (2,), "shardings": ("ddp",)})
    assert (
        r["caveat"] == "caveat (ideal profile): no published run validates this profile; docs/validation.md"
    )
    assert r["error_bar"] is None  # a bound has no error bar
    from simulator.study.plan import caveat, error_bar

    bar = error_bar("megatron-2022", "ampere", 1024)
    assert bar["speed"]["scope"] == "megatron-2022 on ampere at over 512 GPUs"
    assert caveat("megatron-2022", bar).startswith(
        f"caveat (megatron-2022 profile): {bar['speed']['median_abs_pct']:.1f}% median, "
        f"{bar['speed']['p90_abs_pct']:.1f}% p90 |error| on 6 measured runs the code had not seen (megatron-2022 on "
        "ampere at over 512 GPUs, mean signed +"
    )
    for name in ("megatron-2021", "megatron-2022", "megatron-core-2024", "llm-foundry-2023", "pytorch-2024"):
        assert "%" in get_framework(name).accuracy, name


def test_confirming_on_dask_gives_the_same_plan():
    pytest.importorskip("dask.distributed")
    one = plan(base(), 8, top=3, options={"micro_batch_sizes": (2,), "jobs": 1})
    on_dask = plan(base(), 8, top=3, options={"micro_batch_sizes": (2,), "jobs": 2, "dask": "local"})
    keys = ("layout", "iteration_time_s", "status", "same_time")
    assert [tuple(t[k] for k in keys) for t in one["top"]] == [
        tuple(t[k] for k in keys) for t in on_dask["top"]
    ]


def test_a_base_with_recompute_modules_still_plans_other_recompute_policies():
    data = base().model_dump(mode="json", exclude_none=True)
    data["training"] = {
        **data["training"],
        "activation_recompute": "selective",
        "recompute": {"modules": ["core_attn"]},
    }
    data["training"]["recompute"]["modules"] = ["core_attn", "layernorm"]
    r = plan(
        load_scenario(data), 8, top=2, options={"micro_batch_sizes": (2,), "recompute": ("none", "selective")}
    )
    assert r["screened_invalid"] == 0 and r["top"][0]["status"] == "ok"


def test_hsdp_shard_groups_fill_whole_nodes_and_leave_replicas():
    """HSDP shard groups of 1, 2, 4 or 8 whole nodes, at least two replicas: on 4 nodes of 8 GPUs, TP 1 shards
    over 8 or 16 ranks (32 would be FSDP), TP 2 over 4 or 8 data-parallel ranks, TP 4 over 2 or 4, TP 8 over 2 (two
    nodes; one node would hold a single data-parallel rank); no HSDP with pipelining."""
    layouts = candidates(
        base(nodes=4),
        32,
        8,
        {"shardings": ("hsdp",), "recompute": ("none",), "micro_batch_sizes": (1,)},
    )
    shards = {}
    for lay in layouts:
        assert lay.sharding == "hsdp" and lay.pp == 1 and lay.dp % lay.shard == 0
        assert lay.label().endswith(f"hsdp{lay.shard} rc:none")
        assert lay.parallelism()["fsdp"] == {"hybrid_shard_size": lay.shard}
        shards.setdefault(lay.tp, set()).add(lay.shard)
    assert shards == {1: {8, 16}, 2: {4, 8}, 4: {2, 4}, 8: {2}}
    # a sequence long enough for context parallelism: HSDP only where CP is 1, every shard size one it can take
    long = candidates(base({**MODEL, "seq_length": 8192}, nodes=4), 32, 8, {"shardings": ("hsdp",)})
    assert long and {lay.cp for lay in long} == {1}
    assert all(lay.shard in hsdp_shards(lay.tp, lay.dp, 8) for lay in long)
    cp = candidates(base({**MODEL, "seq_length": 8192}, nodes=4), 32, 8, {"shardings": ("fsdp",)})
    assert {lay.cp for lay in cp} > {1}  # the same space without HSDP does take CP
    args = plan_args("gpt3-350m", 8, 64)
    args += ["--sharding", "hsdp"]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "HSDP shards over 1, 2, 4 or 8 whole nodes and needs two replicas" in r.stderr


SEVEN_B = {
    "num_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "seq_length": 2048,
    "vocab_size": 32000,
}


def test_plan_keeps_the_gathers_on_nvlink_with_hsdp_on_a_slow_network():
    """By hand: 6.5B parameters over 16 nodes with one 100 Gb/s NIC each (12.5 GB/s a node). FSDP gathers every
    layer's 2 x 202M bytes of weights twice per micro-batch and reduce-scatters its gradients through that NIC,
    all 128 ranks in one ring; HSDP over one node keeps both on NVLink and sends only each rank's 1/8 of the
    gradients across nodes (an all-reduce over 16 replicas). The plan picks HSDP over one node, and its screen,
    which shares a bottleneck between backward's gathers and reductions as the simulation does, is within 6% of
    the simulation for every confirmed layout."""
    slow = load_scenario(
        {
            "name": "hsdp-test",
            "framework": "ideal",
            "model": {**SEVEN_B, "attention": "flash"},
            "cluster": {
                "topology": "dgx-a100",
                "num_nodes": 16,
                "nics_per_node": 1,
                "nic_bandwidth_gbps": 100,
            },
            "training": {"global_batch_size": 256, "micro_batch_size": 1, "precision": "bf16"},
        }
    )
    options = {"shardings": ("fsdp", "hsdp"), "tp": (1,), "recompute": ("full",), "micro_batch_sizes": (2,)}
    r = plan(slow, 128, top=5, options=options)
    best = r["top"][0]
    assert (best["sharding"], best["shard"], best["status"]) == ("hsdp", 8, "ok")
    fsdp = next(t for t in r["top"] if t["sharding"] == "fsdp")
    assert fsdp["iteration_time_s"] > 1.2 * best["iteration_time_s"]
    for t in r["top"]:
        assert t["estimate_s"] == pytest.approx(t["iteration_time_s"], rel=0.06), t["layout"]


def test_plan_keeps_the_base_s_switches_where_they_apply():
    """A Megatron-Core base (MCORE-H100-70B: SP, TP communication overlap, overlapped gradient reduce and
    parameter gather) plans with those switches: every confirmed scenario with TP > 1 keeps SP and the TP overlap,
    one with TP 1 drops them (nothing to split), all keep the DDP overlaps; the screen, which hides the
    distributed optimizer's reduce-scatter under the last backward and its gather under the next forward as the
    simulation does, is within 10% of the simulation for every confirmed layout."""
    from simulator.study.layout import Layout, carried

    s = load_scenario("scenarios/published/mcore-h100-70b.yaml")
    r = plan(s, 768, top=4, options={"shardings": ("zero1",), "tp": (4, 8), "recompute": ("none",)})
    ok = [t for t in r["top"] if t["status"] == "ok"]
    assert len(ok) == 4
    for t in ok:
        par = t["scenario"]["parallelism"]
        assert par["sequence_parallel"] is True and par["tp_comm_overlap"] is True, t["layout"]
        assert par["ddp"] == {"overlap_grad_reduce": True, "overlap_param_gather": True}
        assert t["estimate_s"] == pytest.approx(t["iteration_time_s"], rel=0.10), t["layout"]
    base = s.parallelism.model_dump(mode="json", exclude_none=True)
    one = carried(base, Layout(1, 2, 1, 384, 1, 1, "zero1", "none"))
    assert "sequence_parallel" not in one and "tp_comm_overlap" not in one
    assert one["zero"] == {
        k: v for k, v in base["zero"].items() if not k.startswith("offload")
    }  # the layout's
    assert "zero" not in carried(base, Layout(8, 1, 1, 96, 1, 1, "ddp", "none"))


# 39B parameters: 16 bytes each (mixed-precision Adam) is 78 GB per GPU even sharded over 8
BIG_39B = {
    "num_layers": 48,
    "hidden_size": 8192,
    "num_attention_heads": 64,
    "seq_length": 2048,
    "vocab_size": 32000,
}


def test_a_model_too_big_for_the_gpus_plans_the_optimizer_on_the_cpu():
    """By hand: 39B parameters on 8 A100-80GB. Mixed-precision Adam needs 16 B a parameter: 78 GB per GPU even
    fully sharded (ZeRO-3 / FSDP over 8), and TP or PP only split the same bytes over the same GPUs; with the
    optimizer on the host CPU (ZeRO-Offload) the GPU keeps its 1/8 of the 16-bit weights under ZeRO-3, 9.7 GB, or
    half of them under ZeRO-2 with TP 2, 39 GB. So every layout that fits offloads the optimizer, the screen (the
    simulation's own host model: gradient copies beside backward, ZeRO-3's reductions holding the host at the
    boundary, the CPU step shared by the node, the weights back) within 3% of the simulation."""
    r = plan(base(BIG_39B, batch=64), 8, top=3, options={"recompute": ("full",)})
    ok = [t for t in r["top"] if t["status"] == "ok"]
    assert len(ok) == 3 and r["fit_in_memory"] < r["screened"]
    assert ok[0]["sharding"] == "zero3-offload"
    for t in ok:
        assert t["sharding"] in ("zero3-offload", "zero2-offload") and t["pp"] == 1
        assert t["scenario"]["parallelism"]["zero"]["offload_optimizer"]["device"] == "cpu"
        assert t["estimate_s"] == pytest.approx(t["iteration_time_s"], rel=0.03)
    layouts = candidates(base(BIG_39B, batch=64), 8, 8, {"shardings": ("zero2-offload",)})
    assert layouts and all(lay.pp == 1 and lay.stage == 2 and lay.offload for lay in layouts)


def test_cli_plans_from_a_scenario_file_with_its_switches():
    """--scenario: the file's model, cluster, training and switches; --gpus and --global-batch-size default to
    its own (MCORE-H100-70B: TP 8 x PP 2 x DP 48 = 768 H100, batch 384). Each bad combination is one line."""
    path = "scenarios/published/mcore-h100-70b.yaml"
    r = runner.invoke(
        app, ["plan", "--scenario", path, "--top", "2", "--tp", "8", "--sharding", "zero1", "--json"]
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    ok = [t for t in d["top"] if t["status"] == "ok"]
    assert ok
    for t in ok:
        assert t["tp"] * t["pp"] * t["cp"] * t["dp"] == 768 and t["sharding"] == "zero1"
        par = t["scenario"]["parallelism"]
        assert par["sequence_parallel"] is True and par["tp_comm_overlap"] is True
        assert t["scenario"]["framework"] == "megatron-core-2024"
        assert 384 % (t["mbs"] * t["dp"]) == 0
    for args, message in [
        (
            ["--scenario", path, "--model", "llama3-8b"],
            "error: plan: --scenario gives the model, cluster and training; leave out --model",
        ),
        (
            ["--model", "llama3-8b", "--topology", "dgx-h100"],
            "error: plan: give --model, --topology, --gpus and "
            "--global-batch-size, or --scenario FILE (missing: --gpus, --global-batch-size)",
        ),
        (
            ["--scenario", path, "--gpus", "200"],
            "error: --gpus (200) is not a multiple of the --scenario layout's "
            "TP x PP x CP (8 x 2 x 1 = 16): give such a --gpus, or plan with --model",
        ),
    ]:
        r = runner.invoke(app, ["plan", *args])
        assert r.exit_code == 2 and r.stderr.strip() == message, r.stderr


def test_zero3_replays_only_where_they_can_rank_and_the_ranking_is_unchanged():
    """plan screens ZeRO-3 with a lower bound (every call hidden) and replays DeepSpeed's coordinator only where
    that bound could reach the layouts it may simulate (3 x --top): the first 3 x top fitting layouts, their
    order and times, are exactly those of replaying every one."""
    from simulator.study.plan import refine

    screen, _ = _screen(16)
    lays = candidates(screen.base, 128, 8, {"recompute": ("none", "full")}, 256)
    assert sum(lay.kind == "zero3" for lay in lays) >= 8
    full = sorted((e for e in map(screen.estimate, lays) if e.fits), key=lambda e: e.iteration_s)
    need = 6
    bounds = [screen.estimate(lay, bound=True) for lay in lays]
    assert any(e.bound for e in bounds)
    fast = sorted((e for e in refine(screen, bounds, need) if e.fits), key=lambda e: e.iteration_s)
    assert [(e.layout, e.iteration_s) for e in fast[:need]] == [
        (e.layout, e.iteration_s) for e in full[:need]
    ]
    assert all(not e.bound for e in fast[:need]) and sum(e.bound for e in fast) > 40  # most never replayed
    for e in fast[need:]:  # a bound left unrefined is never later than the exact time
        if e.bound:
            assert e.iteration_s <= screen.estimate(e.layout).iteration_s


def test_screen_accuracy_by_hand():
    """Estimates 1, 1, 2 s against simulated 1, 2, 3 s: ranks (1.5, 1.5, 3) and (1, 2, 3), centred (-0.5, -0.5,
    1) and (-1, 0, 1): covariance 1.5, variances 1.5 and 2, Spearman's rho 1.5 / sqrt(3) = 0.866; errors 0, 50%
    and 33.3%, the largest on the second layout, mean 27.8%. A layout that did not run is left out."""

    def confirmed(dp: int, est: float, sim: float | None, status: str = "ok") -> Confirmed:
        return Confirmed(Layout(1, 1, 1, dp, 1, 1, "ddp", "none"), est, sim, 0.5, 1.0, 0.0, 0.0, 1.0, status)

    acc = screen_accuracy(
        [
            confirmed(8, 1.0, 1.0),
            confirmed(16, 1.0, 2.0),
            confirmed(32, 2.0, 3.0),
            confirmed(64, 0.5, None, "oom"),
        ]
    )
    assert acc["simulated"] == 3
    assert acc["rank_correlation"] == pytest.approx(1.5 / math.sqrt(3))
    assert acc["max_error"] == pytest.approx(0.5)
    assert acc["mean_error"] == pytest.approx((0 + 0.5 + 1 / 3) / 3)
    assert acc["worst"] == Layout(1, 1, 1, 16, 1, 1, "ddp", "none").label()
    reversed_ = screen_accuracy([confirmed(8, 1.0, 3.0), confirmed(16, 2.0, 2.0), confirmed(32, 3.0, 1.0)])
    assert reversed_["rank_correlation"] == pytest.approx(-1.0)
    assert screen_accuracy([confirmed(8, 1.0, 1.0), confirmed(16, 1.0, 2.0)])["rank_correlation"] is None


def test_plan_reports_the_screens_accuracy_over_what_it_simulated():
    r = CliRunner().invoke(app, [*PLAN_ARGS, "--top", "3", "--json"])
    acc = json.loads(r.output)["screen_accuracy"]
    ok = [t for t in json.loads(r.output)["top"] if t["status"] == "ok"]
    assert acc["simulated"] == len(ok) >= 2
    assert acc["max_error"] == pytest.approx(
        max(abs(t["estimate_s"] / t["iteration_time_s"] - 1) for t in ok)
    )
    text = CliRunner().invoke(app, [*PLAN_ARGS, "--top", "3"], env={"COLUMNS": "120"}).output
    assert f"estimates within {acc['max_error']:.1%}" in text


def test_the_space_has_every_interleaving_and_micro_batch_that_divides():
    """GPT-3 175B (96 layers) on 1,024 GPUs, batch 1,536: at PP 8 a stage holds 12 layers, so 2, 3, 4, 6 and 12
    virtual stages (where the micro-batches are a multiple of 8); at DP 16 a rank's 96 samples split into
    micro-batches of 1, 2, 3, 4, 6, 8, 12 and 16, at DP 64 its 24 into 1, 2, 3, 4, 6, 8 (12 makes 2 micro-batches,
    fewer than the 8 stages, so no interleaving, but it is searched without)."""
    base = load_scenario(
        {
            "model": {"preset": "gpt3-175b"},
            "cluster": {"topology": "dgx-a100", "num_nodes": 128},
            "training": {"global_batch_size": 1024, "micro_batch_size": 1},
        }
    )
    lays = candidates(base, 1024, 8, {"tp": (8,), "pp": (8,)}, 1536)
    assert {x.v for x in lays} == {1, 2, 3, 4, 6, 12}
    assert {x.mbs for x in lays if x.dp == 16} == {1, 2, 3, 4, 6, 8, 12, 16}
    assert {x.mbs for x in lays if x.dp == 16 and x.v > 1} == {1, 2, 3, 4, 6, 12}
    wide = candidates(base, 1024, 8, {"tp": (8,), "pp": (2,)}, 1536)
    assert {x.mbs for x in wide} == {1, 2, 3, 4, 6, 8, 12}


def test_a_zero3_layout_that_cannot_fit_estimates_as_infinite_not_nan():
    """The screen skips the coordinator's replay where a ZeRO-3 layout cannot fit: its estimate is infinite (ranked
    last), with no hidden communication to charge the compute beside it (inf - inf would be nan)."""
    import math

    from simulator.hardware.cluster import Cluster
    from simulator.hardware.topology import cluster_spec
    from simulator.study.screen import Screen

    s = base(BIG_39B)
    e = Screen(s, Cluster(cluster_spec(s), 1)).estimate(Layout(1, 1, 1, 8, 1, 1, "zero3", "none"))
    assert math.isinf(e.iteration_s) and not e.fits


def megatron_2021_base(nodes: int = 4):
    """A 24-layer GPT in fp16 on Megatron-LM 2021 (its get_batch host setup and synchronised sends), TP without
    sequence parallelism (the pipeline's scatter / gather)."""
    return load_scenario(
        {
            "name": "plan-m21",
            "framework": "megatron-2021",
            "model": {"num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 2048,
                      "vocab_size": 51200},
            "cluster": {"topology": "dgx-a100", "num_nodes": nodes},
            "training": {"global_batch_size": 128, "micro_batch_size": 1, "precision": "fp16"},
        }
    )  # fmt: skip


def test_step_overhead_by_hand():
    """Each model chunk's forward pays Megatron's get_batch on the host with the GPU idle (its sends synchronise),
    and with TP 2 and no sequence parallelism re-gathers its input and its gradient and sends both ways."""
    from simulator.hardware.cluster import Cluster
    from simulator.hardware.topology import cluster_spec
    from simulator.strategy.pipeline.chunk_ops import send_bytes
    from simulator.study.screen import Screen
    from simulator.study.step_overhead import step_overhead_s

    b = megatron_2021_base()
    screen = Screen(b, Cluster(cluster_spec(b), 4))
    lay = Layout(2, 4, 1, 4, 3, 1, "ddp", "none")
    *_, w, s, cost = screen._block_times(lay)
    setup_host = w.framework.host.microbatch_s
    assert setup_host == pytest.approx(2.092e-3) and cost(w.microbatch_setup).seconds == 0.0
    act = 1 * 2048 * 2048 * 2
    gather = screen._comm(lay).standalone_time_s("all_gather", "tp", act)
    assert gather > 0 and send_bytes(s) == act / 2
    link = 25e9
    by_hand = 3 * (setup_host + 2 * gather + 2 * act / 2 / link)
    assert step_overhead_s(s, w, cost, 4, 3, link, "interleaved-1f1b") == pytest.approx(by_hand, rel=1e-9)
    # DeepSpeed's lock-step schedule meets both neighbours every step: four transfers a micro-batch
    by_hand = setup_host + 2 * gather + 4 * act / 2 / link
    assert step_overhead_s(s, w, cost, 4, 1, link, "deepspeed") == pytest.approx(by_hand, rel=1e-9)
    # without a pipeline: the setup alone (its micro-batch input copy synchronises too)
    assert step_overhead_s(s, w, cost, 1, 1, link, "1f1b") == pytest.approx(setup_host, rel=1e-9)


def test_screen_follows_the_simulation_of_interleaved_megatron_pipelines():
    """Megatron-LM 2021 layouts with 2 to 6 virtual stages: the screen within 2% of the simulation (it was 3-6%
    fast, the more so the more virtual stages, before it counted each chunk's setup and re-gathers)."""
    from simulator import simulate
    from simulator.hardware.cluster import Cluster
    from simulator.hardware.topology import cluster_spec
    from simulator.study.screen import Screen

    b = megatron_2021_base()
    screen = Screen(b, Cluster(cluster_spec(b), 4))
    for v in (2, 3, 6):
        lay = Layout(2, 4, 1, 4, v, 1, "ddp", "none")
        est = screen.estimate(lay).iteration_s
        sim = simulate(screen.scenario(lay)).metrics.iteration_time_s
        assert est == pytest.approx(sim, rel=0.02), (v, est, sim)


def test_an_estimate_does_not_depend_on_which_layout_of_its_shape_came_first():
    """The screen caches each shape's costs from the first layout of that shape it meets; whether a layout's
    pipeline sends overlap compute (Megatron-Core's interleaved schedule) is the layout's own: a 1F1B layout
    costed first must not make an interleaved one's sends block, or the other way round."""
    from simulator.hardware.cluster import Cluster
    from simulator.hardware.topology import cluster_spec
    from simulator.study.screen import Screen

    b = megatron_2021_base().model_copy(update={"framework": "megatron-core-2024"})
    flat, interleaved = Layout(2, 4, 1, 4, 1, 1, "ddp", "none"), Layout(2, 4, 1, 4, 3, 1, "ddp", "none")
    one, other = Screen(b, Cluster(cluster_spec(b), 4)), Screen(b, Cluster(cluster_spec(b), 4))
    first = [one.estimate(lay).iteration_s for lay in (flat, interleaved)]
    second = [other.estimate(lay).iteration_s for lay in (interleaved, flat)][::-1]
    assert first == second


def test_a_plan_with_nothing_to_run_exits_3_and_says_why():
    """Issue 63: every layout invalid (EP 16 over 8 experts) or none fitting (GPT-3 175B on 8 A100 without
    sharding) is exit 3 with the reason or the leanest layout's memory, not exit 0 with an empty table."""
    from typer.testing import CliRunner

    from simulator.cli import app

    def plan_cli(model: str, gpus: str, topology: str, *extra: str):
        args = ["plan", "--model", model, "--gpus", gpus, "--topology", topology, "--global-batch-size", "64"]
        return CliRunner().invoke(app, [*args, *extra])

    moe = plan_cli("mixtral-8x7b", "16", "dgx-h100", "--ep", "16")
    assert moe.exit_code == 3, moe.output
    assert "every one of the" in moe.output and "expert_parallel (16) does not divide" in moe.output
    big = plan_cli("gpt3-175b", "8", "dgx-a100", "--sharding", "ddp")
    assert big.exit_code == 3, big.output
    text = " ".join(big.output.split())
    assert "none of the" in text and "fits in 80.0 GiB per GPU by the estimate; the leanest," in text


def test_top_1_says_how_many_fit_not_that_only_one_does():
    from simulator.study.plan import why

    r = plan(base(), 8, top=1, options={"micro_batch_sizes": (1, 2), "shardings": ("ddp", "zero1")})
    assert r["fit_in_memory"] > 1
    assert (
        r["why"] == f"one layout simulated (--top 1) of the {r['fit_in_memory']:,} that fit by the estimate"
    )
    assert why([]) == "no simulated layout runs: each is out of memory or invalid (their rows say why)"


def test_emit_states_the_planned_precision_in_megatrons_names():
    """Issue 62: an FP8 plan emitted --bf16 alone. Megatron-LM's switches (arguments.py): --fp8-format and
    --fp8-recipe, or --fp4-format e2m1 --fp4-recipe nvfp4; DeepSpeed's JSON stays valid and says so beside it."""
    from simulator.study.emit import emit_notes, emit_text

    row = {"tp": 2, "pp": 1, "cp": 1, "dp": 4, "v": 1, "mbs": 1, "sharding": "zero1", "recompute": "none"}
    for recipe, want in [
        ("delayed", "--fp8-format hybrid --fp8-recipe delayed"),
        ("mxfp8", "--fp8-format e4m3 --fp8-recipe mxfp8"),
        ("nvfp4", "--fp4-format e2m1 --fp4-recipe nvfp4"),
    ]:
        r = {
            **row,
            "scenario": {
                "training": {"global_batch_size": 64, "precision": "fp8", "fp8": {"recipe": recipe}}
            },
        }
        args = " ".join(line.rstrip(" \\") for line in emit_text(r, "megatron").splitlines())
        assert "--bf16" in args and want in args, args
        json.loads(emit_text(r, "deepspeed"))
        assert any(want in n for n in emit_notes(r, "deepspeed"))
    plain = {**row, "scenario": {"training": {"global_batch_size": 64}}}
    assert "--fp8" not in emit_text(plain, "megatron")


def test_plan_from_a_scenario_keeps_its_gpus_per_node(tmp_path):
    """Issue 62: 64 GPUs of each 72-GPU NVL72 rack (docs/hardware.md): the plan's nodes are the scenario's 64, and
    128 GPUs are two of them (it refused 128 as not a whole number of 72-GPU nodes)."""
    from typer.testing import CliRunner

    from simulator.cli import app

    path = tmp_path / "nvl.yaml"
    path.write_text(
        "name: r\nmodel: {preset: llama3-8b}\ncluster: {topology: gb200-nvl72, num_nodes: 2, gpus_per_node: 64}\n"
        "training: {global_batch_size: 128, micro_batch_size: 1}\nparallelism: {}\n"
    )
    out = CliRunner().invoke(app, ["plan", "--scenario", str(path), "--top", "1", "--json"])
    assert out.exit_code == 0, out.output
    cluster = json.loads(out.stdout)["top"][0]["scenario"]["cluster"]
    assert (cluster["num_nodes"], cluster["gpus_per_node"]) == (2, 64)


def test_no_layout_says_which_dimension_failed():
    """Issue 62: 'no layout divides' now names the dimension: TP against the heads, PP against the layers, the
    micro-batches against a rank's batch."""
    for options, text in [
        ({"tp": (3,)}, "no tensor-parallel size (3) fits a 8-GPU node and divides the"),
        ({"pp": (7,)}, "no pipeline size (7) splits the"),  # 8 layers: 2 on 5 middle stages leave none
        ({"micro_batch_sizes": (3,)}, "no micro-batch size (3) divides a data-parallel rank's batch"),
    ]:
        with pytest.raises(ScenarioError, match=re.escape(text)):
            plan(base(), 8, top=1, options=options)


def test_a_layout_the_scenario_refuses_is_not_counted_as_fitting_nor_shown(monkeypatch):
    """Issue 63: the screen counted layouts as fitting that the scenario's own checks then refused, and showed them
    as 'invalid' rows in place of layouts that run. Here the scenario refuses every ZeRO-1 layout: none is shown,
    the count of fitting layouts drops by those tried, and the rows are the next layouts that run."""
    from simulator.study.screen import Screen

    real = Screen.scenario

    def refusing(self, lay):
        if lay.sharding == "zero1":
            raise ScenarioError("parallelism: zero1 refused for this test")
        return real(self, lay)

    options = {"micro_batch_sizes": (1, 2), "shardings": ("ddp", "zero1")}
    before = plan(base(), 8, top=3, options=options)
    monkeypatch.setattr(Screen, "scenario", refusing)
    after = plan(base(), 8, top=3, options=options)
    assert all(t["status"] == "ok" and "zero1" not in t["layout"] for t in after["top"])
    assert after["fit_in_memory"] < before["fit_in_memory"]
    assert (
        after["screened_invalid"] - before["screened_invalid"]
        == before["fit_in_memory"] - after["fit_in_memory"]
    )
