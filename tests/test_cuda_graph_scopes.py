"""CUDA graphs by module (training.cuda_graph_modules, Megatron-Core --cuda-graph-modules / --cuda-graph-scope with
per-layer graphs): which kernels a scoped capture issues from a graph, by hand, and what stays on the host."""

from __future__ import annotations

import pytest

from simulator import load_scenario, simulate
from simulator.costs.dispatch import host_times, op_host_s
from simulator.errors import ScenarioError
from simulator.frameworks import get_framework
from simulator.workload.graph_modules import MODULES
from simulator.workload.ops import Op, sync_op
from simulator.workload.transformer import build_workload


def moe_scenario(seq: int = 4096, **training):
    return load_scenario(
        {
            "name": "graphs",
            "model": {"preset": "qwen3-30b-a3b", "seq_length": seq},
            "framework": "megatron-core-2024",
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {"global_batch_size": 16, "micro_batch_size": 1, "precision": "bf16"} | training,
            "parallelism": {
                "expert_parallel": 8,
                "zero_stage": 1,
                "moe": {"dispatcher": "alltoall", "grouped_gemm": True},
            },
        }
    )


def test_a_scoped_capture_launches_each_run_of_its_modules_once_and_keeps_the_rest_and_its_syncs():
    """By hand: attn, attn (one launch), a router kernel outside the scope, the host's wait for the counts (kept,
    as the dispatch is not captured), then attn again (a second launch)."""
    host = get_framework("megatron-core-2024").host
    ops = (
        Op("a", "memory", bytes=1e6, module="attn"),
        Op("b", "memory", bytes=1e6, module="attn"),
        Op("router", "memory", bytes=1e6, module="moe_router"),
        Op("wait", "sync", launches=0, host_s=5e-6, module="moe"),
        Op("c", "memory", bytes=1e6, module="attn"),
    )
    issue, syncs = host_times(ops, host, frozenset({"attn"}))
    assert issue == [
        host.graph_launch_s,
        0.0,
        op_host_s(ops[2], host),
        op_host_s(ops[3], host),
        host.graph_launch_s,
    ]
    assert syncs == [False, False, False, True, False]
    whole, whole_syncs = host_times(ops, host, True)
    assert whole == [host.graph_launch_s, 0.0, 0.0, 0.0, 0.0] and not any(whole_syncs)
    none, none_syncs = host_times(ops, host, False)
    assert none == [op_host_s(op, host) for op in ops] and none_syncs == syncs
    assert sync_op("x", 1e-6).module == ""


def test_every_kernel_of_an_moe_layer_belongs_to_a_module():
    """Megatron-Core's scopes cover a transformer layer: attention's half (norm, QKV, attention, projection,
    residual), the router (pre-MLP norm, router, top-k), the dispatcher's preprocessing (its permutation before the
    all-to-all) and the MoE rest (all-to-alls, experts, combine)."""
    w = build_workload(moe_scenario())
    layer = w.layers[0]
    for op in (*layer.forward, *layer.backward):
        assert op.module in MODULES, op.name
    fwd = {op.name: op.module for op in layer.forward}
    assert fwd["qkv projection"] == "attn" and fwd["router"] == "moe_router"
    assert fwd["post-attention layernorm"] == "moe_router"
    assert any(m == "moe_preprocess" for m in fwd.values())
    moving = [op for op in layer.forward if op.kind == "collective" and "tokens" in op.name]
    assert moving and {op.module for op in moving} == {"moe"}
    assert fwd["token counts all-gather"] == fwd["permute tokens"] == "moe_preprocess"
    assert {op.module for op in w.head.forward} == {""}


def test_graphs_of_attention_and_router_cost_between_none_and_whole_layers():
    """An MoE layer's host issue time: whole-layer graphs one launch, graphs of attention, router and
    preprocessing a launch each plus the MoE rest kernel by kernel (the dispatch, experts and combine, and the
    host's wait for the token counts), none every kernel. On a host-bound shape (512 tokens a micro-batch) the
    step follows: none slowest, whole-layer graphs fastest."""
    scoped = {"cuda_graphs": True, "cuda_graph_modules": ["attn", "moe_router", "moe_preprocess"]}
    s = moe_scenario()
    host = get_framework("megatron-core-2024").host
    layer = build_workload(s).layers[0]
    ops = (*layer.forward, *layer.backward)
    issued = {
        label: sum(host_times(ops, host, capture)[0])
        for label, capture in (
            ("none", False),
            ("scoped", frozenset(scoped["cuda_graph_modules"])),
            ("whole", True),
        )
    }
    rest = sum(op_host_s(op, host) for op in ops if op.module == "moe")
    launches = (
        4  # attn, then router and preprocessing forward; router and attn backward (the MoE rest between)
    )
    assert issued["scoped"] == pytest.approx(rest + launches * host.graph_launch_s, rel=1e-12)
    assert issued["whole"] < issued["scoped"] < issued["none"]
    times = {
        label: simulate(moe_scenario(**training, seq=512)).metrics.iteration_time_s
        for label, training in (("none", {}), ("scoped", scoped), ("whole", {"cuda_graphs": True}))
    }
    assert times["whole"] < times["scoped"] < times["none"]


@pytest.mark.parametrize(
    "training, message",
    [
        ({"cuda_graph_modules": ["attn"]}, "needs training.cuda_graphs: true"),
        ({"cuda_graphs": True, "cuda_graph_modules": ["moe_preprocess"]}, "moe_preprocess needs moe_router"),
        ({"cuda_graphs": True, "cuda_graph_modules": ["moe"]}, "drop-and-pad MoE layers only"),
        ({"cuda_graphs": True, "cuda_graph_modules": ["everything"]}, "cuda_graph_modules"),
    ],
)
def test_bad_scopes_get_one_line(training, message):
    with pytest.raises(ScenarioError) as e:
        moe_scenario(**training)
    assert message in str(e.value) and "\n" not in str(e.value).strip()


def test_megatron_arguments_state_the_scope(tmp_path):
    (tmp_path / "run.sh").write_text(
        "torchrun pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
        "--vocab-size 32000 --micro-batch-size 1 --bf16 --cuda-graph-impl transformer_engine "
        "--cuda-graph-scope attn mlp\n"
    )
    s = load_scenario(
        {"name": "a", "cluster": {"topology": "dgx-h100"}, "training": {"global_batch_size": 8},
         "megatron_args": str(tmp_path / "run.sh")}
    )  # fmt: skip
    assert s.training.cuda_graphs and s.training.cuda_graph_modules == ("attn", "mlp")
    assert s.training.graph_capture == frozenset({"attn", "mlp"})
    (tmp_path / "full.sh").write_text(
        (tmp_path / "run.sh").read_text().replace("transformer_engine", "full_iteration")
    )
    s = load_scenario(
        {"name": "b", "cluster": {"topology": "dgx-h100"}, "training": {"global_batch_size": 8},
         "megatron_args": str(tmp_path / "full.sh")}
    )  # fmt: skip
    assert s.training.graph_capture is True
