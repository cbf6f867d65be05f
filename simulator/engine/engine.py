"""Replays a program: every (rank, stream) runs its tasks in order, each once its dependencies are done.

The engine knows tasks, streams and dependencies, nothing of ZeRO or pipelines. It asks two cost functions
how long a compute task takes and which phases (latency + link demand) a collective has, and lets
:class:`FluidNetwork` share links between collectives that overlap.

Two kinds of streams, one timeline:

* Communication streams (collectives, host copies, the CPU optimizer step) are SimPy processes: their
  durations depend on what else is on the links at the same moment, so they must run in simulated time.
* Compute streams need no clock of their own. A compute task's duration is fixed (its blocking collectives are
  costed alone), so its start is max(its stream's previous end, its dependencies' ends) as soon as those are
  known, which is the DES answer computed without an event per task (conservative lookahead). The engine plans
  compute tasks the moment they become plannable, from any point of the SimPy run, and wakes the communication
  processes that wait for them. A 3,072-GPU pipeline of 65k steps is planned in well under a second; only its
  collectives are SimPy events.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import simpy

from simulator.engine.network import FluidNetwork
from simulator.strategy.program import Program, Task
from simulator.timeline.timeline import Part, Timeline


class DeadlockError(RuntimeError):
    pass


def simulate_program(
    program: Program,
    task_duration: Callable[[Task], tuple[float, tuple[Part, ...]]],
    collective_phases: Callable[[Task], Sequence],
) -> Timeline:
    """``task_duration(task)`` gives a compute task's seconds and, optionally, its parts (compute segments and
    blocking collectives inside it) for the timeline; ``collective_phases(task)`` a collective's phases."""
    env = simpy.Environment()
    net = FluidNetwork(env)
    tasks = program.tasks
    n = len(tasks)
    known = [False] * n  # the task's end is known: compute once planned, communication once finished
    announce: list = [None] * n  # SimPy event fired when the task's end becomes known (made on demand)
    blocked_on: dict[int, list[list]] = defaultdict(list)  # task -> compute streams whose next task needs it
    timeline = Timeline(program, n)
    free, start, end, blocker, parts_of = (
        timeline.free,
        timeline.start,
        timeline.end,
        timeline.blocker,
        timeline.parts,
    )
    streams: dict[tuple[int, str], list[Task]] = defaultdict(list)
    for t in tasks:
        streams[(t.rank, t.stream)].append(t)

    def became_known(i: int, ready: list) -> None:
        known[i] = True
        ev = announce[i]
        if ev is not None:
            ev.succeed()
        waiting = blocked_on.pop(i, None)
        if waiting:
            ready.extend(waiting)

    def plan(stream: list) -> None:
        """Plan compute streams as far as their dependencies allow; ``stream`` = [tasks, next index, clock]."""
        work = [stream]
        while work:
            s = work.pop()
            queue, k, clock = s
            while k < len(queue):
                t = queue[k]
                begin = clock
                missing = -1
                for d in t.deps:
                    if not known[d]:
                        missing = d
                        break
                    if end[d] > begin:
                        begin = end[d]
                if missing >= 0:
                    blocked_on[missing].append(s)
                    break
                i = t.id
                seconds, parts = task_duration(t)
                if parts:
                    parts_of[i] = parts
                if begin > clock:  # the stream sat idle: remember which dependency held it
                    blocker[i] = max(t.deps, key=end.__getitem__)
                free[i] = clock
                start[i] = begin
                end[i] = clock = begin + seconds
                k += 1
                if announce[i] is None and i not in blocked_on:
                    known[i] = True  # nobody waits for it yet
                else:
                    became_known(i, work)
            s[1], s[2] = k, clock

    def run_stream(queue: list[Task]):
        clock = 0.0
        for t in queue:
            deps = t.deps
            if deps:
                pending = []
                for d in deps:
                    if not known[d]:
                        if announce[d] is None:
                            announce[d] = env.event()
                        pending.append(announce[d])
                if len(pending) == 1:
                    yield pending[0]
                elif pending:
                    yield env.all_of(pending)
            # dependencies may end later than now (compute planned ahead): wait until they have
            ready = max((end[d] for d in deps), default=0.0)
            if ready > env.now:
                yield env.timeout(ready - env.now)
            i = t.id
            free[i], start[i] = clock, env.now
            if start[i] > clock and deps:
                blocker[i] = max(deps, key=end.__getitem__)
            if t.group is None:  # a compute task on a stream that also communicates
                seconds, parts = task_duration(t)
                if parts:
                    parts_of[i] = parts
                yield env.timeout(seconds)
            for phase in collective_phases(t) if t.group is not None else ():
                if phase.latency_s > 0:
                    yield env.timeout(phase.latency_s)
                if phase.demand_s:
                    yield net.transfer(phase.demand_s, phase.busiest_s)
            end[i] = clock = env.now
            woken: list = []
            became_known(i, woken)
            for s in woken:
                plan(s)

    compute_streams = []
    for queue in streams.values():
        if all(t.group is None for t in queue):
            compute_streams.append([queue, 0, 0.0])
        else:
            env.process(run_stream(queue))
    for s in compute_streams:
        plan(s)
    env.run()
    stuck = [t for t in tasks if not known[t.id]]
    if stuck:
        t = stuck[0]
        raise DeadlockError(
            f"{len(stuck)} tasks never ran; first: '{t.name}' on {t.stream} waiting for {t.deps}"
        )
    timeline.events = next(env._eid)  # SimPy numbers every scheduled event; the next number is the count
    return timeline
