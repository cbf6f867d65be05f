"""Parameter counts, FLOPs and activation memory against the papers' formulas."""

import pytest
from conftest import make

from simulator.costs.compute import ComputeModel, gemm_efficiency
from simulator.hardware.gpus import get_gpu
from simulator.workload.memory import activation_bytes_per_layer
from simulator.workload.transformer import build_workload, parameter_count

GPT3 = {
    "num_layers": 96,
    "hidden_size": 12288,
    "num_attention_heads": 96,
    "seq_length": 2048,
    "vocab_size": 51200,
}


def test_parameter_count_is_narayanan_eq2_plus_the_final_layernorm():
    s = make(model=GPT3)
    l, h, V, sq = 96, 12288, 51200, 2048
    eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (V + sq) / (12 * l * h))
    assert parameter_count(s) == pytest.approx(eq2 + 2 * h, rel=1e-12)


@pytest.mark.parametrize(
    "preset,billions",
    [
        ("llama3-8b", 8.03),
        ("llama3-70b", 70.55),
        ("llama3-405b", 405.85),
        ("llama2-7b", 6.74),
        ("mistral-7b", 7.24),
    ],
)
def test_preset_parameter_counts_match_the_model_cards(preset, billions):
    s = make(model={"preset": preset, "seq_length": 1024})
    assert parameter_count(s) / 1e9 == pytest.approx(billions, abs=0.01)


def test_model_flops_equal_megatrons_72_bslh2_formula():
    s = make(
        model=GPT3, training={"global_batch_size": 8, "micro_batch_size": 2}, cluster={"gpus_per_node": 4}
    )
    w = build_workload(s)
    B, sq, l, h, V = 2, 2048, 96, 12288, 51200
    megatron = 72 * B * sq * l * h * h * (1 + sq / (6 * h) + V / (12 * l * h))
    assert w.model_flops_per_microbatch == pytest.approx(megatron, rel=1e-12)


KOR = {  # Korthikanti et al.'s formulas count the unfused attention's activations
    "attention": "standard",
    "num_layers": 4,
    "hidden_size": 6144,
    "num_attention_heads": 64,
    "seq_length": 2048,
    "vocab_size": 51200,
}


@pytest.mark.parametrize(
    "tp,sp,recompute,formula",
    [
        (1, False, "none", lambda s, b, h, a, t: s * b * h * (34 + 5 * a * s / h)),
        (8, False, "none", lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
        (8, True, "none", lambda s, b, h, a, t: s * b * h / t * (34 + 5 * a * s / h)),
        (8, True, "selective", lambda s, b, h, a, t: s * b * h * 34 / t),
        (8, False, "full", lambda s, b, h, a, t: 2 * s * b * h),
    ],
)
def test_activation_memory_per_layer_follows_korthikanti_2022(tp, sp, recompute, formula):
    s = make(
        model=KOR,
        training={"micro_batch_size": 4, "global_batch_size": 4, "activation_recompute": recompute},
        parallelism={"tensor_parallel": tp, "sequence_parallel": sp, "data_parallel": 1},
        cluster={"gpus_per_node": tp},
    )
    assert activation_bytes_per_layer(s) == pytest.approx(formula(2048, 4, 6144, 64, tp), rel=1e-12)


def test_large_square_gemm_reaches_the_profile_best_efficiency_less_the_depth_term():
    a100 = get_gpu("a100-sxm4-80gb")
    eff = gemm_efficiency(a100, 256 * 108, 128 * 4, 8192)  # exactly 4 full waves of 256x128 tiles
    best, k_half = a100.gemm.max_efficiency, a100.gemm.k_half
    assert (best, k_half) == (0.82, 192)  # fitted on the shipped A100 table's GEMMs (docs/calibration.md)
    assert eff == pytest.approx(best * 8192 / (8192 + k_half), rel=1e-12)


def test_wave_quantization_one_tile_too_many_costs_a_whole_wave_or_a_split_reduction():
    a100 = get_gpu("a100-sxm4-80gb")
    best, k_half = a100.gemm.max_efficiency, a100.gemm.k_half
    full = gemm_efficiency(a100, 128 * 108, 128, 4096)
    spill = gemm_efficiency(a100, 128 * 109, 128, 4096)
    # 109 128x128 tiles on 108 SMs: whole, two waves, the second nearly empty (0.95 x 109 / 216 = 0.48 of the
    # tile rate); split-K does better: 54.5 256x128 tiles' worth in 5 K slices, 275 tiles in 3 waves of 108,
    # each slice 4096 / 5 deep
    assert spill == pytest.approx(best * 5 * 54.5 / 324 * 4096 / (4096 + 5 * k_half), rel=1e-12)
    assert 0.5 * full < spill < 0.8 * full


def test_split_k_fills_the_sms_a_narrow_tp_chunk_leaves_idle():
    """A TP-8 chunk of GPT-3's QKV GEMM, 256 rows x 4608 x 12288, has 36 256x128 tiles for the H200's 132 SMs:
    split 7 ways, 252 tiles fill 2 waves of 132 less 12, each 12288 / 7 deep. Timed on an H200 it ran at 0.60
    of the bf16 peak (docs/measurements/h200-tp-split-gemm.json: 296.6 us x 1.307 / 8 for 29 GFLOP)."""
    h200 = get_gpu("h200-sxm-141gb")
    best, k_half = h200.gemm.max_efficiency, h200.gemm.k_half
    eff = gemm_efficiency(h200, 256, 4608, 12288)
    assert eff == pytest.approx(best * 252 / 264 * 12288 / (12288 + 7 * k_half), rel=1e-12)
    assert eff > 1.5 * best * 36 / 132  # one slice: 36 of 132 SMs busy


def test_memory_bound_kernel_time_is_bytes_over_achievable_bandwidth_plus_launch():
    a100 = get_gpu("a100-sxm4-80gb")
    cm = ComputeModel(a100, "bf16")
    from simulator.workload.ops import memory_op

    assert cm.op_time_s(memory_op("x", 1e9)) == pytest.approx(1e9 / (2039e9 * 0.85) + 4e-6, rel=1e-12)


def test_grouped_query_attention_and_swiglu_change_the_layer():
    llama = make(model={"preset": "llama3-8b", "seq_length": 2048}).model
    assert llama.query_groups == 8 and llama.ffn_size == 14336 and llama.activation == "swiglu"
    gqa = build_workload(make(model={"preset": "llama3-8b", "seq_length": 1024}))
    mha = build_workload(make(model={"preset": "llama3-8b", "seq_length": 1024, "num_query_groups": 32}))
    assert gqa.layer.params < mha.layer.params
    h, d = 4096, 128
    assert mha.layer.params - gqa.layer.params == 2 * h * (32 - 8) * d


@pytest.mark.parametrize(
    ("fusion", "forward", "backward"),
    [(None, 2 + 32, 12 + 2), ("none", 2 + 32, 12 + 2), ("native", 2 + 20, 4 + 2), ("te", 3 * 2, 2 * 2)],
)
def test_the_fused_losses_move_the_bytes_their_code_moves(fusion, forward, backward):
    """Bytes per bf16 logit of the loss, forward and backward, with Megatron-Core's --cross-entropy-loss-fusion:
    unfused vocab_parallel_cross_entropy (the profile's default, 'megatron': e + 32, 12 + e), the jit-fused native
    one (e + 20, 4 + e) and Transformer Engine's Triton kernel (3 e, 2 e)."""
    tokens, vocab = 1024, 50304
    training = {"cross_entropy_fusion": fusion} if fusion else {}
    s = make(
        model={"preset": "gpt3-125m", "seq_length": 1024, "vocab_size": vocab},
        training=training,
        framework="megatron-core-2024",
    )
    w = build_workload(s)
    ops = {op.name: op for op in (*w.head.forward, *w.head.backward)}
    assert ops["cross-entropy loss (fp32)"].bytes == tokens * vocab * forward
    assert ops["cross-entropy backward"].bytes == tokens * vocab * backward
