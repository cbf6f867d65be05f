"""Mixture-of-experts models: presets and Hugging Face configs give the published parameter counts, total and
active, and the layer pattern each family builds."""

import json
from pathlib import Path

import pytest

from simulator.scenario.loader import load_scenario
from simulator.workload.params import active_parameter_count, parameter_count

HF = Path(__file__).parent / "data" / "hf"

# (total, active, active counts the input embedding, decimal places the publisher rounds to (billions), source)
PUBLISHED = {
    "mixtral-8x7b": (
        46.7,
        12.9,
        True,
        1,
        "Mistral AI, 'Mixtral of experts' (2023-12-11): 46.7B total, 12.9B per token",
    ),
    "mixtral-8x22b": (
        141,
        39,
        True,
        0,
        "Mistral AI, 'Cheaper, Better, Faster, Stronger' (2024-04-17): 39B of 141B",
    ),
    "qwen2-57b-a14b": (57, 14, True, 0, "Qwen/Qwen2-57B-A14B model card; Qwen2 report arXiv 2407.10671"),
    "qwen3-30b-a3b": (30.5, 3.3, True, 1, "Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B activated"),
    "qwen3-235b-a22b": (235, 22, True, 0, "Qwen/Qwen3-235B-A22B model card: 235B total, 22B activated"),
    "deepseek-v2-lite": (
        15.7,
        2.4,
        False,
        1,
        "DeepSeek-V2, arXiv 2405.04434 App. B: 15.7B total, 2.4B activated",
    ),
    "deepseek-v3": (
        671,
        37,
        False,
        0,
        "DeepSeek-V3 README: 671B total, 37B activated (36.6B with the output head)",
    ),
    "olmoe-1b-7b": (6.9, 1.3, True, 1, "OLMoE, arXiv 2409.02060; allenai/OLMoE-1B-7B-0924 card: 6.9B / 1.3B"),
}


# presets read by hand from their configs (no Hugging Face reader for their model types yet)
BY_HAND = {
    "gpt-oss-120b": (116.83, 5.13, False, 2, "openai/gpt-oss-120b model card: 116.83B total, 5.13B active"),
    "llama4-maverick": (
        400,
        17,
        True,
        0,
        "meta-llama/Llama-4-Maverick-17B-128E model card: 17B active, 400B total",
    ),
}


def published_as(count: int, places: int) -> tuple[float, float]:
    """A count in billions as a publisher writes it to ``places`` decimals: rounded, or cut."""
    billions = count / 1e9
    return round(billions, places), int(billions * 10**places) / 10**places


def scenario(model) -> object:
    return load_scenario(
        {
            "model": model,
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {"global_batch_size": 8},
        },
        base_dir=HF,
    )


@pytest.mark.parametrize("name", sorted(PUBLISHED | BY_HAND))
def test_presets_give_the_published_total_and_active_parameters(name):
    total, active, with_embedding, places, _ = (PUBLISHED | BY_HAND)[name]
    s = scenario(name)
    # equal at the precision published: rounded (46.70 -> 46.7) or cut (Qwen's 3.353 -> 3.3, DeepSeek's 2.451 -> 2.4)
    assert total in published_as(parameter_count(s), places)
    active_count = active_parameter_count(s, embedding=with_embedding)
    assert active in published_as(active_count, places)


def test_exact_counts_of_two_models_from_their_shapes():
    # Mixtral 8x7B: 32 x (41.9M attention + 8 x 176.2M experts + router + norms) + 2 x 131M embedding and head
    assert parameter_count(scenario("mixtral-8x7b")) == 46_702_792_704
    # DeepSeek-V3: 3 dense layers, 58 MoE layers of 256 + 1 shared experts, MLA (187.1M per layer)
    assert parameter_count(scenario("deepseek-v3")) == 671_026_419_200
    assert active_parameter_count(scenario("deepseek-v3"), embedding=False) == 36_625_618_432


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_hugging_face_configs_read_as_the_presets(name):
    from_hf = scenario({"hf_config": f"{name}.json", "seq_length": 4096})
    preset = scenario(name)
    assert parameter_count(from_hf) == parameter_count(preset)
    assert active_parameter_count(from_hf) == active_parameter_count(preset)
    assert from_hf.model.moe.model_dump() == preset.model.moe.model_dump()
    assert [from_hf.model.is_moe_layer(i) for i in range(from_hf.model.num_layers)] == [
        preset.model.is_moe_layer(i) for i in range(preset.model.num_layers)
    ]


def test_layer_patterns():
    v3 = scenario("deepseek-v3").model
    assert [v3.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert v3.moe_layers == 58
    every_other = scenario({"preset": "mixtral-8x7b", "moe": {"layer_freq": 2}}).model
    assert [every_other.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert every_other.moe_layers == 16


def test_overrides_merge_into_a_presets_subsections():
    s = scenario({"preset": "mixtral-8x7b", "moe": {"capacity_factor": 1.25}})
    assert s.model.moe.num_experts == 8 and s.model.moe.capacity_factor == 1.25


def test_the_fixtures_are_the_published_configs_keys():
    cfg = json.loads((HF / "deepseek-v3.json").read_text())
    assert cfg["n_routed_experts"] == 256 and cfg["first_k_dense_replace"] == 3 and cfg["q_lora_rank"] == 1536


def test_a_gpt_oss_config_reads_as_the_preset(tmp_path):
    """openai/gpt-oss-120b's shape as its config.json states it (GptOssConfig keys; layer_types alternate sliding
    and full attention from the first layer)."""
    cfg = {
        "model_type": "gpt_oss",
        "attention_bias": True,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention"] * 18,
        "num_attention_heads": 64,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "num_local_experts": 128,
        "rms_norm_eps": 1e-05,
        "rope_theta": 150000,
        "sliding_window": 128,
        "tie_word_embeddings": False,
        "vocab_size": 201088,
    }
    (tmp_path / "gpt-oss-120b.json").write_text(json.dumps(cfg))
    from_hf = load_scenario(
        {
            "model": {"hf_config": "gpt-oss-120b.json", "seq_length": 4096},
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {"global_batch_size": 8},
        },
        base_dir=tmp_path,
    )
    preset = scenario("gpt-oss-120b")
    # 116,829,149,760 without the attention sinks, one logit per head and layer: 36 x 64 = 2,304 more
    assert parameter_count(from_hf) == parameter_count(preset) == 116_829_149_760 + 36 * 64
    assert from_hf.model.moe.model_dump() == preset.model.moe.model_dump()
    assert (from_hf.model.sliding_window, from_hf.model.full_attention_every) == (128, 2)
