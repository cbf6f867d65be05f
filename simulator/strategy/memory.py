"""Per-GPU memory of a data-parallel strategy (the pipeline's is ``pipeline/memory.py``): model states as the
ZeRO stage shards them, the activations at the peak, the strategy's buffers, and DeepSpeed's activation
checkpoints in host memory."""

from __future__ import annotations

from dataclasses import replace

from simulator.hardware.cluster import Cluster
from simulator.scenario.schema import Scenario
from simulator.strategy.state_bytes import grad_bytes
from simulator.workload.memory import (
    MemoryBreakdown,
    activation_bytes_per_layer,
    checkpoint_bytes_per_layer,
    head_activation_bytes,
    state_bytes_per_param,
    zero_model_state_bytes,
)
from simulator.workload.transformer import Workload


def activation_memory(s: Scenario, layers: int, in_flight: int = 1, has_head: bool = True) -> float:
    """Activations held at the peak: ``layers`` layers' worth for each microbatch in flight, the output layer's
    logits, and with full recompute the one layer being recomputed (its full activations, Korthikanti Sec. 5)."""
    total = layers * activation_bytes_per_layer(s) * in_flight
    if has_head:
        total += head_activation_bytes(s)
    if s.training.activation_recompute == "full":
        total += activation_bytes_per_layer(s, recompute="none")
    return total


def memory_breakdown(
    s: Scenario,
    w: Workload,
    cluster: Cluster,
    shards: int,
    stage: int,
    buffers: float,
    unsharded_params: float = 0.0,
) -> MemoryBreakdown:
    """Per-GPU memory: model states sharded over ``shards`` ranks as ZeRO stage ``stage`` (FSDP = 3), plus
    ``unsharded_params`` kept whole on every rank, activations of every layer, and the strategy's buffers."""
    w_b, _, k_b = state_bytes_per_param(s.training.precision, s.training.optimizer)
    g_b = grad_bytes(s, w.framework)
    params, grads, opt = zero_model_state_bytes(w.params_per_rank, shards, stage, k_b, w_b, g_b)
    params += unsharded_params * w_b * (1 - 1 / shards)
    mem = MemoryBreakdown(
        params, grads, opt, activation_memory(s, w.num_layers), buffers, cluster.gpu.hbm_bytes
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
