"""A step of a pipeline schedule: (kind, microbatch, chunk). ``F`` forward, ``B`` backward (input and weight
gradients, or only the input gradient in schedules that split it), ``W`` weight gradient, ``O`` an optimizer step
of an asynchronous schedule (its "microbatch" is the batch number). ``chunk`` is the virtual stage (model chunk)
of interleaved schedules, 0 otherwise."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class Step(NamedTuple):
    kind: str  # F | B | W | O
    microbatch: int
    chunk: int = 0


Schedule = Callable[[int, int, int, int], list[Step]]  # (stages p, microbatches m, chunks v, stage) -> steps
