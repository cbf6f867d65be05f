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
from simulator.workload.memory import (
    MemoryBreakdown,
    checkpoint_bytes_per_layer,
    head_activation_bytes,
    state_bytes_per_param,
    zero_model_state_bytes,
)
from simulator.workload.offload import BUFFERS
from simulator.workload.recompute import chunk_activation_bytes, chunk_policies
from simulator.workload.transformer import Workload


def activation_memory(s: Scenario, layers: list, in_flight: int = 1, has_head: bool = True) -> float:
    """Activations held at the peak: what each of ``layers`` (a model chunk's blocks, in order) keeps under its
    recompute policy (workload/recompute.py) for each microbatch in flight, the output layer's logits, and what
    a recomputation has live at the backward's peak (full recompute: the layer, or Megatron's uniform group,
    being re-run; Korthikanti Sec. 5)."""
    policies = chunk_policies(s, len(layers))
    pairs = list(zip(policies, layers, strict=True))
    kept, peak = chunk_activation_bytes(s, [(p, b.moe) for p, b in pairs if not b.offloaded])
    away = [(p, b.moe) for p, b in pairs if b.offloaded]
    if away:  # offloaded layers: at most BUFFERS of them on the GPU at once (workload/offload.py)
        off_kept, off_peak = chunk_activation_bytes(s, away)
        kept += off_kept * min(BUFFERS, len(away)) / len(away)
        peak = max(peak, off_peak)
    total = kept * in_flight + peak
    if has_head:  # the output layer's, once more per multi-token prediction depth
        total += head_activation_bytes(s) * (1 + s.model.mtp_layers)
    return total


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
    w_b, _, k_b = state_bytes_per_param(s.training.precision, s.training.optimizer)
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
) -> MemoryBreakdown:
    """Per-GPU memory: model states sharded over ``shards`` ranks as ZeRO stage ``stage`` (FSDP = 3; experts over
    expert data parallelism), plus ``unsharded_params`` kept whole on every rank, activations of every layer,
    and the strategy's buffers."""
    w_b = state_bytes_per_param(s.training.precision, s.training.optimizer)[0]
    params, grads, opt = model_state_bytes(s, w, shards, stage)
    params += unsharded_params * w_b * (1 - 1 / shards)
    # Megatron-Core's combined 1F1B without pipeline stages runs a forward while the previous micro-batch's
    # backward still holds its activations: two micro-batches in flight
    combined = overlaps_a2a(s) and s.gradient_accumulation_steps > 1
    acts = activation_memory(s, list(w.layers), in_flight=2 if combined else 1)
    mem = MemoryBreakdown(params, grads, opt, acts, buffers, cluster.gpu.hbm_bytes)
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
