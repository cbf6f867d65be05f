"""DeepSpeed ZeRO stages 1, 2 and 3 (Rajbhandari et al. SC20), with DeepSpeed's knobs and defaults.

* Stage 1 partitions optimizer states: gradients are reduce-scattered in ``reduce_bucket_size`` buckets at the
  gradient-accumulation boundary, each rank steps its 1/N, and updated weights are all-gathered in
  ``allgather_bucket_size`` buckets. Volume 2 Psi, as DDP.
* Stage 2 also partitions gradients, so every microbatch reduces its gradients (DeepSpeed's
  ``stage_1_and_2.py`` reduces in the backward hooks).
* Stage 3 partitions weights too: every unit is all-gathered before its forward and, unless it is reused within
  ``stage3_max_reuse_distance`` parameters, again before its backward; gradients are reduce-scattered per unit.
  Volume 3 Psi = 1.5 x DDP for models much larger than the reuse distance (1e9 by default).
``overlap_comm`` (default off for stages 1-2, on for 3) decides whether backward waits for each reduction.
"""

from __future__ import annotations

from simulator.hardware.gpus import GPU
from simulator.scenario.schema import Scenario
from simulator.strategy.common import (
    Unit,
    add_backward,
    add_forward,
    add_optimizer,
    buckets,
    grad_bytes,
    grad_group,
    grad_group_size,
    memory_breakdown,
    model_parallel_size,
    rank_label,
    units,
    weight_bytes,
)
from simulator.strategy.program import Program, RankClass
from simulator.strategy.sharded import ShardingPlan, add_sharded_iteration
from simulator.workload.transformer import Workload


def build(s: Scenario, w: Workload, gpu: GPU) -> Program:
    stage = s.parallelism.zero_stage
    p = Program(f"zero-{stage}")
    us = units(w)
    cfg = s.parallelism.zero
    dp = grad_group_size(s)
    overlap = cfg.overlap_comm if cfg.overlap_comm is not None else stage == 3
    wb, gb = weight_bytes(s), grad_bytes(s)
    persistent: frozenset[int] = frozenset()
    if stage == 3:
        biggest = max(u.params for u in us)
        depth = 1 + min(
            int(cfg.stage3_prefetch_bucket_size // biggest), int(cfg.stage3_max_live_parameters // biggest)
        )
        threshold = cfg.stage3_param_persistence_threshold
        persistent = frozenset(u.index for u in us if _gather_params(w, u) <= threshold)
        kept = _kept_after_forward(us, cfg)
        plan = ShardingPlan(grad_group(s), None, dp, max(1, depth), kept, True, overlap, wb, gb, persistent)
        add_sharded_iteration(p, s, us, plan, lambda u: _gather_params(w, u))
        live = min(cfg.stage3_max_live_parameters, (1 + depth) * biggest)
        buffers = live * wb + cfg.reduce_bucket_size * gb
    else:
        _stage_1_2(p, s, w, us, overlap)
        buffers = cfg.reduce_bucket_size * gb + cfg.allgather_bucket_size * wb
    # persistent units keep a full copy of their weights on every rank
    mem = memory_breakdown(s, w, gpu, dp, stage, buffers, sum(u.params for u in us if u.index in persistent))
    p.ranks.append(RankClass(rank_label(s), s.parallelism.data_parallel * model_parallel_size(s), mem))
    return p


def _kept_after_forward(us: list[Unit], cfg) -> frozenset[int]:
    """Units DeepSpeed does not release after forward: those whose parameters are reused (in backward) within
    ``stage3_max_reuse_distance`` fetched parameters, while all kept fit in ``stage3_max_live_parameters``.
    Between unit i's forward and its backward, every later unit is fetched for forward and again for backward."""
    kept, live, later = set(), 0.0, 0.0
    for u in reversed(us):
        if 2 * later < cfg.stage3_max_reuse_distance and live + u.params <= cfg.stage3_max_live_parameters:
            kept.add(u.index)
            live += u.params
        later += u.params
    return frozenset(kept)


def _gather_params(w: Workload, u: Unit) -> int:
    """The head computes logits with the full output weight even when it is tied to the embedding."""
    return w.head.params if u.name == "head" else u.params


def _stage_1_2(p: Program, s: Scenario, w: Workload, us: list[Unit], overlap: bool) -> None:
    stage, cfg, gas = s.parallelism.zero_stage, s.parallelism.zero, s.gradient_accumulation_steps
    dp = grad_group_size(s)
    gb, wb = grad_bytes(s), weight_bytes(s)
    reductions: list[int] = []
    gathers = (
        buckets([(u.index, u.params * wb) for u in us], cfg.allgather_bucket_size * wb) if dp > 1 else []
    )
    # Megatron-Core --overlap-param-gather: the previous step's updated weights are all-gathered under this
    # iteration's forward (steady state), each unit's first forward waiting only for its own bucket
    ahead = {}
    if s.parallelism.ddp.overlap_param_gather:
        for idx, nbytes in gathers:
            gid = p.add(
                0,
                "comm.dp",
                "all_gather",
                "forward",
                f"param all-gather (units {idx[0]}..{idx[-1]})",
                (),
                group=grad_group(s),
                bytes=nbytes,
            )
            ahead.update(dict.fromkeys(idx, gid))
    for mb in range(gas):
        for u in us:
            add_forward(p, u, mb, (ahead.get(u.index) if mb == 0 else None,))
        reduce = dp > 1 and (stage == 2 or mb == gas - 1)
        plan = (
            buckets([(u.index, u.params * gb) for u in reversed(us)], cfg.reduce_bucket_size * gb)
            if reduce
            else []
        )
        closes = {b[0][-1]: b for b in plan}
        blocking = None
        for u in reversed(us):
            bwd = add_backward(p, s, u, mb, (blocking,))
            blocking = None
            if u.index in closes:
                idx, nbytes = closes[u.index]
                rid = p.add(
                    0,
                    "comm.dp",
                    "reduce_scatter",
                    "backward",
                    f"grad reduce-scatter (units {idx[-1]}..{idx[0]})",
                    (bwd,),
                    group=grad_group(s),
                    bytes=nbytes,
                )
                reductions.append(rid)
                blocking = None if overlap else rid
    opt = add_optimizer(p, s, w.params_per_rank / dp, reductions)
    if not ahead:
        for idx, nbytes in gathers:
            p.add(
                0,
                "comm.dp",
                "all_gather",
                "optimizer",
                f"param all-gather (units {idx[0]}..{idx[-1]})",
                (opt,),
                group=grad_group(s),
                bytes=nbytes,
            )
