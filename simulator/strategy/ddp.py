"""PyTorch DistributedDataParallel (and DeepSpeed ZeRO stage 0, and a single GPU).

Gradients are all-reduced in buckets of ``bucket_cap_mb`` as backward produces them, on a separate stream,
overlapping the rest of backward (Li et al. VLDB 2020, "PyTorch Distributed", Sec. 3.2). With gradient
accumulation only the last microbatch reduces (``no_sync``). The optimizer step waits for every bucket.
"""

from __future__ import annotations

from simulator.hardware.cluster import Cluster
from simulator.program import Program, RankClass
from simulator.scenario.schema import Scenario
from simulator.strategy.groups import grad_group, grad_group_size, rank_label, ranks_per_stage
from simulator.strategy.memory import memory_breakdown
from simulator.strategy.reduction import buckets, ddp_settings
from simulator.strategy.state_bytes import grad_bytes
from simulator.strategy.steps import add_backward, add_forward, add_optimizer, microbatch_sync, with_setup
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
    for mb in range(gas):
        for u in us:
            first = u is us[0]
            ops = with_setup(w, u.block.forward, setup) if first else None
            add_forward(p, u, mb, ops=ops, sync=first and microbatch_sync(w))
        last = mb == gas - 1 and dp > 1 and reduce_gradients
        plan = buckets([(u.index, u.params * gb) for u in reversed(us)], cap or total) if last else []
        closes = {b[0][-1]: b for b in plan}  # unit index that completes each bucket
        bwd = None
        for u in reversed(us):
            bwd = add_backward(p, s, u, mb)
            if u.index in closes and overlap:
                reductions.append(_all_reduce(p, closes[u.index], bwd, grad_group(s)))
        if last and not overlap:
            reductions += [_all_reduce(p, b, bwd, grad_group(s)) for b in plan]
    if reduce_gradients:
        tensors = parameter_tensors(s, w.num_layers, True, True)
        add_optimizer(p, s, w.params_per_rank, reductions, w=w, tensors=tensors)

    buffers = 2 * min(cap or total, total) if dp > 1 else 0.0  # buckets in flight
    mem = memory_breakdown(s, w, cluster, dp, 0, buffers)
    p.ranks.append(RankClass(rank_label(s), ranks_per_stage(s), mem))
    return p


def _all_reduce(p: Program, bucket: tuple[list[int], float], after: int, group: str) -> int:
    idx, nbytes = bucket
    return p.add(
        0,
        "comm.dp",
        "all_reduce",
        "backward",
        f"grad all-reduce (units {idx[-1]}..{idx[0]})",
        (after,),
        group=group,
        bytes=nbytes,
    )
