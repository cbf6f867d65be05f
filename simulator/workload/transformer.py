"""The model as per-layer operations: FLOPs and bytes moved for one microbatch on one tensor-parallel rank.

Shapes follow Megatron-LM's GPT layer (Narayanan et al. SC21 Sec. 3.2; Korthikanti et al. 2022 Sec. 4):
layernorm -> QKV projection -> attention (QK^T, softmax, dropout, context; or one FlashAttention kernel) ->
output projection -> bias-dropout-add -> layernorm -> MLP up -> activation -> MLP down -> bias-dropout-add.
With tensor parallelism ``t`` the projections are column/row parallel (heads and MLP width split by t); with
sequence parallelism the layernorm / dropout work is split by t too. A mixture-of-experts layer has the same
attention and an MoE MLP instead of the dense one (``moe.py``). The pieces: sizes in ``shape.py``, attention's
projections and core in ``attention.py``, tensor parallelism's collectives in ``tensor_parallel.py``, the
embedding and output head in ``embedding.py``, the framework's own kernels in ``framework_kernels.py``,
parameter counts in ``params.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from simulator.frameworks import Framework, get_framework
from simulator.hardware.gpus import GPU, get_gpu
from simulator.hardware.topology import cluster_spec
from simulator.scenario.schema import Scenario
from simulator.workload import elementwise, framework_kernels, offload
from simulator.workload.attention import attention_ops, projection_ops
from simulator.workload.block import Block, Part, present
from simulator.workload.embedding import embedding_block, head_block
from simulator.workload.expert_load import ExpertLoad
from simulator.workload.fp8 import Fp8Plan, amax_reductions, fp8_plan, is_quantized, quantize_block
from simulator.workload.graph_modules import tagged
from simulator.workload.hybrid import hybrid_layer
from simulator.workload.mamba import mamba_part
from simulator.workload.memory import checkpoint_bytes_per_layer
from simulator.workload.moe import moe_load, moe_part
from simulator.workload.ops import (
    Op,
    collective_op,
    gemm_backward,
    host_op,
    linear,
    recomputed,
    sync_op,
)
from simulator.workload.params import parameter_count, tensors_per_layer
from simulator.workload.recompute import (
    early_stopped,
    op_policy_recompute,
    selective_ops,
    stops_early,
)
from simulator.workload.shape import (
    LayerShape,
    activation,
    layer_shape,
    norm,
    norm_backward,
    residual,
    residual_backward,
)
from simulator.workload.tensor_parallel import tp_collectives, tp_overlapped


@dataclass(frozen=True)
class Workload:
    scenario: Scenario
    layers: tuple[Block, ...]  # every transformer layer in order (identical layers share one Block)
    embedding: Block
    head: Block  # final norm, logits, cross-entropy loss
    framework: Framework  # the software that runs it: its extra kernels, host costs and syncs
    # host work at the start of every microbatch's forward (data, masks; one op, or () without a host model)
    microbatch_setup: tuple[Op, ...] = ()
    expert_load: ExpertLoad | None = None  # the busiest expert-parallel rank of the MoE layers
    mtp: tuple[Block, ...] = ()  # multi-token prediction depths, after the layers on the last stage
    fp8: Fp8Plan | None = (
        None  # how FP8 training quantizes (None: the linear layers run in the training precision)
    )

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def layer(self) -> Block:
        """The first transformer layer (every layer of a dense model; ``layers`` for an MoE one)."""
        return self.layers[0]

    @cached_property
    def kinds(self) -> tuple[Block, ...]:
        """The distinct layer blocks (one for a dense model; dense and MoE layers for an MoE one)."""
        out: dict[int, Block] = {}
        for b in self.layers:
            out.setdefault(id(b), b)
        return tuple(out.values())

    @cached_property
    def params_per_rank(self) -> int:
        """Dense parameters on one rank (every layer, the embedding and the head of all pipeline stages); for an MoE
        model the routed experts are ``expert_params_per_rank``."""
        m, t = self.scenario.model, self.scenario.parallelism.tensor_parallel
        head = self.head.params - (m.vocab_size * m.hidden_size // t if m.tied_embeddings else 0)
        return sum(b.params for b in (*self.layers, *self.mtp)) + self.embedding.params + head

    @cached_property
    def expert_params_per_rank(self) -> int:
        """The routed experts' parameters on one rank (every MoE layer), reduced over expert data parallelism."""
        return sum(b.expert_params for b in (*self.layers, *self.mtp))

    @cached_property
    def fp8_params_per_rank(self) -> tuple[int, int]:
        """(dense, routed-expert) parameters on one rank of the layers whose linear layers run in FP8 (their few
        norm weights included): what FP8 weight copies and FP8 parameter all-gathers apply to."""
        if self.fp8 is None:
            return 0, 0
        blocks = [b for b in (*self.layers, *self.mtp) if is_quantized(b)]
        return sum(b.params for b in blocks), sum(b.expert_params for b in blocks)

    @cached_property
    def total_params(self) -> int:
        return parameter_count(self.scenario)

    @cached_property
    def model_flops_per_microbatch(self) -> float:
        """Forward + backward model FLOPs of one microbatch on the whole model (all TP ranks): 3 x forward."""
        t = self.scenario.parallelism.tensor_parallel
        fwd = sum(b.forward_model_flops for b in (*self.layers, *self.mtp)) + self.head.forward_model_flops
        return 3.0 * fwd * t


def dense_mlp_part(s: Scenario, sh: LayerShape, tp, mlp_bias: Op | None, eager: bool = False) -> Part:
    """The dense MLP: up projection (with the gate for SwiGLU), activation, down projection, between the
    tensor-parallel collectives of its input and output. ``eager``: SwiGLU as separate SiLU and multiply
    kernels (workload/elementwise.py)."""
    m = s.model
    gather_in, scatter_out, grad_in, grad_out, regather = tp
    e, tokens, h, f, t = sh.e, sh.tokens, sh.h, sh.f, sh.t
    up = linear("mlp up projection", tokens, sh.f_up // t, h)
    down = linear("mlp down projection", tokens, h, f // t)
    act, act_bwd = activation(m, f"{m.activation}", e, tokens, f // t)
    split, split_bwd = elementwise.swiglu_eager(e, tokens, f // t) if eager and m.gated else (None, None)
    forward = present(gather_in("mlp input"), up, act, split, down, scatter_out("mlp output"), mlp_bias)
    backward = present(
        grad_out("mlp output gradient"),
        *gemm_backward(down),
        split_bwd,
        act_bwd,
        regather("mlp input"),
        *gemm_backward(up),
        grad_in("mlp input gradient"),
    )
    bias = (sh.f_up // t + h) if m.add_bias_linear else 0
    return Part(forward, backward, h * sh.f_up // t + f // t * h + bias)


def build_workload(
    s: Scenario,
    framework: Framework | None = None,
    gpus_per_node: int | None = None,
    gpu: GPU | None = None,
) -> Workload:
    """The model's kernels for one microbatch on one tensor-parallel rank, as ``framework`` (default: the
    scenario's) launches them. ``gpus_per_node``: the cluster's, where a kernel's traffic depends on which ranks
    share a node (DeepEP's dispatch; without it an expert-parallel group is taken to fit in a node). ``gpu``: the
    cluster's (default: the scenario's topology's), for what FP8 training quantizes and how."""
    fw = framework or get_framework(s.framework)
    m, p, tr = s.model, s.parallelism, s.training
    sh = layer_shape(s)
    e, tokens, h, t, sp = sh.e, sh.tokens, sh.h, sh.t, sh.sp
    heads = sh.heads

    tp = tp_collectives(t, p, e * tokens * h, fw)
    gather_in, scatter_out, grad_in, grad_out, regather = tp
    proj_fwd, proj_bwd, proj_params = projection_ops(s, sh)
    proj = linear("attention output projection", tokens, h, heads * sh.dv)
    attn_fwd, attn_bwd = attention_ops(s, sh, fw.context_parallel, fw.kernels)
    attention_params = proj_params + heads * sh.dv * h + (h if m.add_bias_linear else 0) + 2 * sh.norm_params
    # the framework's own small kernels beyond the model's (bias adds, layout copies, bias-gradient reductions)
    legacy = fw.kernels == "megatron-legacy"
    bias = 1 if m.add_bias_linear else 0
    qkv_out, heads_dim = (heads + 2 * sh.kv_heads) * sh.d, heads * sh.d
    qkv_bias, context_copy, mlp_bias = (
        framework_kernels.layer_forward(e, tokens, h, qkv_out, heads_dim, sp, bias) if legacy else (None,) * 3
    )
    extra_bwd = (
        framework_kernels.layer_backward(e, tokens, h, qkv_out, heads_dim, sh.f_up // t, sp, bias)
        if legacy
        else framework_kernels.torch_layer_backward(e, tokens, h, qkv_out, sh.f_up // t, sp, bias)
        if fw.kernels == "torch" and m.mla is None
        else ()
    )
    # synchronising calls inside the layer's forward, between attention and MLP (Megatron-DeepSpeed's
    # ParallelTransformerLayer.forward builds moe_loss and mlp_bias with torch.tensor(0.0, device=...): a
    # pageable host-to-device copy, which PyTorch follows with cudaStreamSynchronize)
    layer_syncs = tuple(
        sync_op("host sync (device tensor from a host scalar)", fw.host.sync_s)
        for _ in range(fw.host.syncs.layer_forward)
    )
    ckpt = checkpoint_bytes_per_layer(s)
    chains, rope_style = elementwise.styles(fw, tr, m)
    rope_fwd, rope_bwd = (
        elementwise.rope(sh, rope_style) if m.position_embedding == "rope" and m.mla is None else (None, None)
    )
    residual_sums = elementwise.residual_gradient_sums(sh) if chains == "eager" else None

    def layer(name: str, mlp: Part, moe: bool) -> Block:
        params = attention_params + mlp.params
        # each kernel's module as Megatron-Core's CUDA graph scopes name them (workload/graph_modules.py): the MLP
        # half's own, the rest "attn"
        half = "moe" if moe else "mlp"
        mlp = replace(mlp, forward=tagged(mlp.forward, half), backward=tagged(mlp.backward, half))
        pre_mlp_norm = replace(norm(sh, "post-attention layernorm"), module="moe_router" if moe else "mlp")
        fwd = present(
            norm(sh, "input layernorm"),
            gather_in("attention input"),
            *proj_fwd,
            qkv_bias,
            rope_fwd,
            *attn_fwd,
            context_copy,
            proj,
            scatter_out("attention output"),
            residual(sh, "attention bias-dropout-add"),
            pre_mlp_norm,
            *layer_syncs,
            *mlp.forward,
            replace(residual(sh, "mlp bias-dropout-add"), module=half),
        )
        bwd = present(
            replace(residual_backward(sh, "mlp bias-dropout-add backward"), module=half),
            *mlp.backward,
            replace(norm_backward(sh, "post-attention layernorm backward"), module=pre_mlp_norm.module),
            residual_backward(sh, "attention bias-dropout-add backward"),
            grad_out("attention output gradient"),
            *gemm_backward(proj),
            *attn_bwd,
            rope_bwd,
            regather("attention input"),
            *proj_bwd,
            grad_in("attention input gradient"),
            norm_backward(sh, "input layernorm backward"),
            residual_sums,
            *extra_bwd,
            framework_kernels.grad_accumulation(
                fw, tr.precision, "layer", params + mlp.expert_params, tensors_per_layer(m)
            ),
        )
        # DeepSpeed activation checkpointing: the checkpoint (layer input) split over the TP ranks
        # (partition_activations) and kept in host memory (cpu_checkpointing); backward fetches and re-gathers it.
        # Both copies are synchronous and go through pageable memory (DeepSpeed v0.6.2 to v0.16.4,
        # runtime/activation_checkpointing/checkpointing.py: CheckpointFunction.forward runs partition_activations,
        # ``partition.cpu()``, before the layer; backward's gather_partitioned_activations copies it back with
        # ``part_i.copy_(item)`` into a fresh device buffer before the recomputation), so neither hides under a
        # kernel.
        fwd, bwd = tagged(fwd, "attn"), tagged(bwd, "attn")
        fetch: list[Op] = []
        recompute = recomputed(early_stopped(fwd) if stops_early(s, fw, moe) else fwd)
        if tr.cpu_checkpointing:
            fwd = (collective_op("checkpoint to host", "d2h_pageable", "host", ckpt), *fwd)
            fetch.append(collective_op("checkpoint from host", "h2d_pageable", "host", ckpt))
        if tr.partition_activations and t > 1:
            fetch.append(
                collective_op("checkpoint all-gather (partition_activations)", "all_gather", "tp", ckpt * t)
            )
        return Block(
            name,
            fwd,
            bwd,
            selective_ops(s, attn_fwd, pre_mlp_norm if moe else None, mlp, moe, proj_fwd),
            params,
            (*fetch, *recompute),
            mlp.expert_params,
            moe,
            op_policy_recompute(fwd, heads, sh.kv_heads, m.gated)
            if tr.activation_recompute == "selective-op"
            else (),
        )

    def hybrid_part(kind: str) -> Part:
        """The middle of a hybrid stack's layer of ``kind`` (workload/hybrid.py): attention alone, a Mamba-2 mixer,
        the MLP or the MoE MLP."""
        if kind == "attention":
            forward = present(
                gather_in("attention input"),
                *proj_fwd,
                rope_fwd,
                *attn_fwd,
                proj,
                scatter_out("attention output"),
            )
            backward = present(
                grad_out("attention output gradient"),
                *gemm_backward(proj),
                *attn_bwd,
                rope_bwd,
                regather("attention input"),
                *proj_bwd,
                grad_in("attention input gradient"),
            )
            return Part(forward, backward, attention_params - 2 * sh.norm_params)
        if kind == "mamba":
            return mamba_part(s, sh, tp)
        if kind == "mlp":
            return dense_mlp_part(s, sh, tp, mlp_bias, chains == "eager")
        return moe_part(s, sh, fw, tp, gpus_per_node)

    if m.hybrid_pattern:
        order = dict.fromkeys(m.layer_kind(i) for i in range(m.num_layers))
        kinds = {k: hybrid_layer(s, sh, fw, k, hybrid_part(k), attn_fwd, proj_fwd) for k in order}
        pattern = [kinds[m.layer_kind(i)] for i in range(m.num_layers)]
        dense = moe = None
    else:
        pattern = [m.is_moe_layer(i) for i in range(m.num_layers)]
        dense = (
            layer("transformer layer", dense_mlp_part(s, sh, tp, mlp_bias, chains == "eager"), False)
            if not all(pattern)
            else None
        )
        moe = (
            layer("moe transformer layer", moe_part(s, sh, fw, tp, gpus_per_node), True)
            if any(pattern)
            else None
        )
    setup = (
        (host_op("microbatch setup (data, masks, loss bookkeeping)", fw.host.microbatch_s),)
        if fw.host.microbatch_s
        else ()
    )
    embedding = embedding_block(s, sh, fw, scatter_out)
    head = head_block(s, sh, fw, gather_in, grad_in)
    layers = tuple(pattern) if m.hybrid_pattern else tuple(moe if is_moe else dense for is_moe in pattern)
    if tr.activation_offload_layers:  # the first N layers' activations to host memory and back
        layers = offload.offloaded_layers(s, layers, tr.activation_offload_layers)
    mtp = ()
    if m.mtp_layers:
        last = layers[-1]  # each depth is a layer like the model's last (DeepSeek-V3: an MoE layer)
        mtp = (mtp_block(s, sh, fw, last, embedding, head, tp),) * m.mtp_layers
    plan = fp8_plan(s, gpu or get_gpu(cluster_spec(s).node.gpu))
    if plan is not None:
        layers, mtp, setup = _quantized(s, plan, layers, mtp, setup)
    layers, mtp = (tp_overlapped(b, p.tp_comm_overlap, t, e) for b in (layers, mtp))  # after FP8's casts
    moe_stats = moe_load(s, sh) if m.moe is not None else None
    return Workload(s, layers, embedding, head, fw, setup, moe_stats, mtp, plan)


def _quantized(s: Scenario, plan: Fp8Plan, layers, mtp, setup):
    """The layers in FP8 but ``training.fp8.bf16_layers`` at each end, and the delayed recipe's amax reductions
    with each micro-batch (once per model chunk, as Megatron-Core's one autocast around each chunk's block)."""
    done: dict[int, Block] = {}

    def q(b: Block) -> Block:
        if id(b) not in done:
            done[id(b)] = quantize_block(b, plan, s)
        return done[id(b)]

    keep = s.training.fp8.bf16_layers
    n = len(layers)
    layers = tuple(b if i < keep or i >= n - keep else q(b) for i, b in enumerate(layers))
    mtp = tuple(q(b) for b in mtp)
    p = s.parallelism
    chunk = max(n // (p.pipeline_parallel * p.virtual_pipeline_stages), 1)
    linears = sum(1 for op in layers[-1].forward if op.kind == "gemm" and op.linear) * chunk
    return layers, mtp, (*setup, *amax_reductions(plan, linears))


def mtp_block(
    s: Scenario, sh: LayerShape, fw: Framework, layer: Block, embedding: Block, head: Block, tp
) -> Block:
    """One multi-token prediction depth (Megatron-Core transformer/multi_token_prediction.py, core_v0.13.0; DeepSeek-V3
    Sec. 2.2): the next tokens' embedding (the shared table) and the previous depth's hidden states, each normed,
    concatenated and projected back to ``h`` (eh_proj), one transformer layer, and the shared output layer's norm,
    logits and loss."""
    tokens, h, t = sh.tokens, sh.h, sh.t
    scatter_out = tp[1]
    proj = linear("mtp projection (eh_proj)", tokens, h, 2 * h // t)
    lookup = embedding.forward[0]
    fwd = present(
        lookup,
        norm(sh, "mtp embedding norm"),
        norm(sh, "mtp hidden norm"),
        proj,
        scatter_out("mtp projection output"),
        *layer.forward,
        *head.forward,
    )
    bwd = present(
        *head.backward,
        *layer.backward,
        *gemm_backward(proj),
        norm_backward(sh, "mtp hidden norm backward"),
        norm_backward(sh, "mtp embedding norm backward"),
        embedding.backward[0],
    )
    params = (
        2 * h * h // t + 2 * sh.norm_params + layer.params
    )  # the embedding and the output layer are shared
    return Block(
        "multi-token prediction", fwd, bwd, (), params, layer.recompute_full, layer.expert_params, layer.moe
    )
