"""The iteration of PyTorch FSDP2 / HSDP, and the plan and step fully sharded strategies share (DeepSpeed ZeRO-3's
replay of its hooks: strategy/zero3_replay.py).

Before a unit computes, its parameters are all-gathered on the all-gather stream; the gather of unit i may start
once the compute ``depth`` positions before i has finished (prefetch bounded by memory). Backward re-gathers
the units whose parameters were freed after forward and reduce-scatters each unit's gradients on a reduction stream; HSDP
then all-reduces the shard across replicas. Compute waits for its gather; the optimizer waits for every reduction.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.program import COMPUTE, Program
from simulator.scenario.schema import Scenario
from simulator.strategy.offload import add_host_step, add_param_copy
from simulator.strategy.steps import (
    add_backward,
    add_forward,
    add_optimizer,
    microbatch_sync,
    with_setup,
)
from simulator.strategy.units import Unit, gather_params, parameter_tensors
from simulator.strategy.zero3_fetch import FetchSchedule
from simulator.workload.ops import memory_op
from simulator.workload.transformer import Workload


@dataclass(frozen=True)
class ShardingPlan:
    gather_group: str  # e.g. "dp" or "dp_shard"
    replicate_group: str | None  # HSDP: all-reduce of the reduced shard across replicas
    shard_size: int
    prefetch_depth: int  # units gathered ahead of the one computing
    kept_after_forward: frozenset[int]  # units whose gathered parameters stay until their backward
    reduce_every_microbatch: bool
    overlap_reduce: bool  # reductions on their own stream; otherwise compute waits for each one
    weight_bytes: float
    grad_bytes: int  # per gradient element reduced (FSDP2: its reduce dtype's)
    # per element of the gradient autograd leaves unsharded (the parameter's dtype)
    unsharded_grad_bytes: int = 2
    # FSDP2's per-parameter copies around each collective (framework.fsdp_copies); FSDP1's flat parameter has none
    copies: bool = False
    # ZeRO++ (Wang et al. 2023): forward gathers in fewer bytes per parameter (qwZ), backward gathers from a
    # secondary shard in a smaller group (hpZ), gradients as a two-step quantized all-to-all (qgZ)
    forward_gather_bytes: float | None = (
        None  # bytes per parameter of forward all-gathers (default: weight_bytes)
    )
    backward_gather_group: str | None = None  # default: gather_group
    forward_extra_bytes_per_param: float = 0.0  # dequantize kernel traffic per gathered parameter
    quantized_reduce: tuple[str, str, int, float] | None = (
        None  # (intra group, inter group, size, bytes/param)
    )
    backward_extra_bytes_per_param: float = 0.0  # gradient (de)quantize kernel traffic per parameter
    # ZeRO-Offload / ZeRO-Infinity: where optimizer states and parameter shards live ("cpu", "nvme" or None)
    offload_optimizer: str | None = None
    offload_param: str | None = None
    # DeepSpeed ZeRO-3: the coordinator's calls, module by module (simulator/strategy/zero3_fetch.py); without it
    # every unit is gathered whole, ``prefetch_depth`` units ahead (FSDP2)
    fetch: FetchSchedule | None = None


def add_sharded_iteration(p: Program, s: Scenario, w: Workload, us: list[Unit], plan: ShardingPlan) -> None:
    """FSDP2's per-unit iteration (DeepSpeed ZeRO-3's, ``plan.fetch``, is strategy/zero3_replay.py's): units
    gather ``gather_params`` (the head also needs a tied embedding's weight) ``prefetch_depth`` computes ahead
    and reduce-scatter the gradients of their own ``params`` (HSDP then all-reduces the shard across replicas)."""
    gas = s.gradient_accumulation_steps
    computes: list[int] = []  # compute task ids in execution order, for prefetch limits
    reductions: list[int] = []

    def gather(u: Unit, phase: str, after: int | None = None) -> int:
        # the next compute is computes[len]; with depth d its gather may overlap the d computes before it
        pos = len(computes) - 1 - plan.prefetch_depth
        deps = ((computes[pos],) if pos >= 0 else ()) + ((after,) if after is not None else ())
        nbytes = gather_params(w, u) * plan.weight_bytes
        gid = p.add(
            0,
            "comm.ag",
            "all_gather",
            phase,
            f"{u.name} param all-gather",
            deps,
            group=plan.gather_group,
            bytes=nbytes,
        )
        # FSDP2 copies the gathered buffer out into the unit's parameters on the compute stream before the unit
        # runs (_fsdp_collectives.py foreach_all_gather_copy_out, split_with_sizes_copy, from wait_for_unshard)
        if not plan.copies:
            return gid
        copy = memory_op("all-gather copy-out", FSDP_COPY_OUT_PER_BYTE * nbytes)
        return p.add(0, COMPUTE, "copy", phase, f"{u.name} all-gather copy-out", (gid,), ops=(copy,))

    def add_reduction(
        kind: str, name: str, after: int, group: str, nbytes: float, copy_in: float = 0.0
    ) -> int:
        """A gradient reduction step on the reduction stream, after ``after`` (``copy_in``: bytes its input copy
        moves first on the same stream)."""
        if copy_in:
            ops = (memory_op("reduce-scatter copy-in", copy_in, direction="backward"),)
            after = p.add(0, "comm.rs", "copy", "backward", f"{name} copy-in", (after,), ops=ops)
        return p.add(0, "comm.rs", kind, "backward", name, (after,), group=group, bytes=nbytes)

    setup: dict = {}
    for mb in range(gas):
        # backward ends by waiting for its reductions (FSDP2's post-backward final callback), so the next
        # microbatch starts after them
        sync = reductions[-1] if reductions else None
        for i, u in enumerate(us):
            ops = with_setup(w, u.block.forward, setup) if i == 0 else u.block.forward
            deps = (gather(u, "forward", sync if i == 0 else None),)
            computes.append(add_forward(p, u, mb, deps, ops=ops, sync=i == 0 and microbatch_sync(w)))
        reduce = plan.reduce_every_microbatch or mb == gas - 1
        blocking = None
        for u in reversed(us):
            deps = () if u.index in plan.kept_after_forward else (gather(u, "backward"),)
            if blocking is not None:
                deps += (blocking,)
            computes.append(add_backward(p, s, u, mb, deps))
            if not reduce:
                continue
            nbytes = u.params * plan.grad_bytes
            # FSDP2's foreach_reduce_scatter_copy_in (torch._chunk_cat): the unsharded gradients read, cast to
            # the reduce dtype into the reduce-scatter input. FSDP1 reduces the flat gradient in place, unless
            # its reduce dtype differs: then _post_backward_hook casts it first, on the reduce-scatter's stream
            # (torch/distributed/fsdp/_runtime_utils.py, ``flat_param.grad.to(handle._reduce_dtype)``, torch
            # 2.1 to 2.13)
            cast = plan.copies or plan.grad_bytes != plan.unsharded_grad_bytes
            copy_in = u.params * (plan.unsharded_grad_bytes + plan.grad_bytes) if cast else 0.0
            rid = add_reduction(
                "reduce_scatter",
                f"{u.name} grad reduce-scatter",
                computes[-1],
                plan.gather_group,
                nbytes,
                copy_in,
            )
            if plan.replicate_group:
                rid = add_reduction(
                    "all_reduce",
                    f"{u.name} grad all-reduce across replicas",
                    rid,
                    plan.replicate_group,
                    nbytes / plan.shard_size,
                )
            blocking = None if plan.overlap_reduce else rid
            reductions.append(rid)
    shard_step(p, s, w, us, plan, reductions)


def shard_step(
    p: Program,
    s: Scenario,
    w: Workload,
    us: list[Unit],
    plan: ShardingPlan,
    reductions: list[int],
    tensor_host_s: float = 0.0,
) -> None:
    """The optimizer step on the rank's shard, once every reduction is done (on the host with ZeRO-Offload);
    ``tensor_host_s`` more host seconds per parameter tensor (DeepSpeed ZeRO-3's step)."""
    params = sum(u.params for u in us) / plan.shard_size
    if not plan.offload_optimizer:
        tensors = parameter_tensors(s, w.num_layers, True, True)
        add_optimizer(p, s, params, reductions, w=w, tensors=tensors, tensor_host_s=tensor_host_s)
        return
    step = add_host_step(p, s, params, reductions)
    if not plan.offload_param:  # updated 16-bit shards back to the GPU for the next gathers
        add_param_copy(p, "updated weights to GPU", params * plan.weight_bytes, (step,), "optimizer")


# Bytes per gathered byte FSDP2 copies out of the all-gather buffer into the unit's parameters (a read and a
# write; torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_all_gather_copy_out, torch 2.4-2.13)
FSDP_COPY_OUT_PER_BYTE = 2.0
