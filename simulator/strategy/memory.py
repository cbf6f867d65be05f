"""Per-GPU memory of a data-parallel strategy (the pipeline's is ``pipeline/memory.py``): model states as the
ZeRO stage shards them, the activations at the peak, the strategy's buffers, and DeepSpeed's activation
checkpoints in host memory."""

from __future__ import annotations

from dataclasses import replace

from simulator.hardware.cluster import Cluster
from simulator.scenario.schema import Scenario
from simulator.strategy.groups import expert_grad_group_size
from simulator.strategy.state_bytes import fp8_weight_copy_bytes, grad_bytes
from simulator.strategy.steps import overlaps_a2a
from simulator.workload.cuda_graphs import static_input_bytes
from simulator.workload.loss import head_activation_bytes, head_reserve_bytes
from simulator.workload.memory import (
    MemoryBreakdown,
    checkpoint_bytes_per_layer,
    state_bytes_per_param,
    zero_model_state_bytes,
)
from simulator.workload.offload import BUFFERS
from simulator.workload.recompute import chunk_activation_bytes, chunk_policies, largest_layer_bytes
from simulator.workload.transformer import Workload


def activation_memory(
    s: Scenario,
    layers: list,
    in_flight: int = 1,
    has_head: bool = True,
    relief: float = 0.0,
    transient: float = 0.0,
) -> tuple[float, float]:
    """(activations held at the peak, what the caching allocator holds beyond them at the loss).

    Held: what each of ``layers`` (a model chunk's blocks, in order) keeps under its recompute policy
    (workload/recompute.py) for each microbatch in flight, and the larger of two working sets that are never live
    together: the loss's (the output layer's logits and their fp32 copies, live from the forward's end until the
    output layer's backward has consumed their gradient) and a recomputation's at the backward's peak (full
    recompute: the layer, or Megatron's uniform group, being re-run; Korthikanti Sec. 5), which starts only
    after it. ``relief``: model states and buffers not yet allocated when the loss runs (fsdp.py), which its
    working set may take.

    Held beyond: a layer's forward frees what it does not keep after allocating its output, the next layer's
    checkpoint, above it; the next layer's forward reuses that hole, and the last one's is still free under the
    logits, too small for the loss's tensors, which go above it and leave holes of their own (LOSS_TENSORS). So
    at the loss the allocator holds the recomputation's working set (the same tensors) and the loss's holes on
    top of what is allocated, and the relief, which other streams' pools hold. ``transient``: a working set
    never live with the loss's or a recomputation's (combined 1F1B's layer pair, below)."""
    policies = chunk_policies(s, len(layers))
    pairs = list(zip(policies, layers, strict=True))
    kept, peak = chunk_activation_bytes(s, [(p, b.moe, b.kind) for p, b in pairs if not b.offloaded])
    away = [(p, b.moe, b.kind) for p, b in pairs if b.offloaded]
    if away:  # offloaded layers: at most BUFFERS of them on the GPU at once (workload/offload.py)
        off_kept, off_peak = chunk_activation_bytes(s, away)
        kept += off_kept * min(BUFFERS, len(away)) / len(away)
        peak = max(peak, off_peak)
    peak = max(peak, transient)
    if not has_head:
        return kept * in_flight + peak, 0.0
    # the output layer's, once more per multi-token prediction depth
    depths = 1 + s.model.mtp_layers
    loss = head_activation_bytes(s) * depths
    held = kept * in_flight + max(peak, loss - relief)
    # the relief is free but still held: FSDP allocates the sharded gradients on its reduce-scatter stream and
    # gathers into buffers on its all-gather stream, and the caching allocator serves a stream only from the
    # blocks freed on it (CUDACachingAllocator: its pools are keyed by stream), not the loss's on the default one
    at_loss = kept * in_flight + loss + peak + head_reserve_bytes(s) * depths
    return held, max(0.0, at_loss - held)


def model_state_bytes(
    s: Scenario,
    w: Workload,
    shards: int,
    stage: int,
    params: float | None = None,
    expert_params: float | None = None,
) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes per GPU as ZeRO stage ``stage`` shards them: the dense parameters over
    ``shards`` ranks, the routed experts' over the expert data-parallel group (DeepSpeed-MoE's expert param
    groups; Megatron-Core's expert distributed optimizer). ``params`` / ``expert_params``: a stage's, default
    the whole model's on one rank."""
    w_b, _, k_b = state_bytes_per_param(
        s.training.precision, s.training.optimizer, s.training.optimizer_moments
    )
    g_b = grad_bytes(s, w.framework)
    dense = zero_model_state_bytes(
        w.params_per_rank if params is None else params, shards, stage, k_b, w_b, g_b
    )
    experts = w.expert_params_per_rank if expert_params is None else expert_params
    copies = fp8_weight_copy_bytes(s, w, sum(w.fp8_params_per_rank)) if params is None else 0.0
    if not experts:
        return dense[0] + copies, dense[1], dense[2]
    ex = zero_model_state_bytes(experts, expert_grad_group_size(s), stage, k_b, w_b, g_b)
    return dense[0] + ex[0] + copies, dense[1] + ex[1], dense[2] + ex[2]


def memory_breakdown(
    s: Scenario,
    w: Workload,
    cluster: Cluster,
    shards: int,
    stage: int,
    buffers: float,
    unsharded_params: float = 0.0,
    grads_at_loss: bool = True,
    buffers_at_loss: float | None = None,
) -> MemoryBreakdown:
    """Per-GPU memory: model states sharded over ``shards`` ranks as ZeRO stage ``stage`` (FSDP = 3; experts over
    expert data parallelism), plus ``unsharded_params`` kept whole on every rank, activations of every layer,
    and the strategy's buffers. ``grads_at_loss`` false: the gradients are not allocated when the loss runs;
    ``buffers_at_loss``: the buffers allocated then, where fewer (both fsdp.py)."""
    w_b = state_bytes_per_param(s.training.precision, s.training.optimizer, s.training.optimizer_moments)[0]
    params, grads, opt = model_state_bytes(s, w, shards, stage)
    params += unsharded_params * w_b * (1 - 1 / shards)
    relief = (0.0 if grads_at_loss else grads) + (
        buffers - buffers_at_loss if buffers_at_loss is not None else 0.0
    )
    # Megatron-Core's combined 1F1B without pipeline stages runs a forward beside the previous micro-batch's
    # backward layer by layer, forward layer i beside backward layer L-1-i, and each backward node releases what
    # it kept as it ends (core_v0.14.0 model_chunk_schedule_plan.py ``run``, pipeline_parallel/utils.py
    # ``ScheduleNode._release_state``): one micro-batch's activations and at most a layer of the next's
    combined = overlaps_a2a(s) and s.gradient_accumulation_steps > 1
    pairs = [(p, b.moe, b.kind) for p, b in zip(chunk_policies(s, len(w.layers)), w.layers, strict=True)]
    layer = largest_layer_bytes(s, pairs) if combined else 0.0
    acts, reserve = activation_memory(s, list(w.layers), relief=relief, transient=layer)
    # one micro-batch in flight: a static input set per graphed layer (workload/cuda_graphs.py)
    graphs = sum(static_input_bytes(s, b.kind, b.moe) for b in w.layers)
    mem = MemoryBreakdown(
        params, grads, opt, acts, buffers, cluster.gpu.hbm_bytes, reserve=reserve, graphs=graphs
    )
    return with_host_checkpoints(s, mem, w.num_layers, cluster)


def with_host_checkpoints(
    s: Scenario, mem: MemoryBreakdown, checkpoints: float, cluster: Cluster
) -> MemoryBreakdown:
    """DeepSpeed ``cpu_checkpointing``: ``checkpoints`` layer checkpoints per GPU live in the node's host memory."""
    if not s.training.cpu_checkpointing:
        return mem
    node = cluster.spec.node
    return replace(
        mem,
        host=mem.host + checkpoints * checkpoint_bytes_per_layer(s) * node.gpus,
        host_capacity=node.host_memory_gib * 2**30,
    )
