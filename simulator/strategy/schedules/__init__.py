"""Pipeline schedules: each module decides only the ORDER of steps on one stage; the engine runs them.

A step is (kind, microbatch, chunk): ``F`` forward, ``B`` backward (input and weight gradients, or only the
input gradient in schedules that split it), ``W`` weight gradient, ``O`` an optimizer step of an asynchronous
schedule (its "microbatch" is the batch number). ``chunk`` is the virtual stage (model chunk)
of interleaved schedules, 0 otherwise. Adding a schedule is adding a module here and one line below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class Step(NamedTuple):
    kind: str  # F | B | W
    microbatch: int
    chunk: int = 0


Schedule = Callable[[int, int, int, int], list[Step]]  # (stages p, microbatches m, chunks v, stage) -> steps


def get_schedule(name: str) -> Schedule:
    from simulator.strategy.schedules import gpipe, interleaved, one_f_one_b, pipedream_2bw, zb_h1

    return {
        "gpipe": gpipe.schedule,
        "1f1b": one_f_one_b.schedule,
        "interleaved-1f1b": interleaved.schedule,
        "zb-h1": zb_h1.schedule,
        "pipedream-2bw": pipedream_2bw.schedule,
    }[name]


SPLITS_BACKWARD = {"zb-h1"}  # schedules whose B is the input gradient only, with a separate W step
ASYNCHRONOUS = {"pipedream-2bw"}  # schedules that step each stage's optimizer in the order, with no flush
