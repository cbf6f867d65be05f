"""A pipeline stage's memory: its layers' model states as the data-parallel sharding leaves them, and the
activations of the micro-batches in flight, counted by walking the stage's schedule."""

from __future__ import annotations

from simulator.hardware.cluster import Cluster
from simulator.scenario.schema import Scenario
from simulator.strategy.groups import expert_grad_group_size, grad_group_size
from simulator.strategy.memory import with_host_checkpoints
from simulator.strategy.reduction import bf16_optimizer
from simulator.strategy.schedules import DUAL, SPLITS_BACKWARD, Step
from simulator.strategy.state_bytes import fp8_weight_copy_bytes, fsdp_reduce_bytes, grad_bytes
from simulator.strategy.steps import overlaps_a2a
from simulator.workload.cuda_graphs import static_input_bytes
from simulator.workload.fp8 import is_quantized
from simulator.workload.loss import head_activation_bytes, head_reserve_bytes
from simulator.workload.memory import (
    MemoryBreakdown,
    state_bytes_per_param,
    zero_model_state_bytes,
)
from simulator.workload.recompute import chunk_activation_bytes, chunk_policies, largest_layer_bytes
from simulator.workload.transformer import Workload


def stage_memory(
    s: Scenario,
    w: Workload,
    cluster: Cluster,
    chunks,
    tasks: list[tuple[Step, ...]],
    st: int,
    v: int,
    params: float,
    versions: int = 1,
) -> MemoryBreakdown:
    """Model states of the stage's layers (ZeRO-1 / distributed optimizer shards the optimizer states over DP),
    and activations for the microbatches in flight, counted by walking the schedule's ``tasks`` (a step each, or a
    forward and a backward run as one): +1 at a chunk's forward, -1 at its backward (at W for the half of the
    activations the weight gradient still needs). PipeDream-2BW keeps ``versions`` = 2 copies of the weights (the
    extra one counted as a buffer)."""
    par = s.parallelism
    w_b, _, k_b = state_bytes_per_param(
        s.training.precision, s.training.optimizer, s.training.optimizer_moments
    )
    g_b = grad_bytes(s, w.framework)
    stage = 1 if par.fsdp else par.zero_stage
    if par.fsdp:
        # FSDP2 under torch.distributed.pipelining: every micro-batch's backward runs without gradient sync
        # (stage.py backward_maybe_with_nosync), so the stage's gradients accumulate unsharded, cast to the
        # reduce dtype (_fsdp_param.py to_accumulated_grad_if_needed): fp32 under torchtitan
        g_b = fsdp_reduce_bytes(s, w.framework)
    if par.pipeline_schedule == "deepspeed" and bf16_optimizer(s):
        # BF16_Optimizer: the bf16 gradients of the last backward and the fp32 copy of every gradient, whole
        # on each rank; the fp32 weights and Adam states of the rank's 1/N (bf16_optimizer.py, v0.16.5)
        g_b, stage = g_b + 4, 1
    p_bytes, g_bytes, o_bytes = zero_model_state_bytes(params, grad_group_size(s), stage, k_b, w_b, g_b)
    experts = sum(u.expert_params for c in range(v) for u in chunks[(st, c)])
    if experts:  # a mixture-of-experts model's routed experts, sharded over expert data parallelism
        ep_bytes, eg_bytes, eo_bytes = zero_model_state_bytes(
            experts, expert_grad_group_size(s), stage, k_b, w_b, g_b
        )
        p_bytes, g_bytes, o_bytes = p_bytes + ep_bytes, g_bytes + eg_bytes, o_bytes + eo_bytes
    quantized = [u.block for c in range(v) for u in chunks[(st, c)] if u.is_layer and is_quantized(u.block)]
    p_bytes += fp8_weight_copy_bytes(s, w, sum(b.params + b.expert_params for b in quantized))
    layers = {c: sum(1 for u in chunks[(st, c)] if u.is_layer) for c in range(v)}
    heads = {c: chunks[(st, c)][-1].name == "head" for c in range(v)}
    # each chunk's layers under their recompute policies (Megatron counts recompute_num_layers per chunk)
    kept, recompute_peak, layer = {}, 0.0, 0.0
    for c in range(v):
        blocks = [u.block for u in chunks[(st, c)] if u.is_layer]
        pairs = [(p, b.moe, b.kind) for p, b in zip(chunk_policies(s, len(blocks)), blocks, strict=True)]
        kept[c], extra = chunk_activation_bytes(s, pairs)
        recompute_peak = max(recompute_peak, extra)
        layer = max(layer, largest_layer_bytes(s, pairs))
    # Megatron-Core's combined 1F1B runs a forward beside a backward layer by layer and frees each backward
    # layer's activations as it ends (core_v0.14.0 model_chunk_schedule_plan.py ``run``, ScheduleNode
    # ``_release_state``): the pair holds at most a layer beyond the forward-before-backward count. DualPipe's
    # overlapped forward-backward is counted whole, as its README's PP + 1 counts it.
    paired = layer if overlaps_a2a(s) and par.pipeline_schedule not in DUAL else None

    change = {
        "F": 1.0,
        "B": -0.5 if par.pipeline_schedule in SPLITS_BACKWARD else -1.0,
        "I": -0.5,  # DualPipe's zero-bubble backward: the weight gradient's inputs stay until its W
        "W": -0.5,
        "O": 0.0,
    }

    # the loss's working set (on the last stage, one micro-batch's, from its forward's end to its output layer's
    # backward) and a recomputation's are never live together; the allocator holds the forward's working set (a
    # hole under the logits) and the loss's holes beyond what is allocated at the loss (strategy/memory.py
    # activation_memory)
    depths = 1 + s.model.mtp_layers
    loss = head_activation_bytes(s) * depths if any(heads.values()) else 0.0
    live, at_embedding = _walk(tasks, change, kept, _embedding_gradient(s, w, chunks, st, v), paired)
    peak = max(live + max(recompute_peak, loss), at_embedding)
    at_loss = live + loss + recompute_peak + head_reserve_bytes(s) * depths if loss else 0.0
    mem = MemoryBreakdown(
        p_bytes,
        g_bytes,
        o_bytes,
        peak,
        (versions - 1) * params * w_b,
        cluster.gpu.hbm_bytes,
        reserve=max(0.0, at_loss - peak),
        graphs=_graph_inputs(s, chunks, tasks, st, v),
    )
    if not s.training.cpu_checkpointing:
        return mem
    # checkpoints of the microbatches in flight, in host memory instead
    return with_host_checkpoints(s, mem, _walk(tasks, change, layers)[0], cluster)


def _walk(
    tasks: list[tuple[Step, ...]],
    change: dict,
    chunk_bytes: dict,
    embedding=None,
    paired: float | None = None,
) -> tuple[float, float]:
    """(the most live, the most at one of the embedding's gradient steps) over the stage's tasks: +1 at a
    chunk's forward, -1 at its backward (``change``); ``embedding`` (_embedding_gradient): from its chunk's first
    gradient step on, the whole vocabulary's fp32 gradient beyond its shard, and at each such step 6 bytes per
    element more. ``paired``: a forward and a backward run as one task hold at most that many bytes beyond what
    was live before them (then what the two leave); None: the task's steps one after the other."""
    live = most = at_embedding = extra = 0.0
    for task in tasks:
        if paired is not None and len(task) == 2:
            most = max(most, live + extra + paired)
        for kind, _, chunk in task:
            live += change[kind] * chunk_bytes[chunk]
            if embedding and (kind, chunk) == embedding[:2]:
                _, _, whole, tp = embedding
                at_embedding = max(at_embedding, live + extra + 6 * whole)
                extra = 4 * whole * (1 - 1 / tp)
            if paired is None or len(task) == 1:
                most = max(most, live + extra)
        most = max(most, live + extra)
    return most, at_embedding


def _graph_inputs(s: Scenario, chunks, tasks: list[tuple[Step, ...]], st: int, v: int) -> float:
    """The stage's CUDA graph static inputs: a set per graphed (layer, micro-batch) forward in flight, each set
    reused once its micro-batch's backward (its input gradient, under zero-bubble splits) has run
    (workload/cuda_graphs.py)."""
    if not s.training.cuda_graph_modules:
        return 0.0
    per_chunk = {
        c: sum(static_input_bytes(s, u.block.kind, u.block.moe) for u in chunks[(st, c)] if u.is_layer)
        for c in range(v)
    }
    return _walk(tasks, {"F": 1.0, "B": -1.0, "I": -1.0, "W": 0.0, "O": 0.0}, per_chunk)[0]


def _embedding_gradient(s: Scenario, w: Workload, chunks, st: int, v: int) -> tuple | None:
    """(gradient step kind, chunk, vocabulary x width elements, TP) where the stage holds the whole vocabulary's
    embedding gradient, else None.

    torch's tensor parallelism shards the embedding by vocabulary, but DTensor has no such sharding for its
    backward (torch/distributed/tensor/_ops/_embedding_ops.py ``embedding_dense_backward_strategy``: sharded by
    batch to Partial, column-wise, or Partial): the weight gradient comes out whole, the full vocabulary's, on every
    tensor-parallel rank. Under pipelining FSDP2 keeps it unsharded in fp32 across micro-batches
    (_fsdp_param.py ``to_accumulated_grad_if_needed``, then ``accumulate_unsharded_grad_if_needed``'s add_ of
    the 16-bit gradient into it through an fp32 copy). So on the stage with the embedding, from its first backward
    on, 4 bytes per vocabulary entry x width more than its shard (already among the gradients), and at each of
    its backwards the 16-bit gradient and the fp32 cast or copy, 6 bytes more. Traced on the CPU with torch
    2.13 (benchmarks/pipeline_stage_trace.py)."""
    par = s.parallelism
    emb = next((c for c in range(v) if chunks[(st, c)][0].name == "embedding"), None)
    if emb is None or not par.fsdp or par.tensor_parallel == 1 or w.framework.tensor_parallel != "dtensor":
        return None
    step = "W" if par.pipeline_schedule in SPLITS_BACKWARD else "B"
    return step, emb, float(s.model.vocab_size * s.model.hidden_size), par.tensor_parallel
