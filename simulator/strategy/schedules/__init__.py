"""Pipeline schedules: each module decides only the ORDER of steps on one stage (``step.py``); the pipeline
core (``strategy/pipeline/``) turns them into tasks and the engine runs them. Adding a schedule is adding a
module here and one line below."""

from __future__ import annotations

from simulator.strategy.schedules import combined_1f1b, gpipe, interleaved, one_f_one_b, pipedream_2bw, zb_h1
from simulator.strategy.schedules.step import Schedule, Step

__all__ = ["ASYNCHRONOUS", "SPLITS_BACKWARD", "Schedule", "Step", "combined_1f1b", "get_schedule"]

SCHEDULES: dict[str, Schedule] = {
    "gpipe": gpipe.schedule,
    "1f1b": one_f_one_b.schedule,
    "interleaved-1f1b": interleaved.schedule,
    "zb-h1": zb_h1.schedule,
    "pipedream-2bw": pipedream_2bw.schedule,
}
SPLITS_BACKWARD = {"zb-h1"}  # schedules whose B is the input gradient only, with a separate W step
ASYNCHRONOUS = {"pipedream-2bw"}  # schedules that step each stage's optimizer in the order, with no flush


def get_schedule(name: str) -> Schedule:
    return SCHEDULES[name]
