"""A hybrid model's Mamba-2 mixer (``model.hybrid_pattern``'s M layers) as kernels for one micro-batch on one
tensor-parallel rank.

Megatron-Core's ``MambaMixer`` (megatron/core/ssm/mamba_mixer.py, Megatron-LM d98e8a64) in training:
- ``in_proj``, one column-parallel linear layer writing z, x, B, C and dt together: 2 d_inner + 2 G N + H outputs,
  split over the TP ranks by heads and groups (H / t heads, G / t groups on a rank);
- ``mamba_split_conv1d_scan_combined`` (mamba_ssm's memory-efficient path, ``use_mamba_mem_eff_path`` on by
  default): the causal depthwise convolution of x, B and C with its SiLU, then the SSD chunked scan;
- the gated RMSNorm of y by z (``ExtendedRMSNorm``, grouped by G), and ``out_proj``, row-parallel back to hidden.

The SSD scan (Dao and Gu 2024, "Transformers are SSMs", Sec. 6; mamba_ssm ops/triton/ssd_*.py) cuts the sequence
into chunks of Q tokens and runs four batched matrix multiplies per chunk: C B^T per group (Q x Q over N), its
masked product with x per head (Q x P over Q), the chunk's state B^T x per head (N x P over Q) and the output from
the previous chunks' state C s per head (Q x P over N); between chunks the fp32 states are passed along
(memory-bound). With G = 8, Q = N = 128, P = 64 and 128 heads this is 6.6 MFLOP a token, where Megatron's own count
(training.py ``mamba_layer_flops``: 7 d_inner N) says 7.3. The backward runs each product's two gradients, and
the memory-efficient path recomputes the convolution before them.
"""

from __future__ import annotations

from simulator.scenario.schema import Scenario
from simulator.workload.block import Part, present
from simulator.workload.ops import gemm, gemm_backward, linear, memory_op
from simulator.workload.params import mamba_mixer_params, mamba_widths
from simulator.workload.shape import LayerShape


def mamba_part(s: Scenario, sh: LayerShape, tp) -> Part:
    """The mixer between its tensor-parallel collectives (as the MLP's: all-gather in and reduce-scatter out with
    sequence parallelism, else an all-reduce out)."""
    gather_in, scatter_out, grad_in, grad_out, regather = tp
    c = s.model.mamba_config
    e, tokens, h, t = sh.e, sh.tokens, sh.h, sh.t
    d_in, heads, gn, proj = mamba_widths(s.model)
    d_loc, h_loc, g_loc, conv_loc = d_in // t, heads // t, c.num_groups // t, (d_in + 2 * gn) // t
    n, p, q = c.state_dim, c.head_dim, c.chunk_size
    chunks = sh.b * -(-sh.seq // q)  # chunks of every sequence of the micro-batch
    up = linear("mamba in_proj (z, x, B, C, dt)", tokens, proj // t, h)
    conv = memory_op("mamba causal conv1d + SiLU", 2 * e * tokens * conv_loc)
    scan = (
        gemm("ssd C B^T (per group)", q, q, n, chunks * g_loc),
        gemm("ssd intra-chunk output (per head)", q, p, q, chunks * h_loc),
        gemm("ssd chunk states B^T x (per head)", n, p, q, chunks * h_loc),
        gemm("ssd inter-chunk output C s (per head)", q, p, n, chunks * h_loc),
    )
    states = 4 * chunks * h_loc * p * n  # fp32 chunk states: written, read and written passing along, read
    passing = memory_op("ssd state passing (fp32)", 3 * states)
    gate_norm = memory_op("mamba gated rmsnorm (y, z)", 3 * e * tokens * d_loc, "rmsnorm", tokens, d_loc)
    down = linear("mamba out_proj", tokens, h, d_loc)
    forward = present(
        gather_in("mamba input"), up, conv, *scan, passing, gate_norm, down, scatter_out("mamba output")
    )
    scan_bwd = tuple(g for op in reversed(scan) for g in gemm_backward(op, has_weight=False))
    backward = present(
        grad_out("mamba output gradient"),
        *gemm_backward(down),
        memory_op(
            "mamba gated rmsnorm backward", 5 * e * tokens * d_loc, "rmsnorm", tokens, d_loc, "backward"
        ),
        memory_op("mamba causal conv1d recompute (memory-efficient path)", 2 * e * tokens * conv_loc),
        memory_op("ssd state passing backward (fp32)", 3 * states, direction="backward"),
        *scan_bwd,
        memory_op("mamba causal conv1d backward", 3 * e * tokens * conv_loc, direction="backward"),
        regather("mamba input"),
        *gemm_backward(up),
        grad_in("mamba input gradient"),
    )
    return Part(forward, backward, mamba_mixer_params(s.model, t))


def mamba_activation_bytes(s: Scenario) -> float:
    """Bytes one mixer keeps for its backward per token on one TP rank, without the layer's norm (16-bit): what
    mamba_ssm's MambaSplitConv1dScanCombinedFn saves (ctx.save_for_backward: zxbcdt, the scan output), the gated
    norm's inputs (y; z is part of zxbcdt) and out_proj's input."""
    e = 4 if s.training.precision == "fp32" else 2
    d_in, _, _, proj = mamba_widths(s.model)
    return e * (proj + 2 * d_in) / s.parallelism.tensor_parallel
