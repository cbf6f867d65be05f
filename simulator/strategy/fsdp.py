"""PyTorch FSDP2 (``fully_shard`` on every transformer block) and HSDP (``hybrid_shard_size``).

Forward all-gathers each block on the all-gather stream, one block ahead (implicit prefetch, PyTorch "FSDP
Notes: prefetch nuances"); with ``reshard_after_forward`` the block is freed and re-gathered in backward (with
``backward_prefetch`` one block ahead). Gradients are reduce-scattered per block on their own stream and, for
HSDP, all-reduced across replicas. Gradient accumulation reduces every microbatch (FSDP2's default).
"""

from __future__ import annotations

from simulator.hardware.cluster import Cluster
from simulator.program import Program, RankClass
from simulator.scenario.schema import Scenario
from simulator.strategy.groups import grad_group, grad_group_size, ranks_per_stage
from simulator.strategy.memory import memory_breakdown
from simulator.strategy.sharded import ShardingPlan, add_sharded_iteration
from simulator.strategy.state_bytes import fsdp_reduce_bytes, gather_bytes, grad_bytes, weight_bytes
from simulator.strategy.units import units
from simulator.workload.transformer import Workload


def build(s: Scenario, w: Workload, cluster: Cluster) -> Program:
    cfg = s.parallelism.fsdp
    dp = grad_group_size(s)
    shard = (cfg.hybrid_shard_size or s.parallelism.data_parallel) * s.parallelism.context_parallel
    hybrid = shard < dp
    p = Program("hsdp" if hybrid else w.framework.fsdp_name)
    us = units(w)
    wb, gb = weight_bytes(s), grad_bytes(s)
    reduce_b = fsdp_reduce_bytes(s, w.framework)  # on the wire: torchtitan reduces in fp32
    plan = ShardingPlan(
        gather_group=grad_group(s, "dp_shard") if hybrid else grad_group(s),
        replicate_group="dp_replicate" if hybrid else None,
        shard_size=shard,
        prefetch_depth=2 if cfg.backward_prefetch else 1,
        kept_after_forward=frozenset() if cfg.reshard_after_forward else frozenset(u.index for u in us),
        reduce_every_microbatch=True,
        overlap_reduce=True,
        weight_bytes=gather_bytes(
            s, w
        ),  # FSDP2 float8 all-gather: the FP8 layers' shards cast and sent in FP8
        grad_bytes=reduce_b,
        unsharded_grad_bytes=gb,
        copies=w.framework.fsdp_copies,
    )
    add_sharded_iteration(p, s, w, us, plan)

    block = w.layer.params
    if cfg.reshard_after_forward:
        buffers = 2 * block * wb + block * gb  # current + prefetched block, one block's unsharded gradients
    else:
        buffers = w.params_per_rank * wb + block * gb  # every block stays unsharded from forward to backward
    # when the loss runs the step's sharded gradients are not allocated (zero_grad's set_to_none, torch's default
    # since 2.0, freed the last ones; with one micro-batch none is reduced yet), and of the buffers only the
    # unsharded parameters the forward leaves: the last block's (it is not resharded: torchtitan apply_fsdp), or
    # every block's without resharding
    at_loss = block * wb if cfg.reshard_after_forward else w.params_per_rank * wb
    mem = memory_breakdown(
        s,
        w,
        cluster,
        shard,
        3,
        buffers,
        grads_at_loss=s.gradient_accumulation_steps > 1,
        buffers_at_loss=min(at_loss, buffers),
    )
    label = f"all {dp} ranks ({dp // shard} replicas x {shard} shards)" if hybrid else f"all {dp} ranks"
    p.ranks.append(RankClass(label, ranks_per_stage(s), mem))
    return p
