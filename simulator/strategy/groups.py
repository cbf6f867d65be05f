"""Which ranks a strategy's collectives run over, and how many real ranks one simulated rank stands for."""

from __future__ import annotations

from simulator.hardware.placement import Placement
from simulator.scenario.schema import Scenario


def placement_for(s: Scenario) -> Placement:
    """Where every rank's tensor, context, data and pipeline coordinates put it (``parallelism.rank_order``)."""
    p = s.parallelism
    shard = p.fsdp.hybrid_shard_size if p.fsdp and p.fsdp.hybrid_shard_size else None
    moe = s.model.moe is not None
    return Placement(
        p.tensor_parallel,
        p.context_parallel,
        p.data_parallel,
        p.pipeline_parallel,
        shard,
        p.rank_order,
        p.expert_parallel if moe else 1,
        p.etp if moe else 1,
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


EXPERT_GROUP = "edp"  # expert gradients are reduced (and their states sharded) over expert data parallelism


def expert_grad_group_size(s: Scenario) -> int:
    """Ranks of an expert data-parallel group: a stage's TP x CP x DP ranks over ETP x EP (Megatron-Core folding;
    DeepSpeed's expert-data-parallel group, world / EP, is the same without tensor parallelism)."""
    p = s.parallelism
    if s.model.moe is None:
        return grad_group_size(s)
    return p.tensor_parallel * p.context_parallel * p.data_parallel // (p.etp * p.expert_parallel)
