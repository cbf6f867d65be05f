"""GeGLU, the gated GELU MLP of Gemma (transformers GemmaMLP: gate_proj, up_proj, down_proj, gelu_pytorch_tanh;
Megatron-Core gated_linear_unit with gelu): the shapes, FLOPs and bytes of SwiGLU's gated MLP, read from a Hugging
Face config.json (issue 61)."""

import json

import pytest
from conftest import make

from simulator import load_scenario, simulate
from simulator.metrics.flops import megatron_flops
from simulator.workload.transformer import build_workload, parameter_count

GEMMA_7B = {  # google/gemma-7b config.json
    "architectures": ["GemmaForCausalLM"],
    "model_type": "gemma",
    "hidden_act": "gelu",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3072,
    "intermediate_size": 24576,
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 16,
    "head_dim": 256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "vocab_size": 256000,
}


def test_gemma_7b_reads_as_geglu_with_its_published_parameter_count(tmp_path):
    """Gemma 7B: 8.54 B parameters (the model card), tied embeddings of 256,000 x 3,072 counted once; its MLP
    gated, three 3,072 x 24,576 matrices a layer."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA_7B))
    s = make(model={"hf_config": str(path), "seq_length": 4096})
    assert s.model.activation == "geglu" and s.model.gated and s.model.kv_channels == 256
    assert parameter_count(s) == pytest.approx(8.54e9, rel=0.005)


def test_geglu_moves_swiglus_shapes_flops_and_bytes():
    """The same model with geglu and swiglu: equal parameters, model FLOPs, workload ops (names aside) and
    simulated time; gelu (ungated) is smaller."""
    shape = {"preset": "llama3-8b", "seq_length": 1024}
    runs = {a: make(model={**shape, "activation": a}) for a in ("geglu", "swiglu", "gelu")}
    assert parameter_count(runs["geglu"]) == parameter_count(runs["swiglu"]) > parameter_count(runs["gelu"])
    assert megatron_flops(runs["geglu"]) == megatron_flops(runs["swiglu"])
    ops = {a: [(op.kind, op.flops, op.bytes) for op in build_workload(runs[a]).layer.forward] for a in runs}
    assert ops["geglu"] == ops["swiglu"] != ops["gelu"]
    times = {
        a: simulate(load_scenario(runs[a].model_dump(mode="json"))).metrics.iteration_time_s for a in runs
    }
    assert times["geglu"] == times["swiglu"]
