"""Sliding-window attention (Mistral 7B v0.1, Gemma 2 / 3, GPT-OSS): windowed layers' attention work by hand, the
layers' mix, Hugging Face configs read as transformers reads them (issue 61)."""

import json

import pytest
from conftest import make

from simulator.errors import ScenarioError
from simulator.metrics.flops import megatron_flops
from simulator.workload.transformer import build_workload


def share(**model) -> float:
    return make(model={"preset": "llama3-8b", "seq_length": 8192, **model}).model.attention_work_share(8192)


def test_the_windowed_work_by_hand():
    """8,192 tokens, a 4,096 window: a query sees (4,096 x 4,097 / 2 + 4,096 x 4,096) / 8,192 = 3,072.25 keys on
    average against causal attention's 4,096.5: 0.74998 of the work; every other layer full: 0.87499. A window of
    the whole sequence or more changes nothing; none given, nothing."""
    windowed = 3072.25 / 4096.5
    assert share(sliding_window=4096) == pytest.approx(windowed, rel=1e-12)
    assert share(sliding_window=4096, full_attention_every=2) == pytest.approx((1 + windowed) / 2, rel=1e-12)
    assert share(sliding_window=8192) == share(sliding_window=10**6) == share() == 1.0


def test_the_attention_kernels_do_the_windowed_work_and_the_model_flops_stay_megatrons():
    """GPT-OSS's pattern (a 128-token window on every other layer) at 4,096 tokens: the average layer runs the full
    layers' kernel for half its work and the windowed layers' kernel, which sees (128 x 129 / 2 + 3,968 x 128) /
    4,096 = 126.0 keys a query, for the other half: (1 + 126.0 / 2,048) / 2 = 0.5308 of full causal attention's
    FLOPs, forward and backward (model.attention_work_share's average, which takes the causal keys as 2,048.5, within
    0.03%); the model FLOPs count full causal attention, as Megatron-LM's num_floating_point_operations does."""
    base = {"preset": "llama3-8b", "seq_length": 4096}
    plain, gpt_oss = (
        make(model={**base, **extra}) for extra in ({}, {"sliding_window": 128, "full_attention_every": 2})
    )
    keys = (128 * 129 / 2 + (4096 - 128) * 128) / 4096
    expected = (1 + keys / 2048) / 2
    assert gpt_oss.model.attention_work_share(4096) == pytest.approx(expected, rel=3e-4)
    assert expected == pytest.approx(0.5308, abs=1e-4)
    for direction in ("forward", "backward"):
        full, windowed = (
            [op for op in getattr(build_workload(s).layer, direction) if op.kind == "flash_attention"]
            for s in (plain, gpt_oss)
        )
        assert [op.window for op in windowed] == [0, 128]
        assert sum(op.flops for op in windowed) == pytest.approx(full[0].flops * expected, rel=1e-12)
        assert sum(op.model_flops for op in windowed) == pytest.approx(full[0].model_flops, rel=1e-12)
    assert megatron_flops(gpt_oss) == megatron_flops(plain)


@pytest.mark.parametrize(
    ("extra", "window", "every"),
    [
        ({"model_type": "mistral", "sliding_window": 4096}, 4096, None),
        ({"model_type": "gemma3_text", "sliding_window": 1024, "sliding_window_pattern": 6}, 1024, 6),
        ({"model_type": "gemma2", "sliding_window": 4096}, 4096, 2),
        (
            {
                "model_type": "gpt_oss",
                "sliding_window": 128,
                "layer_types": ["sliding_attention", "full_attention"] * 16,
            },
            128,
            2,
        ),
        ({"model_type": "qwen2", "sliding_window": 131072, "use_sliding_window": False}, None, None),
        ({"model_type": "llama", "sliding_window": None}, None, None),
    ],
)
def test_hugging_face_configs_state_their_windows(tmp_path, extra, window, every):
    cfg = {
        "hidden_act": "silu",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_attention_heads": 16,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": 32000,
        **extra,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = make(model={"hf_config": str(tmp_path / "config.json"), "seq_length": 8192}).model
    assert (m.sliding_window, m.full_attention_every) == (window, every)


def test_a_window_is_a_whole_number_of_tokens():
    with pytest.raises(ScenarioError, match="sliding_window"):
        make(model={"preset": "llama3-8b", "seq_length": 4096, "sliding_window": 0})


def test_chunked_attention_by_hand():
    """Llama 4's chunked attention: 8,192-token chunks at 32,768 tokens, a query i sees (i mod 8,192) + 1 keys,
    4 x 8,192 x 8,193 / 2 / 32,768 = 4,096.5 on average against causal's 16,384.5: 0.25002 of the work; every 4th
    layer global (the NoPE layers): (1 + 3 x 0.25002) / 4. A remainder chunk counts its own triangle: 20,000 tokens
    are two chunks and 3,616 tokens, (2 x 8,192 x 8,193 / 2 + 3,616 x 3,617 / 2) / 20,000 keys. A chunk of the whole
    sequence or more changes nothing."""

    def chunked(seq, **extra):
        return make(
            model={"preset": "llama3-8b", "seq_length": seq, "attention_chunk_size": 8192, **extra}
        ).model.attention_work_share(seq)

    one = 4096.5 / 16384.5
    assert chunked(32768) == pytest.approx(one, rel=1e-12)
    assert chunked(32768, full_attention_every=4) == pytest.approx((1 + 3 * one) / 4, rel=1e-12)
    rest = (2 * 8192 * 8193 / 2 + 3616 * 3617 / 2) / 20000 / (20001 / 2)
    assert chunked(20000) == pytest.approx(rest, rel=1e-12)
    assert chunked(8192) == 1.0
    with pytest.raises(ScenarioError, match="windowed or chunked, not both"):
        make(
            model={
                "preset": "llama3-8b",
                "seq_length": 4096,
                "sliding_window": 1024,
                "attention_chunk_size": 512,
            }
        )


def test_llama4_reads_its_chunks_and_nope_layers(tmp_path):
    """A Llama 4 text config: attention_chunk_size 8,192 and no_rope_layers with every 4th layer 0 (NoPE, global)
    give 8,192-token chunks and full attention every 4th layer; the Maverick preset states the same."""
    cfg = {
        "model_type": "llama4_text",
        "hidden_act": "silu",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_attention_heads": 16,
        "num_hidden_layers": 8,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "vocab_size": 32000,
        "attention_chunk_size": 8192,
        "no_rope_layers": [1, 1, 1, 0] * 2,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = make(model={"hf_config": str(tmp_path / "config.json"), "seq_length": 32768}).model
    assert (m.attention_chunk_size, m.full_attention_every, m.sliding_window) == (8192, 4, None)
    maverick = make(model={"preset": "llama4-maverick", "seq_length": 32768}).model
    assert (maverick.attention_chunk_size, maverick.full_attention_every, maverick.windowed_layers) == (
        8192,
        4,
        36,
    )
