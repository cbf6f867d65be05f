"""A rank's routed experts on Transformer Engine's fused grouped MLP (``parallelism.moe.fused_grouped_mlp``).

Megatron-Core runs the experts through Transformer Engine's operation fuser where ``use_transformer_engine_op_fuser``
is set (Megatron-LM d98e8a64, megatron/core/transformer/moe/experts.py l.285-291, ``_make_fused_ops``: te.ops
GroupedLinear, ScaledSwiGLU or ScaledClampedQGeGLU, GroupedLinear). A gated activation gets there only with
``NVTE_CUTEDSL_FUSED_GROUPED_MLP`` set (l.454-455), and then, on Blackwell (compute capability 10.x) with MXFP8 or
NVFP4 and the GLU interleaved in blocks of 32, TE replaces the three ops with cuDNN's CuTe DSL kernels
(transformer_engine/pytorch/ops/fused/grouped_mlp.py, TE d0067d0d, ``fuse_grouped_mlp_ops`` l.816-873, conditions
l.783-813, l.842-846, l.944-959). Megatron-Bridge's ``cutedsl_fused_grouped_mlp`` sets both. What runs, per
micro-batch:

forward
  * the input quantized (``group_quantize``: added by workload/fp8.py as for any FP8 GEMM);
  * fc1: one grouped GEMM whose epilogue adds the fc1 bias, applies the GLU, multiplies by the routing probability
    and writes the activation quantized row- and column-wise (MXFP8; l.1399-1413): beside the bf16 pre-activation it
    keeps for backward, F x 2 x (1 + 1/32) bytes a row (NVFP4: a bf16 activation, l.1358, then a separate
    Hadamard-transform cast, l.1571-1588); the offsets, the weights' scale swizzle and pointer pack are three small
    launches before it (l.1159-1180, l.1450, l.1515);
  * fc2: a grouped GEMM on the quantized activation, its bias scaled by the probability in the epilogue
    (l.1664-1743): no eager ``_apply_bias``, no separate activation kernel, no clamp chain, no host sync for the
    GLU's offset (those are the unfused TEGroupedMLP's, workload/moe.py);
backward
  * the output gradient quantized (workload/fp8.py); with biases, one grouped dbias / dscales pass re-reading it
    (l.2267-2275);
  * fc2 dgrad as the dGLU kernel: its epilogue re-reads the bf16 pre-activation, recomputes the GLU, applies the
    probability and writes fc1's output gradient quantized row- and column-wise (l.2064-2214): 2F x 2 bytes read and
    2F x 2 x (1 + 1/32) written a row (NVFP4: bf16, re-quantized after, l.2305-2317);
  * fc2 wgrad, fc1 dgrad, fc1 wgrad: one grouped kernel each (l.481-627, l.2406-2491).

Each expert's rows are padded to a multiple of 256 (moe_utils.py l.1472-1474, experts.py l.308-313). The flex
dispatchers pad as they permute; behind the all-to-all dispatcher Megatron pads and unpads itself
where an expert's rows are not aligned (``Fp8Padding``: one copy of the rows each way, none when they are; TE
module/fp8_padding.py l.20-123) and sends
the padded split sizes to the GPU from a host list (experts.py l.736-748: ``torch.tensor(..., device=cuda)``, a
pageable copy the host waits for).

The epilogue's bytes are the GEMM's traffic (``Op.epilogue_bytes``): they cost time only where they make the GEMM
memory-bound. Not modelled: the bf16 output the dGLU kernel does not write (2F bytes a row, counted), the weights'
per-step quantization launches (one per expert with discrete weights). Activations saved for backward are the
unfused path's (the input's column copy, the bf16 pre-activation, the activation's column copy).
"""

from __future__ import annotations

from dataclasses import replace

from simulator.workload.block import present
from simulator.workload.ops import Op, gemm, gemm_backward, memory_op, routed_share, sync_op

ALIGN = (
    256  # rows per expert: Megatron-Core pads to it with the op fuser / grouped tensor (moe_utils.py l.1472)
)
PROB_BYTES = 4  # the routing probability read forward, its gradient written backward (fp32)
SETUP_LAUNCHES = (
    3  # offsets, the weights' scale swizzle, the pointer pack (grouped_mlp.py l.1159-1180, l.1450, l.1515)
)
SPLITS_SYNC = "host sync: the padded split sizes copied to the GPU (torch.tensor)"


def padded(rows_per_expert: float) -> int:
    """An expert's rows after padding to a multiple of 256."""
    return max(-(-round(rows_per_expert) // ALIGN) * ALIGN, ALIGN)


def written_bytes(recipe: str) -> float:
    """Bytes per element an epilogue writes in place of the next GEMM's cast: MXFP8 the row- and column-wise copies
    with an E8M0 scale per 32; NVFP4 a bf16 tensor that a separate Hadamard-transform cast quantizes."""
    return 2 * (1 + 1 / 32) if recipe == "mxfp8" else 2.0


def experts(
    name: str,
    rows: float,
    real: float,
    local: int,
    f_up: int,
    f_rank: int,
    h: int,
    recipe: str,
    bias: bool,
    pads: bool,
    sync_s: float,
) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """(forward, backward) ops of ``local`` experts over ``rows`` routed rows (``real`` of them tokens, the rest the
    dispatcher's padding): fc1 ``h -> f_up`` with the GLU in its epilogue, fc2 ``f_rank -> h``. ``pads``: Megatron
    pads the rows itself (the all-to-all dispatcher); ``sync_s``: the profile's host synchronisation."""
    per = padded(rows / local)
    total = per * local
    share = min(real / total, 1.0)  # total >= 256 (padded)
    w = written_bytes(recipe)
    fc1 = gemm(f"{name} fc1 (fused GLU epilogue)", per, f_up, h, local, linear=True, grouped=True)
    fc1 = replace(fc1, epilogue_bytes=total * (f_rank * w + PROB_BYTES), launches=1 + SETUP_LAUNCHES)
    fc2 = gemm(f"{name} fc2", per, h, f_rank, local, linear=True, grouped=True)
    fc2 = replace(fc2, prequantized=True)
    fc2_dgrad, fc2_wgrad = (routed_share(o, share) for o in gemm_backward(fc2))
    fc2_dgrad = replace(
        fc2_dgrad,
        name=f"{name} fc2 dgrad (fused dGLU epilogue)",
        epilogue_bytes=total * (2 * f_up + f_up * w + 2 * PROB_BYTES),
    )
    fc1_dgrad, fc1_wgrad = (routed_share(o, share) for o in gemm_backward(fc1))
    fc1_dgrad = replace(fc1_dgrad, name=f"{name} fc1 dgrad", prequantized=True)
    fc1_wgrad = replace(fc1_wgrad, name=f"{name} fc1 wgrad")
    fc1, fc2 = routed_share(fc1, share), routed_share(fc2, share)
    dbias = (
        memory_op(f"{name} fc2 bias and probability gradients", total * 2 * h, "", total, h, "backward")
        if bias
        else None
    )
    copy = 4 * total * h  # a bf16 row read and written
    misaligned = pads and round(rows / local) % ALIGN != 0  # TE's Fp8Padding copies nothing when aligned

    def pad(what: str, direction: str = "forward") -> Op | None:
        return memory_op(f"{name}: {what}", copy, "", total, h, direction) if misaligned else None

    forward = (
        pad("pad each expert's rows to 256"),
        sync_op(SPLITS_SYNC, sync_s) if pads else None,
        fc1,
        fc2,
        pad("unpad the output"),
    )
    backward = (
        pad("unpad backward", "backward"),
        dbias,
        fc2_dgrad,
        fc2_wgrad,
        fc1_dgrad,
        fc1_wgrad,
        pad("pad backward", "backward"),
    )
    return present(*forward), present(*backward)
