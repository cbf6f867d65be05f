"""Replays a program: one SimPy process per (rank, stream), tasks in order, each waiting for its dependencies.

The engine knows tasks, streams and dependencies, nothing of ZeRO or pipelines. It asks two cost functions
how long a compute task takes and which phases (latency + link demand) a collective has, and lets
:class:`FluidNetwork` share links between collectives that overlap.
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
    # a task's completion event exists only once someone waits for it; ``finished`` says whether it ran
    done: list = [None] * len(tasks)
    finished = [False] * len(tasks)
    timeline = Timeline(program, len(tasks))
    streams: dict[tuple[int, str], list[Task]] = defaultdict(list)
    for t in tasks:
        streams[(t.rank, t.stream)].append(t)

    free, start, end, blocker, parts_of = (
        timeline.free,
        timeline.start,
        timeline.end,
        timeline.blocker,
        timeline.parts,
    )
    timeout = env.timeout

    # A compute task's end is fixed once it is scheduled (no link sharing), so a task that depends only on
    # scheduled or finished compute tasks needs no wake-up of its own: one timeout covers the wait and the run.
    planned = end  # for compute tasks: the end time as soon as the task is scheduled

    def run_stream(queue: list[Task]):
        for t in queue:
            free_at = now = env.now
            ready = now  # when the dependencies with a known end are done
            deps = t.deps
            if deps:
                pending = []
                for d in deps:
                    if finished[d]:
                        continue
                    if planned[d] > 0.0 and tasks[d].group is None:
                        if planned[d] > ready:
                            ready = planned[d]
                        continue
                    if done[d] is None:
                        done[d] = env.event()
                    pending.append(done[d])
                if len(pending) == 1:
                    yield pending[0]
                elif pending:
                    yield env.all_of(pending)
                now = env.now
                if ready < now:
                    ready = now
                if ready > free_at:  # the stream sat idle: remember which dependency held it
                    blocker[t.id] = max(deps, key=end.__getitem__)
            if t.group is not None:
                if ready > now:
                    yield timeout(ready - now)
                began = env.now
                for phase in collective_phases(t):
                    if phase.latency_s > 0:
                        yield timeout(phase.latency_s)
                    if phase.demand_s:
                        yield net.transfer(phase.demand_s, phase.busiest_s)
            else:
                seconds, parts = task_duration(t)
                i = t.id
                if parts:
                    parts_of[i] = parts
                began = ready
                delay = ready + seconds - now
                planned[i] = now + delay  # exactly the time SimPy will fire the timeout at
                ev = timeout(delay)
                if done[i] is None:  # nobody waits yet: whoever comes later waits on the timeout itself
                    done[i] = ev
                    yield ev
                    free[i], start[i] = free_at, began
                    finished[i] = True
                    continue
                yield ev
                free[i], start[i] = free_at, began
                finished[i] = True
                done[i].succeed()
                continue
            i = t.id
            free[i], start[i], end[i] = free_at, began, env.now
            finished[i] = True
            if done[i] is not None:
                done[i].succeed()

    for queue in streams.values():
        env.process(run_stream(queue))
    env.run()
    stuck = [t for t in tasks if not finished[t.id]]
    if stuck:
        t = stuck[0]
        raise DeadlockError(
            f"{len(stuck)} tasks never ran; first: '{t.name}' on {t.stream} waiting for {t.deps}"
        )
    timeline.events = next(env._eid)  # SimPy numbers every scheduled event; the next number is the count
    return timeline
