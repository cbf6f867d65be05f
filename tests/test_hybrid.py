"""Hybrid Mamba-2 / attention / MLP stacks (model.hybrid_pattern, Megatron-LM's --hybrid-layer-pattern): parameter
counts, FLOPs, activation memory and the readers, each against a hand count."""

from __future__ import annotations

import json

import pytest

from simulator import load_scenario, simulate
from simulator.errors import ScenarioError
from simulator.metrics.flops import megatron_flops
from simulator.workload.memory import activation_bytes_per_layer
from simulator.workload.params import parameter_count
from simulator.workload.transformer import build_workload

NEMOTRON_H = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"


def scenario(tp: int = 1, recompute: str = "none", **model):
    return load_scenario(
        {
            "name": "hybrid",
            "model": {"preset": "nemotron-h-8b", **model},
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {
                "global_batch_size": 8 // tp * 2,
                "micro_batch_size": 1,
                "precision": "bf16",
                "activation_recompute": recompute,
            },
            "parallelism": {"tensor_parallel": tp, "sequence_parallel": tp > 1, "zero_stage": 1},
            "framework": "megatron-core-2024",
        }
    )


def test_nemotron_h_8b_parameters_by_hand():
    """24 Mamba-2 mixers, 4 attention and 24 MLP layers, each with one RMSNorm, the untied embedding and output
    layer and the final norm: 8.1B, as NVIDIA's model card states."""
    h, v, f, d_in, heads, gn = 4096, 131072, 21504, 8192, 128, 8 * 128
    mamba = h * (2 * d_in + 2 * gn + heads) + (d_in + 2 * gn) * 5 + 3 * heads + d_in + d_in * h
    attention = h * (32 * 128 + 2 * 8 * 128) + 32 * 128 * h
    mlp = 2 * h * f  # squared ReLU: not gated
    expected = 24 * (mamba + h) + 4 * (attention + h) + 24 * (mlp + h) + 2 * v * h + h
    s = scenario()
    assert s.model.hybrid_pattern == NEMOTRON_H
    assert parameter_count(s) == expected
    assert 8.0e9 < expected < 8.2e9
    assert build_workload(s).params_per_rank == expected  # the blocks' own counts, on one rank


def test_mamba_layer_flops_by_hand_and_tensor_parallel_split():
    """The mixer's forward: in_proj 2 T h (2 d_in + 2 G N + H), out_proj 2 T d_in h, and the SSD's four batched
    products per chunk (C B^T per group; three per head): 2 Q Q N G + H (2 Q Q P + 2 N Q P + 2 Q N P) per chunk."""
    s = scenario()
    w = build_workload(s)
    mamba = next(b for b in w.kinds if b.kind == "mamba")
    T, h, d_in, heads, g, n, p, q = 8192, 4096, 8192, 128, 8, 128, 64, 128
    chunks = T // q
    gemms = 2 * T * h * (2 * d_in + 2 * g * n + heads) + 2 * T * d_in * h
    ssd = chunks * (2 * q * q * n * g + heads * (2 * q * q * p + 2 * n * q * p + 2 * q * n * p))
    fwd = sum(op.flops for op in mamba.forward if op.kind == "gemm")
    assert fwd == pytest.approx(gemms + ssd, rel=1e-12)
    # Megatron's own count of the scan, 7 d_in N a token, is within 15% of the four products
    assert ssd / (7 * T * d_in * n) == pytest.approx(0.9, abs=0.05)
    # backward: every product's two gradients
    bwd = sum(op.flops for op in mamba.backward if op.kind == "gemm")
    assert bwd == pytest.approx(2 * fwd, rel=1e-12)
    # tensor parallelism splits every GEMM by heads and groups
    w2 = build_workload(scenario(tp=2))
    mamba2 = next(b for b in w2.kinds if b.kind == "mamba")
    assert sum(op.flops for op in mamba2.forward if op.kind == "gemm") == pytest.approx(fwd / 2, rel=1e-12)
    assert any(op.collective == "all_gather" for op in mamba2.forward)


def test_hybrid_flops_follow_megatrons_formula():
    """megatron_flops of a hybrid is Megatron-LM's hybrid_flops (training.py, d98e8a64), by hand; the simulated
    model FLOPs (the kernels' own) agree within 2%."""
    s = scenario()
    B, T, h, v, f, n = 16, 8192, 4096, 131072, 21504, 128
    tokens = B * T
    mamba = 2 * tokens * h * (2 * 2 * h + 2 * 8 * n + 128) + 7 * tokens * 2 * h * n + 2 * tokens * 2 * h * h
    attention = 4 * tokens * h * (h + h * 8 / 32) + 2 * B * T * T * h
    mlp = 4 * (f / h) * tokens * h * h
    expected = 3 * (24 * mamba + 4 * attention + 24 * mlp + 2 * tokens * h * v)
    assert megatron_flops(s) == pytest.approx(expected, rel=1e-12)
    w = build_workload(s)
    assert w.model_flops_per_microbatch * B == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("tp", [1, 2])
def test_attention_and_mlp_layers_hold_a_transformer_layers_activations(tp):
    """A hybrid's attention-only and MLP-only layers keep, together, exactly what one transformer layer keeps
    (Korthikanti's count split in its two halves); a Mamba layer keeps its norm input, in_proj input and mask,
    plus the mixer's zxBCdt, its output and out_proj's input (16-bit), split by TP."""
    s = scenario(tp=tp)
    whole = activation_bytes_per_layer(s)
    halves = activation_bytes_per_layer(s, kind="attention") + activation_bytes_per_layer(s, kind="mlp")
    assert halves == pytest.approx(whole, rel=1e-12)
    sbh, sq, d_in, proj = 8192 * 4096, 8192, 8192, 2 * 8192 + 2 * 1024 + 128
    expected = sbh * (2 + 1 + 2) / tp + sq * 2 * (proj + 2 * d_in) / tp
    assert activation_bytes_per_layer(s, kind="mamba") == pytest.approx(expected, rel=1e-12)
    # full recompute keeps the layer input alone, whatever the layer
    full = scenario(tp=tp, recompute="full")
    assert activation_bytes_per_layer(full, recompute="full", kind="mamba") == 2 * sbh / tp


def test_hybrid_simulates_and_memory_counts_each_kind():
    r = simulate(scenario())
    m = r.metrics
    assert 0.25 < m.mfu < 0.7
    w = build_workload(r.scenario)
    assert [b.kind for b in w.layers] == [{"M": "mamba", "*": "attention", "-": "mlp"}[c] for c in NEMOTRON_H]
    s = r.scenario
    kept = sum(activation_bytes_per_layer(s, kind=b.kind) for b in w.layers)
    assert m.memory_gib["activations"] * 2**30 >= kept


@pytest.mark.parametrize(
    "model, parallelism, message",
    [
        ({"hybrid_pattern": "M-M*X"}, {}, "'X'"),
        ({"hybrid_pattern": "M-M*|M-"}, {}, "pipeline stage boundaries"),
        ({"hybrid_pattern": "M-M*"}, {}, "has 4 layers but num_layers is 52"),
        ({"hybrid_pattern": NEMOTRON_H.replace("-", "E", 1)}, {}, "E layers need model.moe"),
        ({}, {"context_parallel": 2}, "context_parallel"),
        ({"mamba": {"num_heads": 100, "num_groups": 8}}, {}, "not divisible by num_groups"),
        ({"mamba": {"num_groups": 2}}, {"tensor_parallel": 4, "sequence_parallel": True}, "must divide"),
    ],
)
def test_bad_hybrid_settings_get_one_line(model, parallelism, message):
    data = {
        "name": "bad",
        "model": {"preset": "nemotron-h-8b", **model},
        "cluster": {"topology": "dgx-h100"},
        "training": {"global_batch_size": 16, "micro_batch_size": 1},
        "parallelism": parallelism,
    }
    with pytest.raises(ScenarioError) as e:
        load_scenario(data)
    assert message in str(e.value)
    assert "\n" not in str(e.value).strip()


def test_nemotron_h_config_json_and_megatron_arguments_read_the_same_model(tmp_path):
    cfg = {
        "model_type": "nemotron_h",
        "hybrid_override_pattern": NEMOTRON_H,
        "hidden_size": 4096,
        "intermediate_size": 21504,
        "num_hidden_layers": 52,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "ssm_state_size": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "conv_kernel": 4,
        "expand": 2,
        "chunk_size": 128,
        "mlp_hidden_act": "relu2",
        "vocab_size": 131072,
        "max_position_embeddings": 8192,
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": False,
        "mlp_bias": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    base = {
        "name": "nh",
        "cluster": {"topology": "dgx-h100"},
        "training": {"global_batch_size": 16, "micro_batch_size": 1},
    }
    hf = load_scenario({**base, "model": {"hf_config": str(tmp_path / "config.json"), "seq_length": 8192}})
    (tmp_path / "run.sh").write_text(
        "torchrun pretrain_mamba.py --num-layers 52 --hidden-size 4096 --ffn-hidden-size 21504 "
        "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --seq-length 8192 "
        "--vocab-size 131072 --squared-relu --normalization RMSNorm --position-embedding-type rope "
        "--untie-embeddings-and-output-weights --disable-bias-linear --is-hybrid-model "
        f"--hybrid-override-pattern {NEMOTRON_H} --mamba-head-dim 64 --mamba-num-heads 128 --mamba-num-groups 8 "
        "--mamba-state-dim 128 --micro-batch-size 1 --bf16\n"
    )
    mg = load_scenario({**base, "megatron_args": str(tmp_path / "run.sh")})
    preset = scenario()
    for s in (hf, mg):
        assert s.model.hybrid_pattern == NEMOTRON_H
        assert s.model.activation == "squared-relu"
        assert parameter_count(s) == parameter_count(preset)
