"""GPipe (Huang et al. 2019): all forwards, then all backwards; every microbatch's activations live at once."""

from simulator.strategy.schedules.step import Step


def schedule(p: int, m: int, v: int, stage: int) -> list[Step]:
    return [Step("F", i) for i in range(m)] + [Step("B", i) for i in range(m)]
