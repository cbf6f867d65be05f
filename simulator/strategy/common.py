"""Pieces every data-parallel strategy shares: the model as a list of units (embedding, layers, head) in
forward order, activation-recompute handling, and the optimizer step."""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.hardware.placement import Placement
from simulator.hardware.topology import cluster_spec
from simulator.program import COMPUTE, Program
from simulator.scenario.schema import Scenario
from simulator.workload.memory import (
    MemoryBreakdown,
    activation_bytes_per_layer,
    checkpoint_bytes_per_layer,
    head_activation_bytes,
    state_bytes_per_param,
    zero_model_state_bytes,
)
from simulator.workload.transformer import Block, Op, Workload, host_op, memory_op, tensors_per_layer


def placement_for(s: Scenario) -> Placement:
    """Where every rank's tensor, context, data and pipeline coordinates put it (``parallelism.rank_order``)."""
    p = s.parallelism
    shard = p.fsdp.hybrid_shard_size if p.fsdp and p.fsdp.hybrid_shard_size else None
    return Placement(
        p.tensor_parallel, p.context_parallel, p.data_parallel, p.pipeline_parallel, shard, p.rank_order
    )


@dataclass(frozen=True)
class Unit:
    """A block as the strategy sees it: a name, its work, and the parameters its gradients cover."""

    index: int
    name: str
    block: Block
    params: int
    is_layer: bool


def units(w: Workload) -> list[Unit]:
    """Embedding, transformer layers, output head, in forward order. With tied embeddings the output layer's
    weight is the embedding's, so the head unit only owns the final norm."""
    m, t = w.scenario.model, w.scenario.parallelism.tensor_parallel
    head_params = w.head.params - (m.vocab_size * m.hidden_size // t if m.tied_embeddings else 0)
    out = [Unit(0, "embedding", w.embedding, w.embedding.params, False)]
    out += [Unit(i + 1, f"layer {i}", w.layer, w.layer.params, True) for i in range(w.num_layers)]
    out.append(Unit(w.num_layers + 1, "head", w.head, head_params, False))
    return out


def gather_params(w: Workload, u: Unit) -> int:
    """Parameters a sharded strategy must gather before the unit runs: its own, except that the output head
    computes logits with the full output weight even when that weight is tied to the embedding."""
    return w.head.params if u.name == "head" else u.params


def add_forward(
    p: Program, u: Unit, mb: int, deps=(), rank: int = 0, ops: tuple | None = None, sync: bool = False
) -> int:
    return p.add(
        rank,
        COMPUTE,
        "forward",
        "forward",
        f"{u.name} forward",
        deps,
        ops=ops or u.block.forward,
        microbatch=mb,
        sync=sync,
    )


def with_setup(w: Workload, ops: tuple[Op, ...], cache: dict) -> tuple[Op, ...]:
    """``ops`` preceded by the framework's per-microbatch host work (data, masks), one tuple per ``ops``."""
    if not w.microbatch_setup:
        return ops
    key = id(ops)
    if key not in cache:
        cache[key] = (*w.microbatch_setup, *ops)
    return cache[key]


def microbatch_sync(w: Workload) -> bool:
    """Does each microbatch's forward start with the host waiting for the GPU (a blocking input copy)?"""
    return w.framework.host.syncs.microbatch


def ddp_settings(s: Scenario, w: Workload) -> tuple[bool, float | None]:
    """(overlap gradient reduction with backward, bucket bytes or None for one bucket): the scenario's
    ``parallelism.ddp`` where it says, else the framework's way (PyTorch DDP: 25 MB buckets under backward;
    Megatron-LM's local DDP: the whole gradient buffer after backward, megatron/model/distributed.py)."""
    cfg, fw = s.parallelism.ddp, w.framework.ddp
    overlap = cfg.overlap_grad_reduce if cfg.overlap_grad_reduce is not None else fw.overlap_grad_reduce
    cap_mb = cfg.bucket_cap_mb if cfg.bucket_cap_mb is not None else fw.bucket_cap_mb
    return overlap, (cap_mb * 2**20 if cap_mb is not None else None)


def parameter_tensors(s: Scenario, layers: int, embedding: bool, head: bool) -> int:
    """Parameter tensors of ``layers`` layers (plus the embedding and output head where held): what an
    optimizer step loops over in Python (Megatron's fp16 optimizer copies and clips per tensor)."""
    m = s.model
    norm = 2 if m.normalization == "layernorm" else 1
    n = layers * tensors_per_layer(m)
    if embedding:
        n += 1 + (m.position_embedding == "learned")
    if head:
        n += norm + (0 if m.tied_embeddings else 1)
    return n


def add_backward(
    p: Program, s: Scenario, u: Unit, mb: int, deps=(), rank: int = 0, ops: tuple | None = None
) -> int:
    """Backward of one unit, preceded by its recomputation when activation recompute asks for it."""
    mode = s.training.activation_recompute
    if u.is_layer and mode == "full":
        rid = p.add(
            rank,
            COMPUTE,
            "recompute",
            "backward",
            f"{u.name} recompute",
            deps,
            ops=u.block.recompute_full or u.block.forward,
            microbatch=mb,
        )
        deps = (rid,)
    elif u.is_layer and mode == "selective" and u.block.recompute_selective:
        rid = p.add(
            rank,
            COMPUTE,
            "recompute",
            "backward",
            f"{u.name} recompute (attention)",
            deps,
            ops=u.block.recompute_selective,
            microbatch=mb,
        )
        deps = (rid,)
    return p.add(
        rank,
        COMPUTE,
        "backward",
        "backward",
        f"{u.name} backward",
        deps,
        ops=ops or u.block.backward,
        microbatch=mb,
    )


# Bytes an optimizer step streams per parameter: Adam reads and writes fp32 master weight, momentum and
# variance (24), reads the fp32 gradient (4) and writes the 16-bit weight (2) = 30; fp32 training skips the copy.
_OPTIMIZER_BYTES = {("adam", True): 30, ("adam", False): 28, ("sgd", True): 18, ("sgd", False): 12}


def add_optimizer(
    p: Program,
    s: Scenario,
    params: float,
    deps=(),
    rank: int = 0,
    w: Workload | None = None,
    tensors: int = 0,
    tensor_host_s: float = 0.0,
) -> int:
    """The optimizer step over ``params`` parameters (``tensors`` parameter tensors, for the framework's
    per-tensor host work, plus ``tensor_host_s`` per tensor for the strategy's own); with a host model it starts
    by reading the overflow flag / gradient norm on the host where the framework does (a sync)."""
    opt = "sgd" if s.training.optimizer == "sgd" else "adam"
    per_param = _OPTIMIZER_BYTES[(opt, s.training.precision != "fp32")]
    op = memory_op(
        f"{s.training.optimizer} step ({params / 1e6:.1f}M params)",
        params * per_param,
        f"{opt}_step",  # per element: one row of the table per parameter count
        round(params),
        1,
    )
    ops: tuple = (op,)
    sync = False
    if w is not None and w.framework.host.active:
        host = w.framework.host
        per_tensor = host.optimizer_tensor_s + tensor_host_s
        if tensors and per_tensor:
            ops = (host_op(f"optimizer loops over {tensors} tensors", tensors * per_tensor), op)
        sync = host.syncs.optimizer
    return p.add(rank, COMPUTE, "optimizer", "optimizer", "optimizer step", deps, ops=ops, sync=sync)


def grad_bytes(s: Scenario, framework=None) -> int:
    """Bytes per gradient element, in memory and on the wire: the training precision (PyTorch DDP and FSDP,
    DeepSpeed ZeRO), except bf16 where Megatron runs the reduction with fp32 main gradients
    (``parallelism.ddp.grad_reduce_in_fp32``, else ``framework.bf16_main_grads``; megatron/arguments.py:
    "bfloat16 requires gradient accumulation and all-reduce to be done in fp32"). ``framework``: the run's
    profile, which decides; without it, the precision. DeepSpeed's BF16_Optimizer is the pipeline engine's
    (``zero.bf16_optimizer``)."""
    g = state_bytes_per_param(s.training.precision, s.training.optimizer)[1]
    if framework is None or s.training.precision != "bf16":
        return g
    par = s.parallelism
    deepspeed = par.pipeline_schedule == "deepspeed" or par.zero_stage >= 2
    if par.fsdp is not None or deepspeed or (par.zero_stage == 1 and framework.zero == "deepspeed"):
        return g
    fp32 = par.ddp.grad_reduce_in_fp32
    if fp32 is None:
        fp32 = framework.bf16_main_grads == "fp32"
    return 4 if fp32 else g


def weight_bytes(s: Scenario) -> int:
    return state_bytes_per_param(s.training.precision, s.training.optimizer)[0]


def buckets(sizes: list[tuple[int, float]], cap: float) -> list[tuple[list[int], float]]:
    """Group consecutive (unit index, bytes) into buckets of at least ``cap`` bytes, as gradients become ready.
    A unit larger than the cap forms its own bucket (PyTorch DDP and DeepSpeed never split a tensor)."""
    out: list[tuple[list[int], float]] = []
    cur: list[int] = []
    total = 0.0
    for idx, nbytes in sizes:
        cur.append(idx)
        total += nbytes
        if total >= cap:
            out.append((cur, total))
            cur, total = [], 0.0
    if cur:
        out.append((cur, total))
    return out


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
    s: Scenario, w: Workload, gpu, shards: int, stage: int, buffers: float, unsharded_params: float = 0.0
) -> MemoryBreakdown:
    """Per-GPU memory: model states sharded over ``shards`` ranks as ZeRO stage ``stage`` (FSDP = 3), plus
    ``unsharded_params`` kept whole on every rank, activations of every layer, and the strategy's buffers."""
    w_b, _, k_b = state_bytes_per_param(s.training.precision, s.training.optimizer)
    g_b = grad_bytes(s, w.framework)
    params, grads, opt = zero_model_state_bytes(w.params_per_rank, shards, stage, k_b, w_b, g_b)
    params += unsharded_params * w_b * (1 - 1 / shards)
    mem = MemoryBreakdown(params, grads, opt, activation_memory(s, w.num_layers), buffers, gpu.hbm_bytes)
    return with_host_checkpoints(s, mem, w.num_layers)


def with_host_checkpoints(s: Scenario, mem: MemoryBreakdown, checkpoints: float) -> MemoryBreakdown:
    """DeepSpeed ``cpu_checkpointing``: ``checkpoints`` layer checkpoints per GPU live in the node's host memory."""
    if not s.training.cpu_checkpointing:
        return mem
    node = cluster_spec(s).node
    return replace(
        mem,
        host=mem.host + checkpoints * checkpoint_bytes_per_layer(s) * node.gpus,
        host_capacity=node.host_memory_gib * 2**30,
    )


def model_parallel_size(s: Scenario) -> int:
    """Ranks that one data-parallel rank's work is split over inside a pipeline stage (TP x CP)."""
    return s.parallelism.tensor_parallel * s.parallelism.context_parallel


def ranks_per_stage(s: Scenario) -> int:
    """Real ranks one simulated rank stands for: every data-, tensor- and context-parallel rank of a pipeline
    stage (all ranks when there is no pipeline)."""
    return grad_group_size(s) * s.parallelism.tensor_parallel


def rank_label(s: Scenario) -> str:
    p = s.parallelism
    tp = f" x {p.tensor_parallel} tensor-parallel" if p.tensor_parallel > 1 else ""
    return f"all {p.data_parallel} data-parallel{tp} ranks"


def grad_group(s: Scenario, base: str = "dp") -> str:
    """The group gradients are reduced (and states sharded) over: data parallel, joined by the context-parallel
    ranks, which hold the same weights and see other tokens (Megatron-Core, torchtitan)."""
    return f"{base}+cp" if s.parallelism.context_parallel > 1 else base


def grad_group_size(s: Scenario) -> int:
    return s.parallelism.data_parallel * s.parallelism.context_parallel
