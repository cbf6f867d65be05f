"""Megatron-Core switches the 2025-26 MoE recipes set, each against a hand count: MLA up-projection recompute
(--recompute-modules mla_up_proj), Adam's moments in bf16 (--use-precision-aware-optimizer --exp-avg-dtype bf16
--exp-avg-sq-dtype bf16), SwiGLU's input stored in FP8 (--activation-func-fp8-input-store), and the SMs the
dispatcher holds while its all-to-all hides behind another micro-batch's compute (--moe-flex-dispatcher-num-sms)."""

import pytest
from conftest import make
from test_moe_overlap import Times, a2a, kernel

from simulator import load_scenario, simulate
from simulator.costs.contention import dispatcher_sms, sm_slowdown
from simulator.costs.dispatch import gpu_times
from simulator.errors import ScenarioError
from simulator.strategy.pipeline.combined import merge_layers
from simulator.workload.memory import activation_bytes_per_layer, state_bytes_per_param
from simulator.workload.transformer import build_workload


def deepseek(**training):
    return load_scenario(
        {
            "model": {"preset": "deepseek-v3"},
            "cluster": {"topology": "dgx-h800", "num_nodes": 8},
            "training": {"global_batch_size": 64, "micro_batch_size": 1} | training,
            "parallelism": {"expert_parallel": 64},
        }
    )


def test_mla_up_projection_recompute_drops_queries_keys_and_values_and_reruns_their_gemms():
    """DeepSeek-V3's per-token Q (128 heads x 192), K (x 192) and V (x 128), 16-bit: 2 x 128 x (192 + 192 + 128)
    = 131,072 bytes; a 4,096-token micro-batch's 512 MiB a layer. Recomputed: the q and kv up-projections
    (1,536 -> 128 x 192 and 512 -> 128 x 256) and the rotary assembly."""
    before = deepseek(activation_recompute="selective", recompute={"modules": ["layernorm"]})
    after = deepseek(activation_recompute="selective", recompute={"modules": ["layernorm", "mla_up_proj"]})
    for moe in (False, True):
        saved = activation_bytes_per_layer(before, moe=moe) - activation_bytes_per_layer(after, moe=moe)
        assert saved == 4096 * 2 * 128 * (192 + 192 + 128) == 512 * 2**20
    layer = build_workload(after).layers[-1]
    again = {op.name: op for op in layer.recompute_selective}
    assert {"mla q up-projection", "mla kv up-projection", "mla rotary and key assembly"} <= set(again)
    assert again["mla q up-projection"].flops == 2 * 4096 * 1536 * 128 * 192
    assert again["mla kv up-projection"].flops == 2 * 4096 * 512 * 128 * 256


def test_mla_up_proj_without_latent_attention_is_refused():
    with pytest.raises(ScenarioError, match="mla_up_proj needs multi-head latent attention"):
        make(
            training={
                "global_batch_size": 8,
                "activation_recompute": "selective",
                "recompute": {"modules": ["mla_up_proj"]},
            }
        )


def test_adam_moments_in_bf16_keep_8_bytes_of_optimizer_state_a_parameter():
    assert state_bytes_per_param("bf16", "adam") == (2, 2, 12)  # the ZeRO paper's K = 12
    assert state_bytes_per_param("bf16", "adam", "bf16") == (2, 2, 4 + 2 + 2)
    assert state_bytes_per_param("bf16", "adamw", "fp8") == (2, 2, 4 + 1 + 1)
    par = {"data_parallel": 8, "zero_stage": 1}
    fp32 = simulate(make(training={"global_batch_size": 8}, parallelism=par)).metrics
    bf16 = simulate(
        make(training={"global_batch_size": 8, "optimizer_moments": "bf16"}, parallelism=par)
    ).metrics
    assert bf16.memory_gib["optimizer"] == pytest.approx(fp32.memory_gib["optimizer"] * 8 / 12, rel=1e-9)
    with pytest.raises(ScenarioError, match="needs optimizer adam or adamw"):
        make(training={"global_batch_size": 8, "optimizer": "sgd", "optimizer_moments": "bf16"})


def test_swiglu_input_stored_in_fp8_saves_one_byte_of_each_element():
    """A dense layer's SwiGLU input is the up projection's output, 2 x ffn wide: one byte less a token per element
    (Megatron-Core fused_bias_swiglu.py: ``input.to(torch.float8_e4m3fn)``); an MoE layer's every routed row's."""
    model = {"preset": "llama3-8b"}
    base = {"global_batch_size": 8, "micro_batch_size": 1}
    plain = make(model=model, training=base)
    fp8 = make(model=model, training=base | {"activation_fp8_input_store": True})
    tokens = plain.model.seq_length
    assert activation_bytes_per_layer(plain) - activation_bytes_per_layer(fp8) == tokens * 2 * 14336
    moe_plain, moe_fp8 = deepseek(), deepseek(activation_fp8_input_store=True)
    rows = 4096 * 8  # every token to 8 routed experts (an even load)
    shared = 4096 * 2 * 2048  # and the shared expert's
    saved = activation_bytes_per_layer(moe_plain, moe=True) - activation_bytes_per_layer(moe_fp8, moe=True)
    assert saved == pytest.approx(rows * 2 * 2048 + shared, rel=0.02)  # the busiest rank's rows, within 2%
    with pytest.raises(ScenarioError, match="needs model.activation swiglu"):
        make(
            model={
                "num_layers": 2,
                "hidden_size": 256,
                "num_attention_heads": 4,
                "seq_length": 128,
                "vocab_size": 1000,
                "activation": "gelu",
            },
            training=base | {"activation_fp8_input_store": True},
        )


def test_the_dispatchers_sms_slow_the_compute_it_hides_behind():
    """Three windows (test_moe_overlap's layer pair): 0.5 | combine_b 5 over attn_f 3 | dispatch_f 7 + dispatch_b 7
    over experts 8 + 4 | combine_f 2 over 6.5. With the kernels slowed by s while a collective runs, a window
    takes the longer of its streams: max(5, 3 s), max(14, 12 s), max(2, ...) where only 2 of the 6.5 overlap."""
    fwd = (kernel("attn f"), a2a("dispatch f"), kernel("experts f"), a2a("combine f"), kernel("post f"))
    bwd = (kernel("pre b"), a2a("combine b"), kernel("experts b"), a2a("dispatch b"), kernel("attn b"))
    compute = {"attn f": 3.0, "experts f": 4.0, "post f": 0.5, "pre b": 0.5, "experts b": 8.0, "attn b": 6.0}
    comm = {"combine b": 5.0, "dispatch f": 7.0, "dispatch b": 7.0, "combine f": 2.0}
    s = 132 / (132 - 20)  # DeepEP's 20 SMs of an H100's 132
    gpu, _ = gpu_times(merge_layers(fwd, bwd), Times(compute), lambda op: comm[op.name], s)
    want = 0.5 + max(5.0, 3.0 * s) + max(14.0, 12.0 * s) + (6.5 + 2.0 * (s - 1))
    assert sum(gpu) == pytest.approx(want, rel=1e-12)
    assert sm_slowdown(132, 20) == s
    dsv3 = load_scenario(
        {
            "model": {"preset": "deepseek-v3"},
            "cluster": {"topology": "dgx-h800", "num_nodes": 8},
            "training": {"global_batch_size": 64},
            "parallelism": {"expert_parallel": 64, "moe": {"dispatcher": "deepep", "dispatcher_sms": 24}},
        }
    )
    assert dispatcher_sms(dsv3) == 24
    assert dispatcher_sms(deepseek()) == deepseek().memory.nccl_channels
    with pytest.raises(ScenarioError, match="dispatcher_sms is the flex dispatcher's SM count"):
        make(parallelism={"moe": {"dispatcher_sms": 24}}, training={"global_batch_size": 8})


def test_hybridep_takes_the_routing_map_as_it_is_and_waits_only_where_the_counts_are_unknown():
    """Megatron-LM d98e8a64 token_dispatcher.py _HybridEPManager: the same traffic as DeepEP, no indices to
    multihot; num_permuted_tokens known with drop-and-pad (no CPU sync), None when dropless ("will cause a CPU
    sync"); fused_a2a.py: no FP8 dispatch."""
    from simulator.workload.transformer import build_workload

    def layer(dispatcher: str, pad: bool):
        model = {"preset": "deepseek-v3"} | (
            {"moe": {"capacity_factor": 1.0, "pad_to_capacity": True}} if pad else {}
        )
        s = load_scenario(
            {
                "model": model,
                "cluster": {"topology": "dgx-h800", "num_nodes": 8},
                "training": {"global_batch_size": 64},
                "parallelism": {"expert_parallel": 64, "moe": {"dispatcher": dispatcher}},
            }
        )
        return build_workload(s).layers[-1].forward

    deepep, hybrid, padded = layer("deepep", False), layer("hybridep", False), layer("hybridep", True)
    names = lambda ops: [op.name for op in ops]  # noqa: E731
    assert "indices to multihot" in names(deepep) and "indices to multihot" not in names(hybrid)
    assert "host waits for the received token counts" in names(hybrid)
    assert "host waits for the received token counts" not in names(padded)
    comm = lambda ops: [(op.group, op.bytes) for op in ops if op.kind == "collective" and "deepep" in op.name]  # noqa: E731
    assert comm(deepep) == comm(hybrid)  # the same traffic
    with pytest.raises(ScenarioError, match="HybridEP does not support FP8 dispatch"):
        load_scenario(
            {
                "model": {"preset": "deepseek-v3"},
                "cluster": {"topology": "dgx-h800", "num_nodes": 8},
                "training": {"global_batch_size": 64, "precision": "fp8"},
                "parallelism": {
                    "expert_parallel": 64,
                    "moe": {"dispatcher": "hybridep", "fp8_dispatch": True},
                },
            }
        )
