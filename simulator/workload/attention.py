"""Attention's kernels for one micro-batch on one rank: FlashAttention as one fused kernel (with context
parallelism, ring attention's K/V exchange beside it), or the unfused layer (QK^T, softmax, dropout, PV)."""

from __future__ import annotations

from simulator.scenario.schema import Scenario
from simulator.workload.ops import Op, collective_op, gemm, gemm_backward, memory_op
from simulator.workload.shape import LayerShape


def attention_ops(s: Scenario, sh: LayerShape) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """(forward, backward) ops of attention's core, between the QKV and the output projection."""
    if s.model.attention == "flash":
        return _flash(s, sh)
    return _standard(sh)


def _flash(s: Scenario, sh: LayerShape) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """FlashAttention (Dao 2023): one kernel forward and one backward (2.5x the forward's matmul work)."""
    b, e, d, seq, heads, kv_heads, tokens = sh.b, sh.e, sh.d, sh.seq, sh.heads, sh.kv_heads, sh.tokens
    full_seq = s.model.seq_length
    # with context parallelism each rank's s/cp queries attend to all s keys (ring attention, causal load
    # balancing gives every rank the same share); QK^T and PV, causal masking skips half
    full = 4.0 * b * heads * seq * full_seq * d
    attn_shape = (seq, full_seq, d, b * heads)  # queries x keys x head dim, per (sample, head)
    fwd: tuple[Op, ...] = (
        Op(
            "flash attention",
            "flash_attention",
            full / 2,
            e * tokens * (heads + 2 * kv_heads + heads) * d,
            *attn_shape,
            model_flops=full,
            kernel="flash_attention",
        ),
    )
    bwd: tuple[Op, ...] = (
        Op(
            "flash attention backward",
            "flash_attention",
            2.5 * full / 2,
            e * tokens * 2 * (heads + 2 * kv_heads + heads) * d,
            *attn_shape,
            model_flops=2 * full,
            kernel="flash_attention",
            direction="backward",
        ),
    )
    if s.parallelism.context_parallel > 1:
        # K and V blocks go round the CP ring while the kernel works on the block it has (Liu et al. 2023,
        # Ring Attention; Megatron-Core context parallelism): an all-gather of K,V forward; K,V again and
        # their gradients (a reduce-scatter) backward
        kv = e * b * full_seq * 2 * kv_heads * d  # all of K and V, this rank's heads
        fwd = (*fwd, collective_op("cp ring K/V exchange", "all_gather", "cp", kv, overlaps="previous"))
        bwd = (
            bwd[0],
            collective_op("cp ring K/V exchange", "all_gather", "cp", kv, overlaps="previous"),
            collective_op("cp ring dK/dV exchange", "reduce_scatter", "cp", kv, overlaps="previous"),
        )
    return fwd, bwd


def _standard(sh: LayerShape) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """Megatron-LM's unfused attention: QK^T, scaled masked softmax, dropout and PV as separate kernels."""
    b, e, d, seq, heads = sh.b, sh.e, sh.d, sh.seq, sh.heads
    probs = b * heads * seq * seq
    scores = gemm("attention scores QK^T", seq, seq, d, batch=b * heads)
    context = gemm("attention context PV", seq, d, seq, batch=b * heads)
    softmax = memory_op("scaled masked softmax", 2 * e * probs, "softmax", b * heads * seq, seq)
    dropout = memory_op("attention dropout", (2 * e + 1) * probs, "dropout", b * heads * seq, seq)
    fwd = (scores, softmax, dropout, context)
    bwd = (
        *gemm_backward(context, has_weight=False),
        memory_op(
            "attention dropout backward", (2 * e + 1) * probs, "dropout", b * heads * seq, seq, "backward"
        ),
        memory_op("softmax backward", 3 * e * probs, "softmax", b * heads * seq, seq, "backward"),
        *gemm_backward(scores, has_weight=False),
    )
    return fwd, bwd
