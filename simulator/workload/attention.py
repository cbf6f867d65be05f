"""Attention's kernels for one micro-batch on one rank: the projections into queries, keys and values (one
fused QKV GEMM, or multi-head latent attention's low-rank ones), and the core: FlashAttention as one fused kernel
(with context parallelism, ring attention's K/V exchange beside it), or the unfused layer (QK^T, softmax,
dropout, PV)."""

from __future__ import annotations

from dataclasses import replace

from simulator.scenario.model import windowed_keys
from simulator.scenario.schema import Scenario
from simulator.workload.ops import Op, collective_op, gemm, gemm_backward, linear, memory_op
from simulator.workload.params import norm_params
from simulator.workload.shape import LayerShape


def projection_ops(s: Scenario, sh: LayerShape) -> tuple[tuple[Op, ...], tuple[Op, ...], int]:
    """(forward, backward, parameters per rank) of the projections from the layer's (gathered) input to the
    queries, keys and values; the output projection is the caller's."""
    m = s.model
    e, tokens, h = sh.e, sh.tokens, sh.h
    heads, kv_heads, d, dv = sh.heads, sh.kv_heads, sh.d, sh.dv
    if m.mla is None:
        qkv = linear("qkv projection", tokens, (heads + 2 * kv_heads) * d, h)
        fwd: tuple[Op, ...] = (qkv,)
        bwd: tuple[Op, ...] = gemm_backward(qkv)
        params = h * (heads + 2 * kv_heads) * d + ((heads + 2 * kv_heads) * d if m.has_qkv_bias else 0)
        if m.qk_layernorm:  # an RMSNorm over each head's queries and keys (Qwen3, OLMoE)
            rows = tokens * (heads + kv_heads)
            fwd += (memory_op("q / k layernorm", 2 * e * rows * d + 4 * rows, sh.norm_kind, rows, d),)
            bwd = (
                memory_op("q / k layernorm backward", 3 * e * rows * d, sh.norm_kind, rows, d, "backward"),
                *bwd,
            )
            params += 2 * norm_params(m, d)
        return fwd, bwd, params
    # Multi-head latent attention (Megatron-Core multi_latent_attention.py, core_v0.14.0): the down-projections
    # are replicated on every tensor-parallel rank (TELinear, parallel_mode "duplicated"), the up-projections
    # column-parallel; the rotary key part is shared by every head.
    c = m.mla
    rope = c.qk_rope_head_dim
    ops_f: list[Op] = []
    ops_b: list[Op] = []
    params = 0

    def lowrank(name: str, rank: int, down_out: int, up_out: int) -> None:
        nonlocal params
        down = linear(f"{name} down-projection", tokens, down_out, h)
        norm = memory_op(
            f"{name} latent norm", 2 * e * tokens * rank + 4 * tokens, sh.norm_kind, tokens, rank
        )
        norm_bwd = memory_op(
            f"{name} latent norm backward", 3 * e * tokens * rank, sh.norm_kind, tokens, rank, "backward"
        )
        up = linear(f"{name} up-projection", tokens, up_out, rank)
        ops_f.extend((down, norm, up))
        ops_b[:0] = [*gemm_backward(up), norm_bwd, *gemm_backward(down)]
        params += h * down_out + norm_params(m, rank) + rank * up_out

    if c.q_lora_rank is None:
        q = linear("mla q projection", tokens, heads * d, h)
        ops_f.append(q)
        ops_b[:0] = list(gemm_backward(q))
        params += h * heads * d
    else:
        lowrank("mla q", c.q_lora_rank, c.q_lora_rank, heads * d)
    lowrank("mla kv", c.kv_lora_rank, c.kv_lora_rank + rope, heads * (c.qk_nope_head_dim + dv))
    # rotary on the query and key parts, keys assembled from the per-head part and the shared rotary part
    assemble = 4 * e * tokens * heads * d
    ops_f.append(memory_op("mla rotary and key assembly", assemble, "elementwise", tokens, heads * d))
    ops_b.insert(
        0,
        memory_op(
            "mla rotary and key assembly backward", assemble, "elementwise", tokens, heads * d, "backward"
        ),
    )
    return tuple(ops_f), tuple(ops_b), params


def attention_ops(
    s: Scenario, sh: LayerShape, context_parallel: str = "fused", kernels: str = "model"
) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """(forward, backward) ops of attention's core, between the QKV and the output projection;
    ``context_parallel``: the framework's ring attention ('fused' or 'torch', frameworks.Framework); ``kernels``:
    the framework's (``megatron-legacy``: Megatron's softmax falls back to fp32 torch ops where its fused kernel
    does not take the shape, ``megatron_fused_softmax``)."""
    if s.model.attention == "flash":
        return _flash(s, sh, context_parallel)
    return _standard(sh, not softmax_in_fp32(kernels, sh))


def softmax_in_fp32(kernels: str, sh: LayerShape) -> bool:
    """Does the unfused attention's softmax run as fp32 torch ops (``torch_softmax``)? Megatron's
    (``megatron-legacy`` kernels) where its fused kernel does not take the rank's scores."""
    return kernels == "megatron-legacy" and not megatron_fused_softmax(sh.b, sh.heads, sh.seq, sh.seq)


def megatron_fused_softmax(b: int, heads: int, sq: int, sk: int) -> bool:
    """Whether Megatron's FusedScaleMaskSoftmax runs its fused causal kernel for scores [b, heads, sq, sk] on one
    tensor-parallel rank (fp16 / bf16, fusion on, as by default). megatron/model/fused_softmax.py
    ``is_kernel_available`` at microsoft/Megatron-DeepSpeed 4822c87e (2023-09; Megatron-LM's legacy model alike):
    16 < sk <= 4096, sq and sk multiples of 4, and b x heads a multiple of 4 and of the kernel's rows per thread
    block (fused_kernels/scaled_masked_softmax.h ``get_batch_per_block``: 128 threads in warps as wide as sk's next
    power of two, at most 32; two rows per warp up to 128 columns). Two heads per rank at micro-batch 1 (16 heads
    at TP 8) miss it."""
    rows = b * heads
    if not (16 < sk <= 4096 and sq % 4 == 0 and sk % 4 == 0 and rows % 4 == 0):
        return False
    width = 1 << (sk - 1).bit_length()
    per_block = (128 // min(width, 32)) * (2 if width <= 128 else 1)
    return rows % per_block == 0


def cp_merge_bytes(n: int, out: float, q: float, kv: float, e: int) -> tuple[float, float]:
    """(forward, backward) bytes one rank's eager ops move around the flash kernels of torch's ring attention over
    ``n`` context-parallel ranks, per attention call: ``out`` / ``q`` elements of this rank's output / queries,
    ``kv`` of its keys and values together, ``e`` bytes each. torch/distributed/tensor/experimental/_attention.py
    at v2.6.0, causal with the round-robin load balancer, convert_to_f32: `_templated_ring_attention` upcasts
    each step's output to fp32 and `_SDPAMerger._merge_one` merges it, out - sigmoid(lse' - lse) * (out - out')
    (32 bytes per element: three fp32 passes), on half the queries with a torch.cat of the whole fp32 output when
    the step holds the other rank's later chunk (`partial`, half of the n - 1 later steps on average over ranks),
    and concatenates K and V before each exchange; `_templated_ring_attention_backward` zero-fills fp32 dQ, dK,
    dV, adds each step's gradients in fp32 (half of them through `_partial_update`'s add and torch.cat), and
    concatenates dK, dV for the all-to-all every step; both end casting back to bf16. Counted against that code
    by a dispatch-mode test (tests/test_context_parallel.py); the ring's time per rank measured on one H100 with
    benchmarks/cp_attention.py (docs/measurements/h100-cp-attention.json)."""
    f32 = 4
    up = (e + f32) * out  # out.float() / the final .to(dtype)
    merge = up + 32 * out
    fwd = up + (n - 1) * (0.75 * merge + 4 * out) + (n - 1) * 2 * e * kv + up
    add = 2 * f32 + e  # an fp32 += of a bf16 gradient
    mixed = 0.75 * add + 4  # per element: half the steps a plain add, half a chunk add and a torch.cat
    bwd = (
        f32 * (q + kv)  # zeros_like(..., dtype=float32)
        + (n - 1) * 2 * e * kv  # K / V concatenated before each exchange
        + add * (q + kv)  # step 0's sums
        + (n - 1) * mixed * (q + kv)  # the later steps' sums
        + n * 2 * f32 * kv  # dK / dV concatenated for the all-to-all, every step
        + (f32 + e) * (q + kv)  # the final casts
    )
    return float(fwd), float(bwd)


def _flash(
    s: Scenario, sh: LayerShape, context_parallel: str = "fused"
) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """FlashAttention (Dao 2023): one kernel forward and one backward (2.5x the forward's matmul work)."""
    b, e, d, dv, seq, heads, kv_heads, tokens = (
        sh.b,
        sh.e,
        sh.d,
        sh.dv,
        sh.seq,
        sh.heads,
        sh.kv_heads,
        sh.tokens,
    )
    full_seq = s.model.seq_length
    # with context parallelism each rank's s/cp queries attend to all s keys (ring attention, causal load
    # balancing gives every rank the same share); QK^T (head width d) and PV (dv), causal masking skips half
    full = 2.0 * b * heads * seq * full_seq * (d + dv)
    moved = e * tokens * (heads * d + kv_heads * d + kv_heads * dv + heads * dv)  # Q, K, V, output
    m, n = s.model, s.parallelism.context_parallel
    w = m.sliding_window
    if w is not None and w < full_seq and m.windowed_layers and (n == 1 or context_parallel != "torch"):
        # sliding-window layers (Mistral, Gemma, GPT-OSS) run their own kernel, which walks only the blocks of
        # keys inside the window (FlashAttention-2 and cuDNN skip the others) and costs by that walk
        # (costs/attention_rate.py window_factor): the average layer runs the full layers' kernel and the windowed
        # layers' kernel each for its share of the layers. The model FLOPs are counted as Megatron's
        # num_floating_point_operations counts them, full causal attention on every layer
        windowed = m.windowed_layers / m.num_layers
        keys = windowed_keys(full_seq, w) / full_seq  # keys per query, on average
        parts = ((1.0 - windowed, full / 2, 0, "flash attention"),)
        parts += ((windowed, full * keys / full_seq, w, "flash attention (sliding window)"),)
        attn_shape = (seq, full_seq, d, b * heads)
    else:
        # chunked layers (Llama 4) walk only their chunk's keys: the work averaged over the layers
        # (model.attention_work_share), priced as causal attention over that many keys
        share = m.attention_work_share(full_seq)
        keys = max(round(full_seq * share), 1)  # the causal key length of the same work
        parts = ((1.0, full / 2 * share, 0, "flash attention"),)
        attn_shape = (seq, keys, d, b * heads)  # queries x keys x head dim, per (sample, head)
    fwd: tuple[Op, ...] = ()
    bwd: tuple[Op, ...] = ()
    for layers, flops, window, name in parts:
        if layers <= 0:
            continue
        forward = Op(
            name,
            "flash_attention",
            flops * layers,
            moved * layers,
            *attn_shape,
            model_flops=full * layers,
            kernel="" if window else "flash_attention",  # no table states a window
            window=window,
        )
        fwd += (forward,)
        bwd += (
            replace(
                forward,
                name=f"{name} backward",
                flops=2.5 * forward.flops,
                bytes=2 * forward.bytes,
                model_flops=2 * forward.model_flops,
                direction="backward",
            ),
        )
    if n > 1:
        # K and V blocks go round the CP ring while the kernel works on the block it has (Liu et al. 2023,
        # Ring Attention; Megatron-Core context parallelism): an all-gather of K,V forward; K,V again and
        # their gradients (a reduce-scatter) backward. torch's ring takes K / V as SDPA gets them: torchtitan
        # repeats them to the query heads first (repeat_kv, models/llama/model.py @9dec370).
        ring_heads = heads if context_parallel == "torch" else kv_heads
        kv = e * b * full_seq * ring_heads * (d + dv)  # all of K and V, this rank's heads
        if context_parallel != "torch":
            fwd = (*fwd, collective_op("cp ring K/V exchange", "all_gather", "cp", kv, overlaps="previous"))
            bwd = (
                *bwd,
                collective_op("cp ring K/V exchange", "all_gather", "cp", kv, overlaps="previous"),
                collective_op("cp ring dK/dV exchange", "reduce_scatter", "cp", kv, overlaps="previous"),
            )
            return fwd, bwd
        fwd, bwd = _torch_ring(fwd[0], bwd[0], n, kv, e)
        merge_f, merge_b = cp_merge_bytes(
            n, b * seq * heads * dv, b * seq * heads * d, b * seq * ring_heads * (d + dv), e
        )
        rows = b * heads * seq
        fwd = (
            *fwd,
            Op("cp ring merges (fp32, eager)", "memory", 0.0, merge_f, rows, dv, launches=12 * (n - 1) + 4),
        )
        bwd = (
            *bwd,
            Op(
                "cp ring gradient sums (fp32, eager)",
                "memory",
                0.0,
                merge_b,
                rows,
                d,
                direction="backward",
                launches=8 * n + 6,
            ),
        )
    return fwd, bwd


def _torch_ring(
    forward: Op, backward: Op, n: int, kv: float, e: int
) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """torch's ring attention as it schedules its exchanges (torch/distributed/tensor/experimental/_attention.py,
    v2.6.0 to 2.13, causal with the round-robin load balancer, which gives each of the ``n`` steps the same work):
    K and V go round by ``_AllGatherRotater`` (``_cp_options.rotate_method`` defaults to ALL_GATHER; torchtitan
    keeps it): step 0 issues one all-gather of every rank's K and V (``kv`` bytes in all) and step 1 waits for it, so
    only step 0's kernel hides it, forward and backward alike. The backward's dK / dV go round by
    ``_AllToAllRotater`` (forced, ``method=_RotateMethod.ALL_TO_ALL``) in fp32 (``convert_to_f32``): every step
    sends its running sums to the next rank after its kernel and waits for the previous rank's after the next
    kernel, so the first n - 1 exchanges hide behind the steps after them and the last, waited for after the loop,
    does not."""
    first, rest = 1.0 / n, 1.0 - 1.0 / n

    def part(op: Op, share: float, which: str, launches: int) -> Op:
        return replace(
            op,
            name=f"{op.name} ({which})",
            flops=op.flops * share,
            bytes=op.bytes * share,
            model_flops=op.model_flops * share,
            launches=launches,
        )

    gather = collective_op("cp K/V all-gather (ring step 0)", "all_gather", "cp", kv, overlaps="previous")
    step = kv / n * 4 / e  # this rank's dK and dV, fp32
    fwd = (part(forward, first, "ring step 0", 1), gather, part(forward, rest, "ring steps 1+", n - 1))
    bwd = (
        part(backward, first, "ring step 0", 1),
        replace(gather, direction="backward"),
        part(backward, rest, "ring steps 1+", n - 1),
        collective_op("cp ring dK/dV exchanges", "send_recv", "cp", (n - 1) * step, "previous", "backward"),
        collective_op("cp ring dK/dV exchange (last)", "send_recv", "cp", step, direction="backward"),
    )
    return fwd, bwd


def _standard(sh: LayerShape, fused: bool = True) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """Megatron-LM's unfused attention: QK^T, scaled masked softmax, dropout and PV as separate kernels. The
    softmax is one fused kernel, or (``fused`` False) ``forward_torch_softmax``'s five fp32 passes each way."""
    b, e, d, seq, heads = sh.b, sh.e, sh.d, sh.seq, sh.heads
    probs = b * heads * seq * seq
    rows = b * heads * seq
    scores = gemm("attention scores QK^T", seq, seq, d, batch=b * heads)
    context = gemm("attention context PV", seq, sh.dv, seq, batch=b * heads)
    softmax = (memory_op("scaled masked softmax", 2 * e * probs, "softmax", rows, seq),)
    softmax_bwd = (memory_op("softmax backward", 3 * e * probs, "softmax", rows, seq, "backward"),)
    if not fused:
        softmax, softmax_bwd = torch_softmax(e, probs, rows, seq)
    dropout = memory_op("attention dropout", (2 * e + 1) * probs, "dropout", rows, seq)
    fwd = (scores, *softmax, dropout, context)
    bwd = (
        *gemm_backward(context, has_weight=False),
        memory_op("attention dropout backward", (2 * e + 1) * probs, "dropout", rows, seq, "backward"),
        *softmax_bwd,
        *gemm_backward(scores, has_weight=False),
    )
    return fwd, bwd


def torch_softmax(e: int, probs: int, rows: int, seq: int) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """Megatron's softmax without its fused kernel (``FusedScaleMaskSoftmax.forward_torch_softmax``, 4822c87e):
    with query-key layer scaling (on by default, which forces the softmax into fp32) it runs ``input.float()``,
    ``input * scale`` (the layer number), ``masked_fill_`` of the causal mask, ``torch.nn.Softmax`` and
    ``.half()`` / ``.bfloat16()``; autograd runs each one's backward. ``probs`` score elements of ``e`` bytes,
    fp32 in between."""
    f32 = 4
    cast = (e + f32) * probs
    fwd = (
        memory_op("softmax input upcast (fp32)", cast, "elementwise", rows, seq),
        memory_op("softmax scale (x layer number)", 2 * f32 * probs, "elementwise", rows, seq),
        memory_op("causal mask fill", 2 * f32 * probs, "elementwise", rows, seq),
        memory_op("softmax (fp32)", 2 * f32 * probs, "softmax", rows, seq),
        memory_op("softmax output downcast", cast, "elementwise", rows, seq),
    )
    bwd = (
        memory_op("softmax gradient upcast (fp32)", cast, "elementwise", rows, seq, "backward"),
        memory_op("softmax backward (fp32)", 3 * f32 * probs, "softmax", rows, seq, "backward"),
        memory_op("causal mask fill backward", 2 * f32 * probs, "elementwise", rows, seq, "backward"),
        memory_op("softmax scale backward", 2 * f32 * probs, "elementwise", rows, seq, "backward"),
        memory_op("softmax gradient downcast", cast, "elementwise", rows, seq, "backward"),
    )
    return fwd, bwd
