"""Bandwidth sharing between transfers that overlap in time (a fluid model, as in SimGrid / ASTRA-sim's
analytical network).

A transfer's demand is, per link class, the seconds it needs that class alone. Running transfers get rates by
weighted max-min fairness (progressive filling): all raise their speed, relative to running alone, at the same
pace until a link class is full; transfers crossing a full class stop rising, the others go on. Two equal
transfers on one NIC therefore each take twice as long; a transfer on other links is not slowed.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import simpy

_EPS = 1e-12


class _Transfer:
    __slots__ = ("demand", "alone_s", "event", "remaining", "rate")

    def __init__(self, demand: dict, alone_s: float, event: simpy.Event):
        self.demand = demand
        self.alone_s = alone_s
        self.event = event
        self.remaining = 1.0  # fraction of the transfer still to move
        self.rate = 0.0  # fraction per second


class FluidNetwork:
    def __init__(self, env: simpy.Environment):
        self.env = env
        self.active: list[_Transfer] = []
        self._last = 0.0
        self._generation = 0
        # rates by the running transfers' demands: a program's layers repeat the same overlapping transfers (an
        # FSDP gather beside a reduce-scatter, layer after layer), whose rates depend on nothing else. Keyed by
        # the demand dicts' ids, each kept alive in its entry so that no id is reused while the entry lives.
        self._rates: dict[tuple, tuple[tuple[dict, ...], tuple[float, ...]]] = {}

    def transfer(self, demand: dict, alone: float | None = None) -> simpy.Event:
        """An event that fires when ``demand`` (link class -> seconds alone) has been served; ``alone``, its
        busiest class's seconds, when the caller already knows it."""
        event = self.env.event()
        if alone is None:
            alone = max(demand.values(), default=0.0)
        if alone <= 0:
            return event.succeed()
        self._advance()
        self.active.append(_Transfer(demand, alone, event))
        self._reschedule()
        return event

    def _advance(self) -> None:
        dt = self.env.now - self._last
        if dt > 0:
            for tr in self.active:
                tr.remaining -= tr.rate * dt
        self._last = self.env.now

    def _reschedule(self) -> None:
        active = self.active
        if len(active) == 1:
            active[0].rate = 1.0 / active[0].alone_s
        else:
            key = tuple((id(tr.demand), tr.alone_s) for tr in active)
            hit = self._rates.get(key)
            if hit is None:
                allocate_rates(active)
                self._rates[key] = (tuple(tr.demand for tr in active), tuple(tr.rate for tr in active))
            else:
                for tr, rate in zip(active, hit[1], strict=True):
                    tr.rate = rate
        dt = min(tr.remaining / tr.rate for tr in self.active)
        self._generation += 1
        timer = self.env.timeout(max(dt, 0.0))
        timer.callbacks.append(partial(self._on_timer, self._generation))

    def _on_timer(self, generation: int, _event) -> None:
        if generation != self._generation:  # superseded by a later start or finish
            return
        self._advance()
        still = []
        # done, or so close that its finish time is indistinguishable from now in floating point
        horizon = 1e-12 * max(1.0, self.env.now)
        for tr in self.active:
            if tr.remaining <= 1e-9 or tr.remaining / tr.rate <= horizon:
                tr.event.succeed()
            else:
                still.append(tr)
        self.active = still
        if still:
            self._reschedule()


def allocate_rates(transfers: list[_Transfer]) -> None:
    """Weighted max-min fair rates by progressive filling; each link class has capacity 1 (s per s)."""
    if len(transfers) == 1:
        transfers[0].rate = 1.0 / transfers[0].alone_s
        return
    users: dict = defaultdict(list)
    for j, tr in enumerate(transfers):
        for link, d in tr.demand.items():
            users[link].append((j, d / tr.alone_s))  # capacity used at full (stand-alone) speed
    # A link with one user never binds below that user's stand-alone speed (its use is at most 1): only shared
    # links couple transfers.
    users = {link: js for link, js in users.items() if len(js) > 1}
    cap = dict.fromkeys(users, 1.0)
    level = 0.0
    speed = [0.0] * len(transfers)
    unfrozen = set(range(len(transfers)))
    while unfrozen:
        step = 1.0 - level
        load = {}
        for link, js in users.items():
            w = sum(x for j, x in js if j in unfrozen)
            if w > 0:
                load[link] = w
                step = min(step, cap[link] / w)
        level += step
        full = set()
        for link, w in load.items():
            cap[link] -= step * w
            if cap[link] <= _EPS:
                full.add(link)
        if level >= 1.0 - _EPS:
            frozen = set(unfrozen)
        else:
            frozen = {j for link in full for j, _ in users[link] if j in unfrozen}
        for j in frozen:
            speed[j] = level
        unfrozen -= frozen
    for j, tr in enumerate(transfers):
        tr.rate = speed[j] / tr.alone_s
