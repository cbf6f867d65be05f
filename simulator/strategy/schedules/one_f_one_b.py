"""1F1B / PipeDream-Flush (Narayanan et al. 2021, as Megatron-LM's ``forward_backward_pipelining_without_
interleaving`` and DeepSpeed's pipeline engine): p - stage - 1 warm-up forwards, then one forward and one backward
alternately, then the remaining backwards. At most p - stage microbatches are in flight on a stage."""

from simulator.strategy.schedules.step import Step


def schedule(p: int, m: int, v: int, stage: int) -> list[Step]:
    warmup = min(p - stage - 1, m)
    steps = [Step("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        steps += [Step("F", warmup + i), Step("B", i)]
    steps += [Step("B", i) for i in range(m - warmup, m)]
    return steps
