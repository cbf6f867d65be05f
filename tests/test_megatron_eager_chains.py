"""The eager chains Megatron-Core runs around its fused kernels for GPT-OSS-style models (Megatron-LM d7288711):
the clamp of a gated activation's input, the quick-GeGLU's offset copied to the GPU on every call (a host sync),
the experts' output bias added per expert, and RoPE unfused where YaRN's attention factor is not 1. Byte counts by
hand from the code's PyTorch ops (workload/elementwise.py)."""

from __future__ import annotations

import json
import math

import pytest

from simulator import load_scenario
from simulator.errors import ScenarioError
from simulator.frameworks import get_framework
from simulator.scenario.megatron_args import merge_megatron_args
from simulator.workload.moe import OFFSET_SYNC
from simulator.workload.transformer import build_workload

# one rank's MoE input: micro batch 1 x 4,096 tokens, top-4 of 128 experts over EP8: 16 local experts, each
# receiving 4,096 x 4 x 8 / 128 = 1,024 rows (uniform), 16,384 rows in all
ROWS, F, H, LOCAL = 16_384, 2880, 2880, 16


def scenario(framework: str = "megatron-core-2024", **model):
    return load_scenario(
        {
            "name": "eager",
            "framework": framework,
            "model": {"preset": "gpt-oss-120b", "num_layers": 4, **model},
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {"global_batch_size": 8, "micro_batch_size": 1, "precision": "bf16"},
            "parallelism": {"expert_parallel": 8, "zero_stage": 1},
        }
    )


def layer(s):
    fw = get_framework(s.framework)
    return build_workload(s, fw, 8, None).layer


def op(ops, name: str):
    found = [o for o in ops if o.name.startswith(name)]
    return found[0] if found else None


def test_the_preset_states_gpt_oss_activation_clamp_and_yarn_factor():
    m = scenario().model
    assert (m.activation, m.activation_clamp, m.gated) == ("quick-geglu", 7.0, True)
    assert m.rope_mscale == pytest.approx(0.1 * math.log(32) + 1, abs=1e-4)


def test_clamp_moves_four_elements_of_the_gate_and_up_forward_and_five_backward():
    """Two clamps (read and write a half each) and a cat (read and write both halves): 4 x rows x 2f x 2 bytes in
    3 kernels; backward two masked gradients (3 halves each) and chunk's cat (2 wholes): 5 x rows x 2f x 2."""
    b = layer(scenario())
    fwd, bwd = op(b.forward, "activation clamp"), op(b.backward, "activation clamp backward")
    assert fwd.bytes == 4 * 2 * ROWS * 2 * F and fwd.launches == 3
    assert bwd.bytes == 5 * 2 * ROWS * 2 * F and bwd.launches == 3
    assert op(layer(scenario(activation_clamp=None)).forward, "activation clamp") is None


def test_quick_geglu_syncs_the_host_once_per_call_and_again_when_moe_act_is_recomputed():
    """weighted_bias_quick_geglu_impl builds torch.tensor(linear_offset, device=...) on every call: a sync before
    the fused kernel, which Megatron's moe_act recompute runs once more (with the clamp)."""
    b = layer(scenario())
    names = [o.name for o in b.forward]
    assert names.count(OFFSET_SYNC) == 1
    assert names.index(OFFSET_SYNC) < names.index("experts quick-geglu (probability-weighted)")
    s = load_scenario(
        {
            "name": "act",
            "framework": "megatron-core-2024",
            "model": {"preset": "gpt-oss-120b", "num_layers": 4},
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {
                "global_batch_size": 8,
                "micro_batch_size": 1,
                "activation_recompute": "selective",
                "recompute": {"modules": ["moe_act"]},
            },
            "parallelism": {"expert_parallel": 8, "zero_stage": 1},
        }
    )
    recomputed = [o.name for o in layer(s).recompute_ops("selective")]
    assert OFFSET_SYNC in recomputed and any(n.startswith("activation clamp") for n in recomputed)
    assert OFFSET_SYNC not in [
        o.name for o in layer(scenario(activation="swiglu", activation_clamp=None)).forward
    ]


def test_the_experts_output_bias_is_added_per_local_expert():
    """t + b p per expert (2 kernels each) and a cat: 6 elements of the rows x h output moved forward in 2 x 16 + 1
    kernels; backward 8 (the bias's and the probability's gradients, split's cat) in 4 x 16 + 1."""
    b = layer(scenario())
    fwd, bwd = op(b.forward, "experts fc2 bias"), op(b.backward, "experts fc2 bias backward")
    assert fwd.bytes == 6 * 2 * ROWS * H and fwd.launches == 2 * LOCAL + 1
    assert bwd.bytes == 8 * 2 * ROWS * H and bwd.launches == 4 * LOCAL + 1
    assert op(layer(scenario(add_bias_linear=False)).forward, "experts fc2 bias") is None


def test_rope_is_unfused_where_yarns_factor_is_not_one():
    """Queries and keys: 4,096 x (64 + 8) heads x 64 elements; fused 4 bytes each way (2 kernels), unfused 12
    forward (24 kernels: 6 large and 6 small per tensor) and 13 backward (14). torchtitan's eager RoPE is its
    own."""
    elems = 4096 * (64 + 8) * 64
    unfused, fused = layer(scenario()), layer(scenario(rope_mscale=1.0))
    assert op(fused.forward, "rope").bytes == 4 * elems and op(fused.forward, "rope").launches == 2
    assert op(unfused.forward, "rope").bytes == 12 * elems and op(unfused.forward, "rope").launches == 24
    assert op(unfused.backward, "rope backward").bytes == 13 * elems
    assert op(unfused.backward, "rope backward").launches == 14
    eager = layer(scenario("pytorch-2024", attention_sinks=False))
    assert op(eager.forward, "rope").bytes == (2 * 2 + 16) * elems


def test_bad_fields_name_themselves():
    with pytest.raises(ScenarioError, match="model.activation_clamp .* activation gelu is not gated"):
        scenario(activation="gelu")
    with pytest.raises(ScenarioError, match="model.rope_mscale .* position_embedding is learned"):
        scenario(position_embedding="learned")


def test_read_from_hugging_face_and_megatron(tmp_path):
    from simulator.scenario.hf_config import read_hf_config

    cfg = {
        "model_type": "gpt_oss",
        "num_hidden_layers": 2,
        "hidden_size": 2880,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "intermediate_size": 2880,
        "num_local_experts": 128,
        "num_experts_per_tok": 4,
        "vocab_size": 201088,
        "swiglu_limit": 7.0,
        "hidden_act": "silu",
        "rope_scaling": {"factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "rope_type": "yarn"},
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    got = read_hf_config(tmp_path / "config.json")
    assert (got["activation"], got["activation_clamp"]) == ("quick-geglu", 7.0)
    assert got["rope_mscale"] == pytest.approx(1.34657, abs=1e-5)
    # DeepSeek-V3's mscale and mscale_all_dim cancel: Megatron-Core's fused RoPE
    dense = {
        k: v for k, v in cfg.items() if k not in ("num_local_experts", "num_experts_per_tok", "swiglu_limit")
    }
    dense.update(model_type="llama", hidden_act="silu")
    dense["rope_scaling"] = {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0}
    (tmp_path / "config.json").write_text(json.dumps(dense))
    assert read_hf_config(tmp_path / "config.json")["rope_mscale"] == 1.0
    data = merge_megatron_args({"name": "m"}, ["--num-layers", "2", "--quick-geglu"], "test")
    assert data["model"]["activation"] == "quick-geglu"
