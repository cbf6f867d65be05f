"""The blocks at the model's two ends: the vocabulary-parallel embedding, and the output head (final norm,
logits, vocabulary-parallel cross-entropy)."""

from __future__ import annotations

from collections.abc import Callable

from simulator.frameworks import Framework
from simulator.scenario.schema import Scenario
from simulator.workload import framework_kernels
from simulator.workload.block import Block, present
from simulator.workload.ops import Op, collective_op, gemm, gemm_backward, memory_op
from simulator.workload.shape import LayerShape, norm, norm_backward

Collective = Callable[[str], Op | None]  # a tensor-parallel collective by name (tensor_parallel.py), or none


def embedding_block(s: Scenario, sh: LayerShape, fw: Framework, scatter_out: Collective) -> Block:
    """Vocabulary-parallel embedding: each rank looks up its slice, the partial outputs are summed (or
    scattered, with sequence parallelism)."""
    m = s.model
    e, tokens, h, v, t, sp = sh.e, sh.tokens, sh.h, sh.v, sh.t, sh.sp
    legacy = fw.kernels == "megatron-legacy"
    pos = m.position_embedding == "learned"
    params = v * h // t + (m.seq_length * h if pos else 0)
    forward = present(
        Op(
            "embedding lookup",
            "memory",
            bytes=e * tokens * h * (3 if pos else 2),
            m=tokens,
            n=h,
            k=v // t,
            kernel="embedding",
        ),
        scatter_out("embedding output"),
        *(framework_kernels.embedding_forward(e, tokens, h, sp, t) if legacy else ()),
    )
    backward = present(
        Op(
            "embedding backward (scatter-add into fp32 grad)",
            "memory",
            bytes=(e + 8) * tokens * h,
            m=tokens,
            n=h,
            k=v // t,
            kernel="embedding",
            direction="backward",
        ),
        # the dense weight gradient is zero-filled, and a tied weight's two gradients (lookup and logits)
        # are summed by autograd (AccumulateGrad)
        memory_op(
            "embedding weight gradient (zero fill, tied sum)",
            e * v * h // t * (4 if m.tied_embeddings else 1),
            direction="backward",
        ),
        *(framework_kernels.embedding_backward(e, tokens, h, sp) if legacy else ()),
        framework_kernels.grad_accumulation(fw, s.training.precision, "embedding", params, 1 + pos),
    )
    return Block("embedding", forward, backward, (), params)


def head_block(
    s: Scenario, sh: LayerShape, fw: Framework, gather_in: Collective, grad_in: Collective
) -> Block:
    """Final norm, logits and the loss. The vocabulary-parallel cross-entropy all-reduces the max, the sum of
    exponentials and the target logit (fp32) over the tensor-parallel group."""
    e, tokens, h, v, t = sh.e, sh.tokens, sh.h, sh.v, sh.t
    legacy = fw.kernels == "megatron-legacy"
    logits = gemm("logits", tokens, v // t, h)
    ce_stats = (
        collective_op("cross-entropy statistics", "all_reduce", "tp", 3 * 4 * tokens) if t > 1 else None
    )
    # Megatron's vocab-parallel cross-entropy on fp32 logits, bytes per logit (megatron/core/tensor_parallel/
    # cross_entropy.py): forward casts to fp32 (e + 4), takes the max (4), subtracts it (8), exponentiates in
    # place (8), sums (4) and divides in place (8); backward scales the saved softmax in place (8) and casts the
    # gradient back (4 + e). PyTorch's F.cross_entropy under autocast: cast (e + 4) and log-softmax (8)
    # forward; NLL backward (4), log-softmax backward (12) and the cast back (4 + e). flash-attn's fused
    # cross-entropy (flash_attn/losses/cross_entropy.py, xentropy_cuda; MPT's fused_crossentropy): one kernel reads
    # the 16-bit logits forward (e), one reads them and writes their gradient backward (2 e)
    # Megatron-Core's fused losses (--cross-entropy-loss-fusion; language_module.py compute_language_model_loss):
    # 'native' (core/fusions/fused_cross_entropy.py): the max pass returns the fp32 logits (e + 4), exp is taken from
    # them (4 + 4) and divided in place (8); backward reads the saved softmax and writes the 16-bit gradient (4 + e).
    # 'te' (Transformer Engine pytorch/triton/cross_entropy.py, v2.x before 2026-07-09, 01bbe3e): an online-softmax
    # pass reads the logits (e), a second reads them again and writes the gradient in place (2 e); backward scales
    # it in place by the per-token grad_output (element_mul_kernel: 2 e)
    fusion = s.training.cross_entropy_fusion
    loss = {"none": "megatron", "native": "megatron-fused", "te": "te"}.get(fusion or "", fw.loss)
    ce_fwd, ce_bwd = {
        "megatron": (e + 32, 12 + e),
        "megatron-fused": (e + 20, 4 + e),
        "te": (3 * e, 2 * e),
        "torch": (e + 12, 20 + e),
        "flash-attn": (e, 2 * e),
    }[loss]
    forward = present(
        norm(sh, "final layernorm"),
        gather_in("logits input"),
        logits,
        ce_stats,
        memory_op("cross-entropy loss (fp32)", tokens * v // t * ce_fwd, "cross_entropy", tokens, v // t),
        *(framework_kernels.loss_forward(tokens) if legacy else ()),
    )
    norm_tensors = 2 if s.model.normalization == "layernorm" else 1
    backward = present(
        memory_op(
            "cross-entropy backward",
            tokens * v // t * ce_bwd,
            "cross_entropy",
            tokens,
            v // t,
            "backward",
        ),
        *gemm_backward(logits),
        grad_in("logits input gradient"),
        norm_backward(sh, "final layernorm backward"),
        *(framework_kernels.loss_backward(tokens) if legacy else ()),
        framework_kernels.grad_accumulation(
            fw, s.training.precision, "final norm", sh.norm_params, norm_tensors
        ),
    )
    return Block("output head", forward, backward, (), v * h // t + sh.norm_params)
