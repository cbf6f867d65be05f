"""Attention sinks (model.attention_sinks: GPT-OSS's learnable logit per head in each softmax; Megatron-Core
softmax_type learnable): a parameter per head, cuDNN's fused attention where Transformer Engine runs them, the
unfused layer where the stack's kernel has none; read from Hugging Face and Megatron command lines."""

from __future__ import annotations

import json

import pytest

from simulator import load_scenario, simulate
from simulator.errors import ScenarioError
from simulator.scenario.megatron_args import merge_megatron_args
from simulator.workload.params import parameter_count


def scenario(framework: str = "megatron-core-2024", sinks: bool = True, attention: str = "auto"):
    return load_scenario(
        {
            "name": "sinks",
            "framework": framework,
            "model": {
                "preset": "gpt-oss-120b",
                "num_layers": 4,
                "attention_sinks": sinks,
                "attention": attention,
            },
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {"global_batch_size": 8, "micro_batch_size": 1, "precision": "bf16"},
            "parallelism": {"expert_parallel": 8, "zero_stage": 1},
        }
    )


def test_a_sink_is_one_parameter_per_head_and_layer():
    """64 heads x 4 layers = 256 parameters more; the shipped preset states them (36 x 64 = 2,304)."""
    assert parameter_count(scenario()) - parameter_count(scenario(sinks=False)) == 4 * 64
    assert load_scenario({"name": "p", "model": {"preset": "gpt-oss-120b"}, "cluster": {"topology": "dgx-h100"},
                          "training": {"global_batch_size": 8}}).model.attention_sinks  # fmt: skip


def test_transformer_engines_fused_attention_runs_them_at_its_rate_and_flash_attention_2_cannot():
    """Megatron-Core (cuDNN's fused kernel): flash attention, the same step as without sinks. A stack whose kernel
    is FlashAttention-2 runs the unfused layer (auto), and refuses flash in one line naming the field."""
    with_sinks, without = scenario(), scenario(sinks=False)
    assert with_sinks.model.attention == "flash"
    assert simulate(with_sinks).metrics.iteration_time_s == pytest.approx(
        simulate(without).metrics.iteration_time_s, rel=1e-9
    )
    assert scenario("pytorch-2024").model.attention == "standard"
    assert scenario("pytorch-2024", sinks=False).model.attention == "flash"
    with pytest.raises(
        ScenarioError, match="model.attention_sinks: the pytorch-2024 profile's attention kernel"
    ):
        scenario("pytorch-2024", attention="flash")


def test_read_from_hugging_face_and_megatron_and_written_back(tmp_path):
    from simulator.scenario.hf_config import read_hf_config

    cfg = {"model_type": "gpt_oss", "num_hidden_layers": 2, "hidden_size": 2880, "num_attention_heads": 64,
           "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 8,
           "num_experts_per_tok": 2, "vocab_size": 201088, "max_position_embeddings": 4096,
           "hidden_act": "silu"}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert read_hf_config(path)["attention_sinks"] is True
    data = merge_megatron_args({}, ["--softmax-type", "learnable"], "args")
    assert data["model"]["attention_sinks"] is True
    from simulator.study.emit import megatron_model_args

    assert "--softmax-type learnable" in megatron_model_args({"attention_sinks": True})
    assert not any("softmax" in a for a in megatron_model_args({"attention_sinks": False}))
    with pytest.raises(ScenarioError, match="--softmax-type must be vanilla, off-by-one or learnable"):
        merge_megatron_args({}, ["--softmax-type", "sink"], "args")
