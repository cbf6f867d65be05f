"""The iteration shared by fully sharded strategies (DeepSpeed ZeRO-3, PyTorch FSDP2 / HSDP).

Before a unit computes, its parameters are all-gathered on the all-gather stream; the gather of unit i may start
once the compute ``depth`` positions before i has finished (prefetch bounded by memory). Backward re-gathers
the units whose parameters were freed after forward and reduce-scatters each unit's gradients on a reduction stream; HSDP
then all-reduces the shard across replicas. Compute waits for its gather; the optimizer waits for every reduction.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.scenario.schema import Scenario
from simulator.strategy.common import Unit, add_backward, add_forward, add_optimizer
from simulator.strategy.program import Program


@dataclass(frozen=True)
class ShardingPlan:
    gather_group: str  # e.g. "dp" or "dp_shard"
    replicate_group: str | None  # HSDP: all-reduce of the reduced shard across replicas
    shard_size: int
    prefetch_depth: int  # units gathered ahead of the one computing
    kept_after_forward: frozenset[int]  # units whose gathered parameters stay until their backward
    reduce_every_microbatch: bool
    overlap_reduce: bool  # reductions on their own stream; otherwise compute waits for each one
    weight_bytes: int
    grad_bytes: int
    persistent: frozenset[int] = frozenset()  # small units never sharded, so never gathered


def add_sharded_iteration(p: Program, s: Scenario, us: list[Unit], plan: ShardingPlan, gather_params) -> None:
    """``gather_params(unit)`` is the parameter count the unit must gather (the head also needs a tied
    embedding's weight); gradients reduced are ``unit.params``."""
    gas = s.gradient_accumulation_steps
    computes: list[int] = []  # compute task ids in execution order, for prefetch limits
    reductions: list[int] = []

    def gather(u: Unit, phase: str, after: int | None = None) -> int:
        # the next compute is computes[len]; with depth d its gather may overlap the d computes before it
        pos = len(computes) - 1 - plan.prefetch_depth
        deps = ((computes[pos],) if pos >= 0 else ()) + ((after,) if after is not None else ())
        return p.add(
            0,
            "comm.ag",
            "all_gather",
            phase,
            f"{u.name} param all-gather",
            deps,
            group=plan.gather_group,
            bytes=gather_params(u) * plan.weight_bytes,
        )

    def gather_deps(u: Unit, phase: str, after: int | None = None) -> tuple[int, ...]:
        return () if u.index in plan.persistent else (gather(u, phase, after),)

    for mb in range(gas):
        # backward ends by waiting for its reductions (DeepSpeed's independent_gradient_partition_epilogue,
        # FSDP2's post-backward final callback), so the next microbatch starts after them
        sync = reductions[-1] if reductions else None
        for i, u in enumerate(us):
            computes.append(add_forward(p, u, mb, gather_deps(u, "forward", sync if i == 0 else None)))
        reduce = plan.reduce_every_microbatch or mb == gas - 1
        blocking = None
        for u in reversed(us):
            deps = () if u.index in plan.kept_after_forward else gather_deps(u, "backward")
            if blocking is not None:
                deps += (blocking,)
            computes.append(add_backward(p, s, u, mb, deps))
            if not reduce:
                continue
            nbytes = u.params * plan.grad_bytes
            rid = p.add(
                0,
                "comm.rs",
                "reduce_scatter",
                "backward",
                f"{u.name} grad reduce-scatter",
                (computes[-1],),
                group=plan.gather_group,
                bytes=nbytes,
            )
            if plan.replicate_group:
                rid = p.add(
                    0,
                    "comm.rs",
                    "all_reduce",
                    "backward",
                    f"{u.name} grad all-reduce across replicas",
                    (rid,),
                    group=plan.replicate_group,
                    bytes=nbytes / plan.shard_size,
                )
            reductions.append(rid)
            blocking = None if plan.overlap_reduce else rid
    add_optimizer(p, s, sum(u.params for u in us) / plan.shard_size, reductions)
