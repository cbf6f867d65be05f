"""The model as per-layer operations: FLOPs and bytes moved for one microbatch on one tensor-parallel rank.

Shapes follow Megatron-LM's GPT layer (Narayanan et al. SC21 Sec. 3.2; Korthikanti et al. 2022 Sec. 4):
layernorm -> QKV projection -> attention (QK^T, softmax, dropout, context; or one FlashAttention kernel) ->
output projection -> bias-dropout-add -> layernorm -> MLP up -> activation -> MLP down -> bias-dropout-add.
With tensor parallelism ``t`` the projections are column/row parallel (heads and MLP width split by t); with
sequence parallelism the layernorm / dropout work is split by t too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from simulator.frameworks import Framework, get_framework
from simulator.scenario.schema import Scenario
from simulator.workload import framework_kernels
from simulator.workload.memory import checkpoint_bytes_per_layer
from simulator.workload.ops import (  # noqa: F401  (re-exported: strategies build ops with these)
    Op,
    collective_op,
    gemm,
    gemm_backward,
    host_op,
    memory_op,
    recomputed,
    sync_op,
)

# the name prefix of Megatron's main_grad accumulation kernels (strategies whose framework runs no such hooks,
# DeepSpeed's BF16_Optimizer, drop them by it)
GRAD_ACCUMULATION = "gradient accumulation"


@dataclass(frozen=True)
class Block:
    """Work of one block (a transformer layer, the embedding, or the output head) for one microbatch."""

    name: str
    forward: tuple[Op, ...]
    backward: tuple[Op, ...]
    recompute_selective: tuple[Op, ...]  # forward ops re-run by selective recompute (attention core)
    params: int  # parameters held by one tensor-parallel rank
    recompute_full: tuple[Op, ...] = ()  # full recompute: fetch the checkpoint, then the forward again

    @property
    def forward_model_flops(self) -> float:
        return sum(op.model_flops for op in self.forward)


@dataclass(frozen=True)
class Workload:
    scenario: Scenario
    layer: Block  # all transformer layers are alike
    embedding: Block
    head: Block  # final norm, logits, cross-entropy loss
    framework: Framework  # the software that runs it: its extra kernels, host costs and syncs
    # host work at the start of every microbatch's forward (data, masks; one op, or () without a host model)
    microbatch_setup: tuple[Op, ...] = ()

    @property
    def num_layers(self) -> int:
        return self.scenario.model.num_layers

    @cached_property
    def params_per_rank(self) -> int:
        """Parameters on one tensor-parallel rank (whole model, all pipeline stages)."""
        m, t = self.scenario.model, self.scenario.parallelism.tensor_parallel
        head = self.head.params - (m.vocab_size * m.hidden_size // t if m.tied_embeddings else 0)
        return self.num_layers * self.layer.params + self.embedding.params + head

    @cached_property
    def total_params(self) -> int:
        return parameter_count(self.scenario)

    @cached_property
    def model_flops_per_microbatch(self) -> float:
        """Forward + backward model FLOPs of one microbatch on the whole model (all TP ranks): 3 x forward."""
        t = self.scenario.parallelism.tensor_parallel
        fwd = self.num_layers * self.layer.forward_model_flops + self.head.forward_model_flops
        return 3.0 * fwd * t


def tensors_per_layer(m) -> int:
    """Parameter tensors of one layer: QKV, projection, MLP in and out weights (and their biases), two norms
    (weight, and bias for LayerNorm). Megatron fuses Q, K, V and the SwiGLU gate and up projections."""
    norm = 2 if m.normalization == "layernorm" else 1
    return 4 + (4 if m.add_bias_linear else 0) + 2 * norm


def parameter_count(s: Scenario) -> int:
    """Exact parameter count of the model described by the scenario (whole model)."""
    m = s.model
    h, f, g, d, v = m.hidden_size, m.ffn_size, m.query_groups, m.head_dim, m.vocab_size
    bias = 1 if m.add_bias_linear else 0
    norm = 2 * h if m.normalization == "layernorm" else h
    f_up = 2 * f if m.activation == "swiglu" else f
    qkv_out = h + 2 * g * d
    layer = h * qkv_out + h * h + h * f_up + f * h + bias * (qkv_out + h + f_up + h) + 2 * norm
    embed = v * h + (m.seq_length * h if m.position_embedding == "learned" else 0)
    head = 0 if m.tied_embeddings else v * h
    return m.num_layers * layer + embed + head + norm


def tp_collectives(
    t: int, sequence_parallel: bool, nbytes: float, overlap: bool = False, async_grad: bool = False
):
    """Factories for the four tensor-parallel collectives around a column- then row-parallel pair:
    (before column-parallel forward, after row-parallel forward, column-parallel input gradient,
    row-parallel output gradient). Each returns None where the collective does not exist. With ``overlap``
    (Megatron-Core --tp-comm-overlap, Transformer Engine userbuffers) an all-gather runs alongside the GEMM after
    it and a reduce-scatter alongside the GEMM before it. With ``async_grad`` the column-parallel input
    gradient's all-reduce runs alongside the weight-gradient GEMM issued after it (Megatron's
    async_tensor_model_parallel_allreduce: megatron/core/tensor_parallel/layers.py,
    LinearWithGradAccumulationAndAsyncCommunication.backward)."""

    def make(kind: str | None, direction: str = "forward", side: str = ""):
        if t == 1 or kind is None:
            return lambda name: None
        if overlap:
            side = "next" if kind == "all_gather" else "previous"
        return lambda name: collective_op(
            f"tp {kind.replace('_', '-')} ({name})", kind, "tp", nbytes, side, direction
        )

    if sequence_parallel:
        return (
            make("all_gather"),
            make("reduce_scatter"),
            make("reduce_scatter", "backward"),
            make("all_gather", "backward"),
        )
    return (
        make(None),
        make("all_reduce"),
        make("all_reduce", "backward", "previous" if async_grad else ""),
        make(None),
    )


def _ops(*ops: Op | None) -> tuple[Op, ...]:
    return tuple(op for op in ops if op is not None)


def build_workload(s: Scenario, framework: Framework | None = None) -> Workload:
    """The model's kernels for one microbatch on one tensor-parallel rank, as ``framework`` (default: the
    scenario's) launches them."""
    fw = framework or get_framework(s.framework)
    m, p, tr = s.model, s.parallelism, s.training
    b, t = tr.micro_batch_size, p.tensor_parallel
    seq = m.seq_length // p.context_parallel
    h, a, g, d, f, v = (
        m.hidden_size,
        m.num_attention_heads,
        m.query_groups,
        m.head_dim,
        m.ffn_size,
        m.vocab_size,
    )
    e = 4 if tr.precision == "fp32" else 2  # bytes per activation element
    tokens = b * seq
    sp = t if p.sequence_parallel else 1  # layernorm / dropout work is split only with sequence parallelism
    heads = a // t
    kv_heads = max(g // t, 1)
    f_up = 2 * f if m.activation == "swiglu" else f
    bias = 1 if m.add_bias_linear else 0
    norm_params = 2 * h if m.normalization == "layernorm" else h

    rows = tokens // sp  # rows of the b x s x h activations a rank's norms and dropouts work on
    norm_kind = m.normalization  # layernorm | rmsnorm
    # Megatron's fused bias-dropout-add; without biases (and so without dropout in Llama-style models) the
    # kernel is a plain residual add
    residual_kind = "bias_dropout_add" if m.add_bias_linear else "residual_add"

    def norm(name: str) -> Op:  # read x, write y, plus fp32 statistics
        return memory_op(name, 2 * e * tokens * h / sp + 8 * tokens / sp, norm_kind, rows, h)

    def norm_backward(name: str) -> Op:
        return memory_op(name, 3 * e * tokens * h / sp, norm_kind, rows, h, "backward")

    def bias_dropout_add(name: str) -> Op:  # read x and residual, write y, write 1-byte mask
        return memory_op(name, (3 * e + 1) * tokens * h / sp, residual_kind, rows, h)

    def bias_dropout_add_backward(name: str) -> Op:
        return memory_op(name, 2 * e * tokens * h / sp, residual_kind, rows, h, "backward")

    qkv = gemm("qkv projection", tokens, (heads + 2 * kv_heads) * d, h)
    proj = gemm("attention output projection", tokens, h, heads * d)
    up = gemm("mlp up projection", tokens, f_up // t, h)
    down = gemm("mlp down projection", tokens, h, f // t)
    act_elems = tokens * f // t
    act_kind = m.activation.replace("-", "_")  # gelu | swiglu | relu | squared_relu
    act = memory_op(
        f"{m.activation}", e * act_elems * (3 if m.activation == "swiglu" else 2), act_kind, tokens, f // t
    )

    cp = p.context_parallel
    if m.attention == "flash":
        # with context parallelism each rank's s/cp queries attend to all s keys (ring attention, causal load
        # balancing gives every rank the same share); QK^T and PV, causal masking skips half
        full = 4.0 * b * heads * seq * m.seq_length * d
        attn_shape = (seq, m.seq_length, d, b * heads)  # queries x keys x head dim, per (sample, head)
        attn_fwd = (
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
        attn_bwd = (
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
        if cp > 1:
            # K and V blocks go round the CP ring while the kernel works on the block it has (Liu et al. 2023,
            # Ring Attention; Megatron-Core context parallelism): an all-gather of K,V forward; K,V again and
            # their gradients (a reduce-scatter) backward
            kv = e * b * m.seq_length * 2 * kv_heads * d  # all of K and V, this rank's heads
            attn_fwd = (
                *attn_fwd,
                collective_op("cp ring K/V exchange", "all_gather", "cp", kv, overlaps="previous"),
            )
            attn_bwd = (
                attn_bwd[0],
                collective_op("cp ring K/V exchange", "all_gather", "cp", kv, overlaps="previous"),
                collective_op("cp ring dK/dV exchange", "reduce_scatter", "cp", kv, overlaps="previous"),
            )
    else:
        probs = b * heads * seq * seq
        scores = gemm("attention scores QK^T", seq, seq, d, batch=b * heads)
        context = gemm("attention context PV", seq, d, seq, batch=b * heads)
        softmax = memory_op("scaled masked softmax", 2 * e * probs, "softmax", b * heads * seq, seq)
        dropout = memory_op("attention dropout", (2 * e + 1) * probs, "dropout", b * heads * seq, seq)
        attn_fwd = (scores, softmax, dropout, context)
        attn_bwd = (
            *gemm_backward(context, has_weight=False),
            memory_op(
                "attention dropout backward", (2 * e + 1) * probs, "dropout", b * heads * seq, seq, "backward"
            ),
            memory_op("softmax backward", 3 * e * probs, "softmax", b * heads * seq, seq, "backward"),
            *gemm_backward(scores, has_weight=False),
        )

    # Tensor parallelism (Narayanan et al. SC21 Sec. 3.2, Fig. 5): the column-parallel input needs the full
    # activation (identity forward, all-reduce of its gradient backward), the row-parallel output is all-reduced
    # forward. Sequence parallelism (Korthikanti et al. Sec. 4.2.2) turns each all-reduce into an all-gather
    # before and a reduce-scatter after, so the norms and dropouts between them work on s/t tokens.
    full = e * tokens * h  # bytes of one b x s x h activation
    gather_in, scatter_out, grad_in, grad_out = tp_collectives(
        t, p.sequence_parallel, full, p.tp_comm_overlap, fw.overlap_tp_grad_allreduce
    )
    layer_params = (
        h * (heads + 2 * kv_heads) * d
        + heads * d * h
        + h * f_up // t
        + f // t * h
        + bias * ((heads + 2 * kv_heads) * d + h + f_up // t + h)
        + 2 * norm_params
    )
    # the framework's own small kernels beyond the model's (bias adds, layout copies, bias-gradient reductions)
    legacy = fw.kernels == "megatron-legacy"
    qkv_out, heads_dim = (heads + 2 * kv_heads) * d, heads * d
    qkv_bias, context_copy, mlp_bias = (
        framework_kernels.layer_forward(e, tokens, h, qkv_out, heads_dim, sp, bias) if legacy else (None,) * 3
    )
    extra_bwd = (
        framework_kernels.layer_backward(e, tokens, h, qkv_out, heads_dim, f_up // t, sp, bias)
        if legacy
        else ()
    )

    # synchronising calls inside the layer's forward, between attention and MLP (Megatron-DeepSpeed's
    # ParallelTransformerLayer.forward builds moe_loss and mlp_bias with torch.tensor(0.0, device=...): a
    # pageable host-to-device copy, which PyTorch follows with cudaStreamSynchronize)
    layer_syncs = tuple(
        sync_op("host sync (device tensor from a host scalar)", fw.host.sync_s)
        for _ in range(fw.host.syncs.layer_forward)
    )
    # Megatron-LM's local DDP without gradient-accumulation fusion: a hook adds every parameter's gradient
    # into its main_grad buffer after each backward (megatron/model/distributed.py, param_hook), one kernel per
    # tensor reading the gradient and main_grad and writing main_grad (fp32 for bf16 training)
    main_bytes = 2 if tr.precision == "fp16" else 4

    def accumulate(name: str, params: int, tensors: int) -> Op | None:
        if not fw.grad_accumulation_kernels:
            return None
        return Op(
            f"{GRAD_ACCUMULATION} ({name})",
            "memory",
            bytes=params * (2 + 2 * main_bytes),
            direction="backward",
            launches=tensors,
        )

    fwd = _ops(
        norm("input layernorm"),
        gather_in("attention input"),
        qkv,
        qkv_bias,
        *attn_fwd,
        context_copy,
        proj,
        scatter_out("attention output"),
        bias_dropout_add("attention bias-dropout-add"),
        norm("post-attention layernorm"),
        *layer_syncs,
        gather_in("mlp input"),
        up,
        act,
        down,
        scatter_out("mlp output"),
        mlp_bias,
        bias_dropout_add("mlp bias-dropout-add"),
    )
    bwd = _ops(
        bias_dropout_add_backward("mlp bias-dropout-add backward"),
        grad_out("mlp output gradient"),
        *gemm_backward(down),
        memory_op(
            f"{m.activation} backward",
            e * act_elems * (5 if m.activation == "swiglu" else 3),
            act_kind,
            tokens,
            f // t,
            "backward",
        ),
        *gemm_backward(up),
        grad_in("mlp input gradient"),
        norm_backward("post-attention layernorm backward"),
        bias_dropout_add_backward("attention bias-dropout-add backward"),
        grad_out("attention output gradient"),
        *gemm_backward(proj),
        *attn_bwd,
        *gemm_backward(qkv),
        grad_in("attention input gradient"),
        norm_backward("input layernorm backward"),
        *extra_bwd,
        accumulate("layer", layer_params, tensors_per_layer(m)),
    )
    # DeepSpeed activation checkpointing: the checkpoint (layer input) split over the TP ranks
    # (partition_activations) and kept in host memory (cpu_checkpointing); backward fetches and re-gathers it.
    # Both copies are synchronous and go through pageable memory (DeepSpeed v0.6.2 to v0.16.4,
    # runtime/activation_checkpointing/checkpointing.py: CheckpointFunction.forward runs partition_activations,
    # ``partition.cpu()``, before the layer; backward's gather_partitioned_activations copies it back with
    # ``part_i.copy_(item)`` into a fresh device buffer before the recomputation), so neither hides under a kernel.
    tr, ckpt = s.training, checkpoint_bytes_per_layer(s)
    fetch: list[Op] = []
    recompute = recomputed(fwd)
    if tr.cpu_checkpointing:
        fwd = (collective_op("checkpoint to host", "d2h_pageable", "host", ckpt), *fwd)
        fetch.append(collective_op("checkpoint from host", "h2d_pageable", "host", ckpt))
    if tr.partition_activations and t > 1:
        fetch.append(
            collective_op("checkpoint all-gather (partition_activations)", "all_gather", "tp", ckpt * t)
        )
    layer = Block(
        "transformer layer",
        fwd,
        bwd,
        recomputed(attn_fwd) if m.attention == "standard" else (),
        layer_params,
        (*fetch, *recompute),
    )

    pos = m.position_embedding == "learned"
    embed_params = v * h // t + (m.seq_length * h if pos else 0)
    # vocab-parallel embedding: each rank looks up its slice, the partial outputs are summed (or scattered)
    embedding = Block(
        "embedding",
        _ops(
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
        ),
        _ops(
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
            accumulate("embedding", embed_params, 1 + pos),
        ),
        (),
        embed_params,
    )
    logits = gemm("logits", tokens, v // t, h)
    # vocab-parallel cross-entropy all-reduces the max, the sum of exponentials and the target logit (fp32)
    ce_stats = (
        collective_op("cross-entropy statistics", "all_reduce", "tp", 3 * 4 * tokens) if t > 1 else None
    )
    # Megatron's vocab-parallel cross-entropy on fp32 logits, bytes per logit (megatron/core/tensor_parallel/
    # cross_entropy.py): forward casts to fp32 (e + 4), takes the max (4), subtracts it (8), exponentiates in
    # place (8), sums (4) and divides in place (8); backward scales the saved softmax in place (8) and casts the
    # gradient back (4 + e). PyTorch's F.cross_entropy under autocast: cast (e + 4) and log-softmax (8)
    # forward; NLL backward (4), log-softmax backward (12) and the cast back (4 + e)
    ce_fwd, ce_bwd = (e + 32, 12 + e) if fw.loss == "megatron" else (e + 12, 20 + e)
    head = Block(
        "output head",
        _ops(
            norm("final layernorm"),
            gather_in("logits input"),
            logits,
            ce_stats,
            memory_op("cross-entropy loss (fp32)", tokens * v // t * ce_fwd, "cross_entropy", tokens, v // t),
            *(framework_kernels.loss_forward(tokens) if legacy else ()),
        ),
        _ops(
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
            norm_backward("final layernorm backward"),
            *(framework_kernels.loss_backward(tokens) if legacy else ()),
            accumulate("final norm", norm_params, 2 if m.normalization == "layernorm" else 1),
        ),
        (),
        v * h // t + norm_params,
    )
    setup = (
        (host_op("microbatch setup (data, masks, loss bookkeeping)", fw.host.microbatch_s),)
        if fw.host.microbatch_s
        else ()
    )
    return Workload(s, layer, embedding, head, fw, setup)
