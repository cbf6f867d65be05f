"""Megatron's FusedScaleMaskSoftmax: where its fused causal kernel takes the scores and where it falls back to fp32
torch ops (megatron/model/fused_softmax.py, microsoft/Megatron-DeepSpeed 4822c87e), in time and in memory."""

import pytest
from conftest import make

from simulator.workload.attention import megatron_fused_softmax
from simulator.workload.memory import activation_bytes_per_layer
from simulator.workload.transformer import build_workload

SMALL = {  # vTrain's single-node GPT: 16 heads, so 2 per rank at TP 8
    "attention": "standard",
    "num_layers": 2,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "seq_length": 1024,
    "vocab_size": 50257,
}


@pytest.mark.parametrize(
    "b,heads,sk,fused",
    [
        (1, 2, 1024, False),  # b x heads = 2: not a multiple of 4
        (2, 2, 1024, True),
        (2, 3, 2048, False),  # 6
        (4, 3, 2048, True),  # 12
        (1, 4, 4096, True),
        (1, 4, 4104, False),  # longer than 4096 keys
        (4, 4, 16, False),  # 16 keys or fewer
        (1, 4, 64, False),  # up to 128 keys two rows per warp: 8 rows per block of 128 threads
        (2, 4, 64, True),
        (1, 4, 1022, False),  # keys not a multiple of 4
    ],
)
def test_fused_kernel_takes_the_shapes_megatron_checks(b, heads, sk, fused):
    assert megatron_fused_softmax(b, heads, sk, sk) is fused


def _attention_ops(mb: int, tp: int = 8):
    s = make(
        model=SMALL,
        framework="megatron-2022",
        training={"micro_batch_size": mb, "global_batch_size": mb, "precision": "fp16"},
        parallelism={"tensor_parallel": tp},
        cluster={"gpus_per_node": tp},
    )
    layer = build_workload(s).layer
    pick = lambda ops: [op for op in ops if "softmax" in op.name or "mask fill" in op.name]  # noqa: E731
    return s, pick(layer.forward), pick(layer.backward)


def test_fallback_runs_five_fp32_passes_each_way_by_hand_count():
    """TP 8, micro-batch 1: 1 x 2 heads x 1024 x 1024 scores. Forward: float() 2+4, x scale 4+4, masked_fill_
    4+4, softmax 4+4, half() 4+2 = 36 bytes a score; backward: the cast back 2+4, softmax backward 4+4+4, the
    mask fill's 4+4, the scale's 4+4, the cast 4+2 = 40."""
    _, fwd, bwd = _attention_ops(1)
    probs = 1 * 2 * 1024 * 1024
    assert len(fwd) == 5 and len(bwd) == 5
    assert sum(op.bytes for op in fwd) == 36 * probs
    assert sum(op.bytes for op in bwd) == 40 * probs
    assert all((op.m, op.n) == (2 * 1024, 1024) for op in fwd + bwd)  # rows x keys, for the tables


def test_fused_kernel_is_one_pass_each_way():
    _, fwd, bwd = _attention_ops(2)  # 2 x 2 heads: a multiple of 4
    probs = 2 * 2 * 1024 * 1024
    assert [op.bytes for op in fwd] == [4 * probs]  # fp16 in, fp16 out
    assert [op.bytes for op in bwd] == [6 * probs]  # gradient and output in, gradient out
    _, fwd4, _ = _attention_ops(1, tp=4)  # 4 heads per rank take the kernel at micro-batch 1
    assert len(fwd4) == 1


def test_fallback_keeps_the_softmax_output_in_fp32():
    """Without recompute the layer keeps softmax's output for its backward: 4 bytes a score instead of 2
    (Korthikanti's 5 a s / h becomes 7 a s / h)."""
    s, _, _ = _attention_ops(1)
    s = s.model_copy(update={"training": s.training.model_copy(update={"activation_recompute": "none"})})
    ideal = s.model_copy(update={"framework": "ideal"})  # the model's kernels: the fused softmax
    a, sq, b, t = 16, 1024, 1, 8
    assert activation_bytes_per_layer(s) - activation_bytes_per_layer(ideal) == 2 * a * sq * sq * b / t
