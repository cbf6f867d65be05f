"""Which attention kernel a stack runs, per GPU architecture (framework profiles' ``gpus: hopper:``), and what the
loss keeps when torch.compile leaves it eager (``training.compile_loss``)."""

import pytest

from simulator import load_scenario
from simulator.frameworks import get_framework
from simulator.validation.crossval import reference
from simulator.workload.loss import head_activation_bytes, head_reserve_bytes


def test_sdpa_runs_flashattention2_on_hopper_only():
    """torch's FlashAttention-2 measured on one H100 at the reference shape of the GPU files (16k tokens, 16 heads of
    128, causal): 319 TFLOP/s forward by the shape fit (327 measured) against the 544 of cuDNN's level the H100 file
    describes: the eager PyTorch profile runs attention at 0.59 of it on every Hopper GPU, 1.0 elsewhere."""
    torch = get_framework("pytorch-2024")
    for gpu in ("h100-sxm5-80gb", "h100-sxm5-96gb-500w", "h200-sxm-141gb", "h100-pcie-80gb"):
        assert torch.on_gpu(gpu).attention_efficiency == 0.59
    for gpu in ("a100-sxm4-80gb", "b200-sxm-180gb"):
        assert torch.on_gpu(gpu).attention_efficiency == 1.0


def test_a_gpus_own_factors_apply_over_its_architectures_and_survive_cross_validation():
    """llm-foundry-2023 on H100 80GB: the architecture's attention factor and the GPU's own fitted GEMM factor
    together; on H100 96 GB only the architecture's. Leaving MosaicML out drops the fitted GEMM factor, keeps the
    attention one (a fact about the kernel, not a fit)."""
    foundry = get_framework("llm-foundry-2023")
    h100 = foundry.on_gpu("h100-sxm5-80gb")
    own = foundry.gpus["h100-sxm5-80gb"].gemm_efficiency
    assert own is not None and own != foundry.gemm_efficiency
    assert h100.attention_efficiency == 0.59 and h100.gemm_efficiency == own
    other = foundry.on_gpu("h100-sxm5-96gb-500w")
    assert other.attention_efficiency == 0.59 and other.gemm_efficiency == foundry.gemm_efficiency
    ref = reference(foundry).on_gpu("h100-sxm5-80gb")
    assert ref.attention_efficiency == 0.59 and ref.gemm_efficiency == 1.0
    assert foundry.on_gpu("not-a-gpu") == foundry  # a stand-in name: nothing applies


def test_flash_attention_by_shape_follows_the_kernels_measured_on_an_h100():
    """The shape factor (tile overhead, grid fill) times the H100 file's 0.55 and the eager PyTorch profile's 0.59
    reproduces every causal head-dim-128 kernel of torch's FlashAttention-2 measured on one H100 that runs 0.1 ms or
    more (docs/measurements/flash_shapes_h100.json): within 11% forward and 5% backward, where one efficiency for
    every shape was off by up to 126% forward (2k tokens, 16 sample-heads) and 207% backward."""
    import json
    from pathlib import Path

    from simulator.costs.attention_rate import flash_shape_factor
    from simulator.hardware.gpus import get_gpu

    h100 = get_gpu("h100-sxm5-80gb")

    path = Path(__file__).resolve().parents[1] / "docs" / "measurements" / "flash_shapes_h100.json"
    if not path.exists():
        pytest.skip("docs/ not in this checkout")
    rows = [
        r
        for r in json.loads(path.read_text())["rows"]
        if r["causal"] and r["head_dim"] == 128 and r["forward_s"] >= 1e-4
    ]
    assert len(rows) == 19
    level = 989 * 0.55 * 0.59
    for direction, within in (("forward", 0.11), ("backward", 0.05)):
        for r in rows:
            model = level * flash_shape_factor(h100, direction, r["seq"], r["seq"], r["batch_heads"])
            assert model == pytest.approx(r[f"{direction}_tflops"], rel=within), (direction, r)
    flat = [337 / r["forward_tflops"] - 1 for r in rows]  # the one rate the profiles had (0.55 x 0.62 x 989)
    assert max(flat) > 1.2
    a100 = get_gpu("a100-sxm4-80gb")  # not measured there: one rate for every shape
    assert flash_shape_factor(a100, "backward", 2048, 2048, 32) == 1.0


def test_flashattention2_at_head_dim_64_runs_slower_per_flop_as_measured_on_an_h100():
    """At head dim 64 the per-score softmax step weighs twice what it does at 128: torch's FlashAttention-2 on one
    H100 ran the 12 causal training shapes (2k-16k tokens, 32-512 sample-heads) at 0.86 (forward) and 0.88
    (backward) of its head-dim-128 rate, median of the measured ratios (docs/measurements/flash_shapes_h100.json);
    the factor gives 0.85 and 0.87, each measured ratio within 25% forward (2k tokens, 32 sample-heads: 0.68) and
    10% backward. On A100, with half
    the matmul rate per SM against the same exponential rate, the step costs half as much: 0.91 and 0.93 (0.94 at head dim 96 on H100). Head
    dims of 128 and more, cuDNN's kernel, MPT's Triton kernel and AMD keep one rate."""
    import json
    from pathlib import Path

    from simulator.costs.attention_rate import flash_head_dim_factor
    from simulator.hardware.gpus import get_gpu

    h100, a100 = get_gpu("h100-sxm5-80gb"), get_gpu("a100-sxm4-80gb")
    assert flash_head_dim_factor(h100, "forward", 64) == pytest.approx(0.849, abs=0.001)
    assert flash_head_dim_factor(h100, "backward", 64) == pytest.approx(0.873, abs=0.001)
    assert flash_head_dim_factor(a100, "forward", 64) == pytest.approx(0.912, abs=0.001)
    assert flash_head_dim_factor(a100, "backward", 64) == pytest.approx(0.928, abs=0.001)
    assert flash_head_dim_factor(h100, "forward", 96) == pytest.approx(0.944, abs=0.001)
    for d in (128, 192, 256):
        assert flash_head_dim_factor(h100, "forward", d) == 1.0
    for kernel in ("fused", "triton-flash"):
        assert flash_head_dim_factor(h100, "forward", 64, kernel) == 1.0
    assert flash_head_dim_factor(get_gpu("mi300x-192gb"), "forward", 64) == 1.0

    path = Path(__file__).resolve().parents[1] / "docs" / "measurements" / "flash_shapes_h100.json"
    if not path.exists():
        pytest.skip("docs/ not in this checkout")
    rows = {
        (r["seq"], r["batch_heads"], r["causal"], r["head_dim"]): r
        for r in json.loads(path.read_text())["rows"]
    }
    for direction, within in (("forward", 0.25), ("backward", 0.10)):
        ratios = [
            r[f"{direction}_tflops"] / rows[(seq, bh, True, 128)][f"{direction}_tflops"]
            for (seq, bh, causal, d), r in rows.items()
            if causal and d == 64 and seq >= 2048 and bh >= 32
        ]
        assert len(ratios) == 12
        assert flash_head_dim_factor(h100, direction, 64) == pytest.approx(sorted(ratios)[6], rel=0.02)
        for ratio in ratios:
            assert flash_head_dim_factor(h100, direction, 64) == pytest.approx(ratio, rel=within)


@pytest.mark.parametrize(("compile_loss", "per_logit", "held"), [(True, 6, 6), (False, 12, 14)])
def test_an_eager_loss_keeps_the_logits_fp32_copy(compile_loss, per_logit, held):
    """Llama 3 8B, 8192 tokens, micro-batch 2, TP 1, compiled blocks: at the loss 4 s b h bytes for the final
    norm's input and, per logit, the most the loss allocates at once. Eager (torchtitan 2024-12-18 ..
    2025-04-02): the 16-bit logits (2), their fp32 copy (4) and log_softmax's output (4) in forward, 10; with the
    copy and the logits freed, backward holds the log-probabilities, nll_loss_backward's fp32 gradient and
    log_softmax_backward's (4 + 4 + 4), 12, and the last of those cannot go in the 6-byte hole the first two
    left under the log-probabilities: 14 held, 2 bytes of holes. Compiled: logits and log-probabilities, the
    16-bit gradient in the logits' hole: 6 and 6."""
    s = load_scenario(
        {
            "model": {"preset": "llama3-8b"},
            "framework": "pytorch-2024",
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {
                "global_batch_size": 16,
                "micro_batch_size": 2,
                "compile": True,
                "compile_loss": compile_loss,
            },
            "parallelism": {"data_parallel": 8, "fsdp": {}},
        }
    )
    tokens = 8192 * 2
    assert head_activation_bytes(s) == 4 * tokens * 4096 + per_logit * tokens * 128256
    assert head_reserve_bytes(s) == (held - per_logit) * tokens * 128256


def test_a_vocabulary_parallel_eager_loss_keeps_x_minus_max_as_well():
    """torchtitan runs the loss vocabulary-parallel under tensor parallelism; torch's loss_parallel log_softmax
    makes x - max and its exp new fp32 tensors beside its fp32 input (2 + 4 + 4 + 4 = 14 in forward), and its
    backward (``_nll_loss_and_log_softmax_backward``: zeros, exp, their sum, times the gradient) holds 16 bytes per
    logit of this rank's vocabulary shard at once, 18 with the hole the forward's copies leave. Under pipelining
    the stage keeps its logits until their backward: 18 at once, no hole."""
    scenario = {
        "model": {"preset": "llama3-70b", "seq_length": 8192},
        "framework": "pytorch-2024",
        "cluster": {"topology": "dgx-h100", "num_nodes": 4},
        "training": {"global_batch_size": 32, "micro_batch_size": 8},
        "parallelism": {"tensor_parallel": 8, "sequence_parallel": True, "data_parallel": 4, "fsdp": {}},
    }
    s = load_scenario(scenario)
    tokens = 8192 * 8
    assert head_activation_bytes(s) == (4 * tokens * 8192 + 16 * tokens * 128256) / 8
    assert head_reserve_bytes(s) == 2 * tokens * 128256 / 8
    scenario["parallelism"] = {**scenario["parallelism"], "data_parallel": 2, "pipeline_parallel": 2}
    s = load_scenario(scenario)
    assert head_activation_bytes(s) == (4 * tokens * 8192 + 18 * tokens * 128256) / 8
    assert head_reserve_bytes(s) == 0


def _mpt(gpu: str, framework: str, **training):
    return load_scenario(
        {
            "model": {
                "num_layers": 2,
                "hidden_size": 2048,
                "num_attention_heads": 16,
                "seq_length": 2048,
                "vocab_size": 50368,
                "attention": "flash",
            },
            "framework": framework,
            "cluster": {"topology": "dgx-h100" if gpu.startswith("h100") else "dgx-a100", "num_nodes": 1},
            "training": {"global_batch_size": 16, "micro_batch_size": 2, **training},
            "parallelism": {"data_parallel": 8, "fsdp": {}},
        }
    )


@pytest.mark.parametrize("gpu", ["a100-sxm4-80gb", "h100-sxm5-80gb"])
def test_mpts_triton_attention_runs_at_half_flashattention2s_rate_at_every_shape(gpu):
    """MPT's Triton FlashAttention (attn_impl: triton; its docstring: forward + backward slightly slower than
    FlashAttention-1, which FlashAttention-2 runs about 2x as fast): every attention kernel takes twice
    FlashAttention-2's time at the same shape and factors, forward and backward, on A100 (one rate) and on H100
    (the same shape curve, since it tiles the same way)."""
    from simulator.costs.compute import ComputeModel
    from simulator.hardware.gpus import get_gpu
    from simulator.workload.transformer import build_workload

    foundry = get_framework("llm-foundry-2023").on_gpu(gpu)
    fa2 = foundry.model_copy(update={"attention_kernel": "flash-attention-2"})
    g = get_gpu(gpu)
    layer = build_workload(_mpt(gpu, "llm-foundry-2023"), gpu=g).layer
    ops = [op for op in (*layer.forward, *layer.backward) if op.kind == "flash_attention"]
    assert {op.direction for op in ops} == {"forward", "backward"}
    triton, flash2 = ComputeModel(g, "bf16", foundry), ComputeModel(g, "bf16", fa2)
    for op in ops:
        launch = op.launches * (
            g.kernel_launch_s + foundry.kernel_overhead_s
        )  # the launch is not the kernel's rate
        assert triton.op_time_s(op) - launch == pytest.approx(2 * (flash2.op_time_s(op) - launch), rel=1e-9)
    # a measured table's attention rows are scaled by the same factor
    assert triton._factor("flash_attention") == pytest.approx(flash2._factor("flash_attention") / 2)


def test_flash_attns_fused_loss_reads_and_keeps_only_the_16_bit_logits():
    """MPT's fused_crossentropy (flash-attn's xentropy kernel): forward reads the bf16 logits once (2 bytes per
    logit), backward reads them and writes their bf16 gradient (4); at the loss the logits and, in backward, their
    gradient are live: 4 bytes per logit, against F.cross_entropy's 10 (its fp32 copy and log_softmax's output)."""
    s = _mpt("a100-sxm4-80gb", "llm-foundry-2023")
    tokens, vocab = 2048 * 2, s.model.vocab_size
    assert head_activation_bytes(s) == 4 * tokens * 2048 + 4 * tokens * vocab
    from simulator.workload.transformer import build_workload

    head = build_workload(s).head
    (fwd,) = [op for op in head.forward if op.kernel == "cross_entropy"]
    (bwd,) = [op for op in head.backward if op.kernel == "cross_entropy"]
    assert (fwd.bytes, bwd.bytes) == (2 * tokens * vocab, 4 * tokens * vocab)
