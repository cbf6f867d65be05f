"""PyTorch DistributedDataParallel (and DeepSpeed ZeRO stage 0, and a single GPU).

Gradients are all-reduced in buckets of ``bucket_cap_mb`` as backward produces them, on a separate stream,
overlapping the rest of backward (Li et al. VLDB 2020, "PyTorch Distributed", Sec. 3.2). With gradient
accumulation only the last microbatch reduces (``no_sync``). The optimizer step waits for every bucket.
"""

from __future__ import annotations

from simulator.hardware.cluster import Cluster
from simulator.program import Program, RankClass
from simulator.scenario.schema import Scenario
from simulator.strategy.groups import grad_group_size, rank_label, ranks_per_stage
from simulator.strategy.memory import memory_breakdown
from simulator.strategy.reduction import bucket_copy, buckets, ddp_settings, gradient_sets
from simulator.strategy.state_bytes import grad_bytes
from simulator.strategy.steps import (
    add_backward,
    add_combined,
    add_forward,
    add_optimizer,
    microbatch_order,
    microbatch_sync,
    with_setup,
)
from simulator.strategy.units import parameter_tensors, units
from simulator.workload.transformer import Workload


def build(s: Scenario, w: Workload, cluster: Cluster, reduce_gradients: bool = True) -> Program:
    """``reduce_gradients=False``: forward and backward only, for optimizers that communicate in their step
    (1-bit Adam's compressed phase)."""
    dp, gas = grad_group_size(s), s.gradient_accumulation_steps
    overlap, cap = ddp_settings(s, w)
    p = Program("single-gpu" if dp == 1 else "ddp")
    us = units(w)
    gb = grad_bytes(s, w.framework)
    total = sum(u.params for u in us) * gb
    reductions: list[int] = []
    setup: dict = {}
    sets = gradient_sets(s, us, gb)
    for kind, mb, mb_b in microbatch_order(s):
        if kind == "FB":  # combined 1F1B: never the last micro-batch's backward, which reduces
            add_combined(p, s, us, mb, mb_b, with_setup(w, us[0].block.forward, setup))
            continue
        if kind == "F":
            for u in us:
                first = u is us[0]
                ops = with_setup(w, u.block.forward, setup) if first else None
                add_forward(p, u, mb, ops=ops, sync=first and microbatch_sync(w))
            continue
        last = mb == gas - 1 and reduce_gradients
        plans = [(what, group, buckets(sizes, cap or total)) for what, group, sizes in sets] if last else []
        closes: dict[int, list] = {}  # unit index that completes each bucket
        for what, group, plan in plans:
            for b in plan:
                closes.setdefault(b[0][-1], []).append((what, group, b))
        bwd = None
        for u in reversed(us):
            bwd = add_backward(p, s, u, mb)
            if overlap:
                reductions += [
                    _all_reduce(p, b, bwd, group, what) for what, group, b in closes.get(u.index, ())
                ]
        if last and not overlap:
            reductions += [_all_reduce(p, b, bwd, group, what) for what, group, plan in plans for b in plan]
    if reduce_gradients:
        tensors = parameter_tensors(s, w.num_layers, True, True)
        params = w.params_per_rank + w.expert_params_per_rank
        add_optimizer(p, s, params, reductions, w=w, tensors=tensors)

    # PyTorch DDP's bucket storage (a copy of every gradient), else the buckets in flight
    buffers = (total if bucket_copy(s, w) else 2 * min(cap or total, total)) if dp > 1 else 0.0
    mem = memory_breakdown(s, w, cluster, dp, 0, buffers)
    p.ranks.append(RankClass(rank_label(s), ranks_per_stage(s), mem))
    return p


def _all_reduce(
    p: Program, bucket: tuple[list[int], float], after: int, group: str, what: str = "grad"
) -> int:
    idx, nbytes = bucket
    return p.add(
        0,
        "comm.dp",
        "all_reduce",
        "backward",
        f"{what} all-reduce (units {idx[-1]}..{idx[0]})",
        (after,),
        group=group,
        bytes=nbytes,
    )
