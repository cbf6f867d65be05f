"""The memory of Megatron-Core's per-layer CUDA graphs (workload/cuda_graphs.py): each graphed (layer, micro-batch)
in flight holds a static copy of its input hidden states, and of the causal mask where its attention is captured
(Megatron-LM d98e8a64 TECudaGraphHelper; module.py / transformer_layer.py get_layer_static_inputs), by hand."""

from __future__ import annotations

from simulator import load_scenario, simulate
from simulator.report.table import metrics_table
from simulator.workload.cuda_graphs import graphed, mean_static_input_bytes

GIB = 2**30


def scenario(modules=(), pp: int = 1, seq: int = 4096, mb: int = 4, gbs: int = 64, **parallelism):
    """Qwen3-30B-A3B (48 MoE layers, hidden 2,048) on one DGX H100, EP8."""
    training = {
        "global_batch_size": gbs,
        "micro_batch_size": mb,
        "precision": "bf16",
        "cuda_graphs": bool(modules),
    }
    if modules:
        training["cuda_graph_modules"] = list(modules)
    return load_scenario(
        {
            "name": "graph-memory",
            "model": {"preset": "qwen3-30b-a3b", "seq_length": seq},
            "framework": "megatron-core-2024",
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": training,
            "parallelism": {
                "expert_parallel": 8 // pp,
                "pipeline_parallel": pp,
                "zero_stage": 1,
                "moe": {"dispatcher": "alltoall", "grouped_gemm": True},
            }
            | parallelism,
        }
    )


def graphs_gib(s) -> list[float]:
    return [r.memory.graphs / GIB for r in simulate(s, periodic=True).program.ranks]


def test_a_router_capture_holds_one_hidden_state_copy_per_layer():
    """48 layers x (4,096 tokens x 4 sequences x 2,048 wide x 2 bytes = 64 MiB) = 3 GiB, and the peak holds it."""
    plain, graphs = simulate(scenario()), simulate(scenario(("moe_router", "moe_preprocess")))
    assert graphs_gib(scenario(("moe_router", "moe_preprocess"))) == [48 * 64 / 1024]
    assert plain.metrics.memory_gib["graphs"] == 0.0
    assert graphs.metrics.memory_gib["peak"] - plain.metrics.memory_gib["peak"] == 3.0


def test_capturing_attention_adds_its_causal_mask_per_layer():
    """The bool mask is 4 sequences x 4,096 x 4,096 bytes = 64 MiB a layer more: 6 GiB; at 8,192 tokens the mask
    grows 4x (256 MiB) and the hidden states 2x (128 MiB): 48 x 384 MiB = 18 GiB."""
    assert graphs_gib(scenario(("attn", "moe_router"))) == [6.0]
    assert graphs_gib(scenario(("attn",), seq=8192)) == [48 * 384 / 1024]


def test_sequence_parallelism_splits_the_hidden_states_not_the_mask():
    """TP2 with sequence parallelism: 32 MiB of hidden states and 64 MiB of mask a layer."""
    s = scenario(("attn",), tensor_parallel=2, sequence_parallel=True, expert_parallel=4)
    assert graphs_gib(s) == [48 * 96 / 1024]


def test_a_pipeline_stage_holds_a_set_per_micro_batch_in_flight():
    """1F1B on 4 stages of 12 layers, 16 micro-batches of 1: stage r has 4 - r forwards in flight before its
    first backward, so 4, 3, 2 and 1 sets of 12 layers x (16 + 16) MiB (hidden states and mask at micro-batch 1)."""
    s = scenario(("attn",), pp=4, mb=1, gbs=16, data_parallel=2)
    assert graphs_gib(s) == [n * 12 * 32 / 1024 for n in (4, 3, 2, 1)]


def test_nothing_is_counted_without_modules_or_for_layers_out_of_scope():
    """Whole-layer (local) and full-iteration graphs chain their buffers: no static inputs. A dense MLP scope
    captures no MoE layer; a Mamba scope no attention layer."""
    assert graphs_gib(scenario()) == [0.0]
    assert graphs_gib(scenario(("mlp",))) == [0.0]
    s = scenario(("moe_router",))
    whole = load_scenario(s.model_dump() | {"training": s.training.model_dump() | {"cuda_graph_modules": ()}})
    assert graphs_gib(whole) == [0.0]
    assert graphed(frozenset({"mamba"}), "attention", False) == (False, False)
    assert graphed(frozenset({"mamba"}), "mamba", False) == (True, False)
    assert graphed(frozenset({"attn"}), "moe", True) == (False, False)
    assert graphed(frozenset({"mlp"}), "mlp", False) == (True, False)
    assert graphed(frozenset({"attn", "mlp"}), "layer", False) == (True, True)


def rows(s) -> dict[str, str]:
    table = metrics_table([("run", simulate(s).metrics)])
    labels, values = (list(c._cells) for c in table.columns)
    return dict(zip(labels, values, strict=True))


def test_the_run_table_shows_the_graphs_memory_only_where_there_is_some():
    assert rows(scenario(("moe_router",)))["Memory: CUDA graph static inputs"] == "3.00 GiB"
    assert "Memory: CUDA graph static inputs" not in rows(scenario())


def test_the_planners_screen_counts_the_same_inputs_per_layer():
    """The screen's per-layer mean: 64 MiB for every Qwen3 layer under moe_router; for Nemotron-H 8B (24 Mamba-2
    layers of 52) under mamba, 24 / 52 of one layer's 4,096 x 4,096-wide hidden states (32 MiB) at micro-batch 1."""
    assert mean_static_input_bytes(scenario(("moe_router",))) == 64 * 2**20
    s = load_scenario(
        {
            "name": "hybrid",
            "model": {"preset": "nemotron-h-8b", "seq_length": 4096},
            "framework": "megatron-core-2024",
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {"global_batch_size": 8, "micro_batch_size": 1, "cuda_graphs": True,
                         "cuda_graph_modules": ["mamba"]},
        }
    )  # fmt: skip
    mamba = sum(s.model.layer_kind(i) == "mamba" for i in range(s.model.num_layers))
    assert (mamba, s.model.num_layers, s.model.hidden_size) == (24, 52, 4096)
    assert mean_static_input_bytes(s) == 24 / 52 * 32 * 2**20
