"""Task ids of a pipeline's steps: tasks are numbered in order, so a step's id is known before its task exists."""

from __future__ import annotations

from simulator.strategy.schedules import Step


class StepIds:
    """``ids[(stage, kind, microbatch, chunk)]``: the task id of a stage's step."""

    def __init__(self, pos: list[dict[Step, int]]):
        self.pos = pos

    def __getitem__(self, key: tuple) -> int:
        st, *step = key
        return self.pos[st][Step(*step)]
