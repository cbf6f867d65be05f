"""Megatron-Core's combined 1F1B for MoE (``--overlap-moe-expert-parallel-comm``, core_v0.14.0:
megatron/core/pipeline_parallel/combined_1f1b.py, schedules.py ``forward_backward_pipelining_with_interleaving``):
the interleaved schedule with one more warm-up forward (so that each steady-state forward has a backward to pair
with), and every steady-state forward merged with the backward after it into one step, whose layers then run side
by side: one micro-batch's expert-parallel all-to-alls behind the other's attention and expert compute
(``strategy/pipeline/combined.py``). Megatron requires virtual stages with pipeline parallelism for it."""

from simulator.strategy.schedules import interleaved
from simulator.strategy.schedules.step import Step


def schedule(p: int, m: int, v: int, stage: int) -> list[Step]:
    """The interleaved order with one more warm-up forward (schedules.py: ``num_warmup_microbatches += 1``
    with overlap_moe_expert_parallel_comm)."""
    return [step for task in tasks(p, m, v, stage) for step in task]


def tasks(p: int, m: int, v: int, stage: int) -> list[tuple[Step, ...]]:
    """The steps as tasks: the warm-up forwards and the cool-down backwards one by one, each steady-state
    forward with the backward after it as one combined task (none where the warm-up covers every forward)."""
    steps = interleaved.schedule(p, m, v, stage, extra_warmup=1)
    total = m * v
    warmup = min((p - stage - 1) * 2 + (v - 1) * p + 1, total)
    steady = total - warmup
    out: list[tuple[Step, ...]] = [(x,) for x in steps[:warmup]]
    out += [(steps[warmup + 2 * i], steps[warmup + 2 * i + 1]) for i in range(steady)]
    out += [(x,) for x in steps[warmup + 2 * steady :]]
    return out
