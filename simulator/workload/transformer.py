"""The model as per-layer operations: FLOPs and bytes moved for one microbatch on one tensor-parallel rank.

Shapes follow Megatron-LM's GPT layer (Narayanan et al. SC21 Sec. 3.2; Korthikanti et al. 2022 Sec. 4):
layernorm -> QKV projection -> attention (QK^T, softmax, dropout, context; or one FlashAttention kernel) ->
output projection -> bias-dropout-add -> layernorm -> MLP up -> activation -> MLP down -> bias-dropout-add.
With tensor parallelism ``t`` the projections are column/row parallel (heads and MLP width split by t); with
sequence parallelism the layernorm / dropout work is split by t too. The pieces: sizes in ``shape.py``,
attention's core in ``attention.py``, tensor parallelism's collectives in ``tensor_parallel.py``, the embedding
and output head in ``embedding.py``, the framework's own kernels in ``framework_kernels.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from simulator.frameworks import Framework, get_framework
from simulator.scenario.schema import Scenario
from simulator.workload import framework_kernels
from simulator.workload.attention import attention_ops
from simulator.workload.block import Block, present
from simulator.workload.embedding import embedding_block, head_block
from simulator.workload.memory import checkpoint_bytes_per_layer
from simulator.workload.ops import (
    Op,
    collective_op,
    gemm,
    gemm_backward,
    host_op,
    memory_op,
    recomputed,
    sync_op,
)
from simulator.workload.shape import LayerShape, layer_shape, norm, norm_backward, residual, residual_backward
from simulator.workload.tensor_parallel import tp_collectives


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
    norm_tensors = 2 if m.normalization == "layernorm" else 1
    return 4 + (4 if m.add_bias_linear else 0) + 2 * norm_tensors


def parameter_count(s: Scenario) -> int:
    """Exact parameter count of the model described by the scenario (whole model)."""
    m = s.model
    h, f, g, d, v = m.hidden_size, m.ffn_size, m.query_groups, m.head_dim, m.vocab_size
    bias = 1 if m.add_bias_linear else 0
    norm_params = 2 * h if m.normalization == "layernorm" else h
    f_up = 2 * f if m.activation == "swiglu" else f
    qkv_out = h + 2 * g * d
    layer = h * qkv_out + h * h + h * f_up + f * h + bias * (qkv_out + h + f_up + h) + 2 * norm_params
    embed = v * h + (m.seq_length * h if m.position_embedding == "learned" else 0)
    head = 0 if m.tied_embeddings else v * h
    return m.num_layers * layer + embed + head + norm_params


def layer_params(s: Scenario, sh: LayerShape) -> int:
    """Parameters of one transformer layer on one tensor-parallel rank."""
    h, d, heads, kv_heads, t = sh.h, sh.d, sh.heads, sh.kv_heads, sh.t
    bias = 1 if s.model.add_bias_linear else 0
    return (
        h * (heads + 2 * kv_heads) * d
        + heads * d * h
        + h * sh.f_up // t
        + sh.f // t * h
        + bias * ((heads + 2 * kv_heads) * d + h + sh.f_up // t + h)
        + 2 * sh.norm_params
    )


def build_workload(s: Scenario, framework: Framework | None = None) -> Workload:
    """The model's kernels for one microbatch on one tensor-parallel rank, as ``framework`` (default: the
    scenario's) launches them."""
    fw = framework or get_framework(s.framework)
    m, p, tr = s.model, s.parallelism, s.training
    sh = layer_shape(s)
    e, tokens, h, d, f, t, sp = sh.e, sh.tokens, sh.h, sh.d, sh.f, sh.t, sh.sp
    heads, kv_heads = sh.heads, sh.kv_heads

    qkv = gemm("qkv projection", tokens, (heads + 2 * kv_heads) * d, h)
    proj = gemm("attention output projection", tokens, h, heads * d)
    up = gemm("mlp up projection", tokens, sh.f_up // t, h)
    down = gemm("mlp down projection", tokens, h, f // t)
    act_elems = tokens * f // t
    act_kind = m.activation.replace("-", "_")  # gelu | swiglu | relu | squared_relu
    act = memory_op(
        f"{m.activation}", e * act_elems * (3 if m.activation == "swiglu" else 2), act_kind, tokens, f // t
    )
    attn_fwd, attn_bwd = attention_ops(s, sh)

    gather_in, scatter_out, grad_in, grad_out = tp_collectives(
        t, p.sequence_parallel, e * tokens * h, p.tp_comm_overlap, fw.overlap_tp_grad_allreduce
    )
    params = layer_params(s, sh)
    # the framework's own small kernels beyond the model's (bias adds, layout copies, bias-gradient reductions)
    legacy = fw.kernels == "megatron-legacy"
    bias = 1 if m.add_bias_linear else 0
    qkv_out, heads_dim = (heads + 2 * kv_heads) * d, heads * d
    qkv_bias, context_copy, mlp_bias = (
        framework_kernels.layer_forward(e, tokens, h, qkv_out, heads_dim, sp, bias) if legacy else (None,) * 3
    )
    extra_bwd = (
        framework_kernels.layer_backward(e, tokens, h, qkv_out, heads_dim, sh.f_up // t, sp, bias)
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

    fwd = present(
        norm(sh, "input layernorm"),
        gather_in("attention input"),
        qkv,
        qkv_bias,
        *attn_fwd,
        context_copy,
        proj,
        scatter_out("attention output"),
        residual(sh, "attention bias-dropout-add"),
        norm(sh, "post-attention layernorm"),
        *layer_syncs,
        gather_in("mlp input"),
        up,
        act,
        down,
        scatter_out("mlp output"),
        mlp_bias,
        residual(sh, "mlp bias-dropout-add"),
    )
    bwd = present(
        residual_backward(sh, "mlp bias-dropout-add backward"),
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
        norm_backward(sh, "post-attention layernorm backward"),
        residual_backward(sh, "attention bias-dropout-add backward"),
        grad_out("attention output gradient"),
        *gemm_backward(proj),
        *attn_bwd,
        *gemm_backward(qkv),
        grad_in("attention input gradient"),
        norm_backward(sh, "input layernorm backward"),
        *extra_bwd,
        framework_kernels.grad_accumulation(fw, tr.precision, "layer", params, tensors_per_layer(m)),
    )
    # DeepSpeed activation checkpointing: the checkpoint (layer input) split over the TP ranks
    # (partition_activations) and kept in host memory (cpu_checkpointing); backward fetches and re-gathers it.
    # Both copies are synchronous and go through pageable memory (DeepSpeed v0.6.2 to v0.16.4,
    # runtime/activation_checkpointing/checkpointing.py: CheckpointFunction.forward runs partition_activations,
    # ``partition.cpu()``, before the layer; backward's gather_partitioned_activations copies it back with
    # ``part_i.copy_(item)`` into a fresh device buffer before the recomputation), so neither hides under a kernel.
    ckpt = checkpoint_bytes_per_layer(s)
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
        params,
        (*fetch, *recompute),
    )
    setup = (
        (host_op("microbatch setup (data, masks, loss bookkeeping)", fw.host.microbatch_s),)
        if fw.host.microbatch_s
        else ()
    )
    embedding = embedding_block(s, sh, fw, scatter_out)
    head = head_block(s, sh, fw, gather_in, grad_in)
    return Workload(s, layer, embedding, head, fw, setup)
