"""PipeDream-2BW (Narayanan et al., ICML 2021, "Memory-Efficient Pipeline-Parallel DNN Training"): 1F1B without
a pipeline flush. Each stage updates its weights after every m microbatches while the next batch is already in
flight (two weight versions are kept), so in steady state there is no bubble.

The order covers ``BATCHES`` consecutive batches as one 1F1B stream of BATCHES x m microbatches, with an
optimizer step ("O", batch) after the stage's m-th, 2m-th, ... backward; the strategy measures one iteration as
the steady-state period between two of stage 0's steps.
"""

from simulator.strategy.schedules.one_f_one_b import schedule as one_f_one_b
from simulator.strategy.schedules.step import Step

BATCHES = 3


def schedule(p: int, m: int, v: int, stage: int) -> list[Step]:
    steps: list[Step] = []
    done = 0
    for step in one_f_one_b(p, BATCHES * m, 1, stage):
        steps.append(step)
        if step.kind == "B":
            done += 1
            if done % m == 0:
                steps.append(Step("O", done // m - 1))
    return steps
