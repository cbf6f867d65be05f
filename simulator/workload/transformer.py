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

from simulator.scenario.schema import Scenario
from simulator.workload.memory import checkpoint_bytes_per_layer


@dataclass(frozen=True)
class Op:
    """One kernel. ``flops`` are executed FLOPs (what takes time); ``model_flops`` the FLOPs the model needs
    (full causal attention counted, as in Megatron's MFU formula)."""

    name: str
    kind: str  # gemm | memory | flash_attention | collective
    flops: float = 0.0
    bytes: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    model_flops: float = 0.0
    collective: str = ""  # collective ops: all_reduce, all_gather, reduce_scatter, send_recv
    group: str = ""  # collective ops: the group kind (tp, pp, ...)
    overlaps: str = ""  # collective ops: "previous" / "next" = runs alongside that neighbouring kernel
    # what a calibration table calls this kernel (simulator/calibration/table.py: KERNEL_OPS) and its pass;
    # memory-bound kernels keep their tensor's rows x columns in m x n. "" = no table row can describe it
    kernel: str = ""
    direction: str = "forward"


def collective_op(name: str, collective: str, group: str, nbytes: float, overlaps: str = "") -> Op:
    """A collective inside a block: blocking (Megatron's tensor-parallel all-reduces, pipeline send/recv), or
    with ``overlaps`` ("previous" / "next") running alongside that neighbouring kernel, so only what outlasts
    the kernel is exposed (ring attention; Transformer Engine's TP communication overlap)."""
    return Op(name, "collective", bytes=float(nbytes), collective=collective, group=group, overlaps=overlaps)


def gemm(
    name: str, m: int, n: int, k: int, batch: int = 1, elem_bytes: int = 2, direction: str = "forward"
) -> Op:
    """A (batched) matrix multiply C[m,n] = A[m,k] B[k,n]: 2mnk FLOPs, reads A and B, writes C."""
    flops = 2.0 * m * n * k * batch
    kernel = "gemm" if batch == 1 else "batched_gemm"
    nbytes = elem_bytes * batch * (m * k + k * n + m * n)
    return Op(name, "gemm", flops, nbytes, m, n, k, batch, flops, kernel=kernel, direction=direction)


def memory_op(
    name: str, nbytes: float, kernel: str = "", rows: int = 0, cols: int = 0, direction: str = "forward"
) -> Op:
    """A memory-bound kernel moving ``nbytes``; ``kernel`` and its tensor's ``rows`` x ``cols`` name it for the
    calibration tables (left empty where no table kind fits, e.g. quantization kernels)."""
    return Op(name, "memory", 0.0, float(nbytes), rows, cols, kernel=kernel, direction=direction)


def gemm_backward(op: Op, has_weight: bool = True) -> tuple[Op, Op]:
    """dX = dY W^T (m x k, reduce over n) and dW = X^T dY (k x n, reduce over m): each as many FLOPs as forward.
    Only a GEMM with a weight has a "wgrad" (which zero-bubble schedules may defer); attention's batched GEMMs
    multiply two activations, so both their gradients are input gradients."""
    second = "wgrad" if has_weight else "dgrad (second input)"
    return (
        gemm(f"{op.name} dgrad", op.m, op.k, op.n, op.batch, direction="backward"),
        gemm(f"{op.name} {second}", op.k, op.n, op.m, op.batch, direction="backward"),
    )


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


def tp_collectives(t: int, sequence_parallel: bool, nbytes: float, overlap: bool = False):
    """Factories for the four tensor-parallel collectives around a column- then row-parallel pair:
    (before column-parallel forward, after row-parallel forward, column-parallel input gradient,
    row-parallel output gradient). Each returns None where the collective does not exist. With ``overlap``
    (Megatron-Core --tp-comm-overlap, Transformer Engine userbuffers) an all-gather runs alongside the GEMM after
    it and a reduce-scatter alongside the GEMM before it."""

    def make(kind: str | None):
        if t == 1 or kind is None:
            return lambda name: None
        side = ("next" if kind == "all_gather" else "previous") if overlap else ""
        return lambda name: collective_op(f"tp {kind.replace('_', '-')} ({name})", kind, "tp", nbytes, side)

    if sequence_parallel:
        return make("all_gather"), make("reduce_scatter"), make("reduce_scatter"), make("all_gather")
    return make(None), make("all_reduce"), make("all_reduce"), make(None)


def _ops(*ops: Op | None) -> tuple[Op, ...]:
    return tuple(op for op in ops if op is not None)


def build_workload(s: Scenario) -> Workload:
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
        t, p.sequence_parallel, full, p.tp_comm_overlap
    )
    fwd = _ops(
        norm("input layernorm"),
        gather_in("attention input"),
        qkv,
        *attn_fwd,
        proj,
        scatter_out("attention output"),
        bias_dropout_add("attention bias-dropout-add"),
        norm("post-attention layernorm"),
        gather_in("mlp input"),
        up,
        act,
        down,
        scatter_out("mlp output"),
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
    )
    layer_params = (
        h * (heads + 2 * kv_heads) * d
        + heads * d * h
        + h * f_up // t
        + f // t * h
        + bias * ((heads + 2 * kv_heads) * d + h + f_up // t + h)
        + 2 * norm_params
    )
    # DeepSpeed activation checkpointing: the checkpoint (layer input) split over the TP ranks
    # (partition_activations) and kept in host memory (cpu_checkpointing); backward fetches and re-gathers it
    tr, ckpt = s.training, checkpoint_bytes_per_layer(s)
    fetch: list[Op] = []
    recompute = fwd
    if tr.cpu_checkpointing:
        fwd = (*fwd, collective_op("checkpoint to host", "d2h", "host", ckpt, overlaps="previous"))
        fetch.append(collective_op("checkpoint from host", "h2d", "host", ckpt))
    if tr.partition_activations and t > 1:
        fetch.append(
            collective_op("checkpoint all-gather (partition_activations)", "all_gather", "tp", ckpt * t)
        )
    layer = Block(
        "transformer layer",
        fwd,
        bwd,
        attn_fwd if m.attention == "standard" else (),
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
        ),
        (
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
        ),
        (),
        embed_params,
    )
    logits = gemm("logits", tokens, v // t, h)
    # vocab-parallel cross-entropy all-reduces the max, the sum of exponentials and the target logit (fp32)
    ce_stats = (
        collective_op("cross-entropy statistics", "all_reduce", "tp", 3 * 4 * tokens) if t > 1 else None
    )
    head = Block(
        "output head",
        _ops(
            norm("final layernorm"),
            gather_in("logits input"),
            logits,
            ce_stats,
            memory_op(
                "cross-entropy loss (fp32)", tokens * v // t * (e + 8), "cross_entropy", tokens, v // t
            ),
        ),
        _ops(
            memory_op(
                "cross-entropy backward",
                tokens * v // t * (4 + e),
                "cross_entropy",
                tokens,
                v // t,
                "backward",
            ),
            *gemm_backward(logits),
            grad_in("logits input gradient"),
            norm_backward("final layernorm backward"),
        ),
        (),
        v * h // t + norm_params,
    )
    return Workload(s, layer, embedding, head)
