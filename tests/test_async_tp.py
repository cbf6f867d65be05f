"""PyTorch async TP (tp_comm_overlap: async, workload/async_tp.py): GEMMs in TP chunks beside the copies, by hand,
and what it buys on torchtitan's measured 70B layout against Transformer Engine's userbuffers overlap."""

import copy
from pathlib import Path

import pytest
import yaml

from simulator import load_scenario, simulate
from simulator.errors import ScenarioError
from simulator.workload.async_tp import decompose
from simulator.workload.ops import collective_op, gemm

ROOT = Path(__file__).parents[1]


def test_all_gather_then_matmul_runs_in_tp_chunks_behind_the_copies():
    t, e = 4, 2
    ag = collective_op("tp all-gather (mlp input)", "all_gather", "tp", 8.0e6, "async")
    up = gemm("mlp up projection", 4096, 7168, 8192, linear=True)
    ops = decompose((ag, up), t, e)
    chunks = [o for o in ops if o.kind == "gemm"]
    copies = [o for o in ops if o.kind == "collective"]
    assert len(chunks) == t and len(copies) == t - 1
    assert sum(c.flops for c in chunks) == up.flops and {c.m for c in chunks} == {1024}
    assert all(
        c.bytes == ag.bytes / t and c.collective == "send_recv" and c.overlaps == "next" for c in copies
    )
    # each copy sits before the chunk it hides behind; the local shard's chunk needs none
    assert [o.kind for o in ops] == ["collective", "gemm"] * (t - 1) + ["gemm"]


def test_matmul_then_reduce_scatter_sends_each_chunk_and_sums_the_partials():
    t, e = 8, 2
    proj = gemm("attention output projection", 8192, 8192, 1024, linear=True)
    rs = collective_op(
        "tp reduce-scatter (attention output)", "reduce_scatter", "tp", e * 8192 * 8192, "async"
    )
    ops = decompose((proj, rs), t, e)
    assert [o.kind for o in ops] == ["gemm", "collective"] * (t - 1) + ["gemm", "memory"]
    reduction = ops[-1]
    rows = 8192 // t
    assert reduction.bytes == e * (t + 1) * rows * 8192  # t partials of a TP-th read, one written
    # without an adjoining GEMM the collective keeps the whole-GEMM overlap
    alone = decompose((rs,), t, e)
    assert alone[0].overlaps == "previous"


def case(overlap):
    cases = yaml.safe_load((ROOT / "simulator" / "validation" / "fp8.yaml").read_text())
    cases = cases["cases"] if isinstance(cases, dict) else cases
    c = next(c for c in cases if c["id"] == "TT2412-70B-256-FP8")
    d = {k: copy.deepcopy(c[k]) for k in ("model", "cluster", "training", "parallelism", "framework")}
    d["parallelism"]["tp_comm_overlap"] = overlap
    return simulate(load_scenario(d)).metrics.tokens_per_s_per_gpu


def test_async_tp_gains_less_than_transformer_engines_userbuffers():
    """torchtitan measured 829 -> 876 tokens/s per GPU (+5.7%) from async TP on this layout. TE's overlap (true)
    pipelines the forward reduce-scatters too, where Inductor's pass leaves the input gradients' a plain NCCL
    call: more hidden."""
    none, te, chunked = case(False), case(True), case("async")
    assert none < chunked < te
    assert chunked / none - 1 == pytest.approx(876 / 829 - 1, abs=0.04)


def test_an_unknown_overlap_is_one_line():
    with pytest.raises(ScenarioError) as e:
        load_scenario(
            {
                "model": {"preset": "llama3-8b"},
                "cluster": {"topology": "dgx-h100", "num_nodes": 1},
                "training": {"global_batch_size": 8, "micro_batch_size": 1},
                "parallelism": {
                    "tensor_parallel": 8,
                    "sequence_parallel": True,
                    "tp_comm_overlap": "sometimes",
                },
            }
        )
    assert "parallelism.tp_comm_overlap" in str(e.value) and "\n" not in str(e.value)
