"""Pipeline schedules: each module decides only the ORDER of steps on one stage (``step.py``); the pipeline
core (``strategy/pipeline/``) turns them into tasks and the engine runs them. Adding a schedule is adding a
module here and one line below."""

from __future__ import annotations

from simulator.scenario.schema import DUAL_SCHEDULES, path_stages
from simulator.strategy.schedules import (
    combined_1f1b,
    dualpipe,
    gpipe,
    interleaved,
    one_f_one_b,
    pipedream_2bw,
    zb_h1,
)
from simulator.strategy.schedules.step import Schedule, Step

__all__ = [
    "ASYNCHRONOUS",
    "DUAL",
    "SPLITS_BACKWARD",
    "Schedule",
    "Step",
    "combined_1f1b",
    "get_schedule",
    "route",
]

SCHEDULES: dict[str, Schedule] = {
    "gpipe": gpipe.schedule,
    "1f1b": one_f_one_b.schedule,
    "interleaved-1f1b": interleaved.schedule,
    "zb-h1": zb_h1.schedule,
    "pipedream-2bw": pipedream_2bw.schedule,
    "dualpipe": dualpipe.schedule_of("dualpipe"),
    "dualpipev": dualpipe.schedule_of("dualpipev"),
}
SPLITS_BACKWARD = {"zb-h1"}  # schedules whose B is the input gradient only, with a separate W step
ASYNCHRONOUS = {"pipedream-2bw"}  # schedules that step each stage's optimizer in the order, with no flush
DUAL = set(DUAL_SCHEDULES)  # two chunks a rank on their own paths (dualpipe.py); I steps, F&B tasks


def get_schedule(name: str) -> Schedule:
    return SCHEDULES[name]


def route(name: str, p: int, v: int, stage: int, chunk: int) -> tuple[int, int]:
    """(path, position) of a stage's chunk: which model stage it is on which micro-batches' way through the
    model. Megatron's schedules: one path, chunk c of stage s at c x p + s (interleaving's round robin)."""
    if name in DUAL:
        return dualpipe.position(name, p, stage, chunk)
    return 0, chunk * p + stage


path_length = path_stages  # model stages along one micro-batch's path (scenario/parallelism.py)
