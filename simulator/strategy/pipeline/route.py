"""Where each stage's chunk sits on a micro-batch's way through the model (``schedules.route``): whom its
forward receives from and sends to, and whether that is another rank (DualPipeV's last rank hands its first
chunk's output to its second chunk without a transfer)."""

from __future__ import annotations

from functools import cached_property

from simulator.strategy.schedules import path_length, route


class Route:
    def __init__(self, schedule: str, pp: int, v: int):
        self.pos = {(st, c): route(schedule, pp, v, st, c) for st in range(pp) for c in range(v)}
        self.owner = {where: key for key, where in self.pos.items()}
        self.length = path_length(schedule, pp, v)

    def upstream(self, st: int, c: int) -> tuple[int, int] | None:
        """The (stage, chunk) whose forward output this chunk's forward takes (None: the model's start)."""
        path, k = self.pos[(st, c)]
        return self.owner[(path, k - 1)] if k > 0 else None

    def downstream(self, st: int, c: int) -> tuple[int, int] | None:
        """The (stage, chunk) this chunk's forward output goes to (None: the model's end)."""
        path, k = self.pos[(st, c)]
        return self.owner[(path, k + 1)] if k < self.length - 1 else None

    def receives(self, st: int, c: int) -> bool:
        """Does the forward receive its input from another rank (and the backward send its gradient back)?"""
        up = self.upstream(st, c)
        return up is not None and up[0] != st

    def sends(self, st: int, c: int) -> bool:
        """Does the forward send its output to another rank (and the backward receive its gradient from it)?"""
        down = self.downstream(st, c)
        return down is not None and down[0] != st

    @cached_property
    def starts(self) -> list[tuple[int, int]]:
        """The chunks holding the model's first stage (the embedding): one per path."""
        return sorted(key for key, (_, k) in self.pos.items() if k == 0)

    @cached_property
    def ends(self) -> list[tuple[int, int]]:
        """The chunks holding the model's last stage (the output layer)."""
        return sorted(key for key, (_, k) in self.pos.items() if k == self.length - 1)
