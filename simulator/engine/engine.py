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

Each rank's compute stream is fed by one host thread (eager PyTorch issues every kernel from Python). A kernel
can start only once the GPU is free *and* the host has issued it, so a task's end is

    end = max(begin + gpu_s, host + span_s)      host afterwards = host + host_s

where ``begin`` is when the GPU could start it (stream free, dependencies done), ``host`` when the host thread
starts issuing it, and ``span_s`` = max over its kernels i of (host time to issue kernels 1..i + GPU time of
kernels i..n): exact for a host that issues kernels back to back, in O(1) per task. When kernels are long the
host runs ahead and ``begin + gpu_s`` wins; when they are short the host sets the pace. A ``sync`` task makes
the host wait for the GPU and the task's dependencies first (a blocking receive, ``.item()``).

Communication that a framework's hooks issue from that host thread (DeepSpeed ZeRO-3's fetches) names the compute
task after whose issue the host reaches the hook (``Task.issued_after``) and starts no earlier than the host clock
at that point: where the host runs far ahead of the GPU such calls go out early; where it keeps stopping for the
GPU (syncs) they go out as the GPU gets there. A compute task's ``host_waits`` block its host thread until those
tasks end (an event synchronised on another stream) before it issues the task's kernels.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import NamedTuple

from simulator.engine.network import FluidNetwork
from simulator.program import Program, Task
from simulator.timeline.timeline import Part, Timeline


class DeadlockError(RuntimeError):
    pass


class TaskCost(NamedTuple):
    """What the engine needs to know of a compute task: its GPU time (kernels and the blocking collectives
    inside it), its parts for the timeline, and how its host thread issues it. Host fields are zero without a
    host model.

    A task whose host thread synchronises with the GPU part-way (``torch.tensor(x, device=...)``, ``.item()``)
    is split there into segments. For the first segment: ``first_s`` GPU seconds, ``host_s`` host seconds to
    issue it, ``span_s`` from its first issue to its last kernel's end when the GPU never waits for anything
    else, ``lead_s`` from its first issue to its first kernel's earliest start. The segments after a sync start
    with the GPU idle and the host ready, so they take a fixed ``then_s`` (their spans plus the syncs'
    latencies); the host finishes issuing ``slack_s`` before the task's end."""

    seconds: float
    parts: tuple[Part, ...] = ()
    host_s: float = 0.0
    span_s: float = 0.0
    lead_s: float = 0.0
    first_s: float = 0.0
    then_s: float = 0.0
    slack_s: float = 0.0


def simulate_program(
    program: Program,
    task_duration: Callable[[Task], TaskCost | tuple],
    collective_phases: Callable[[Task], Sequence],
) -> Timeline:
    """``task_duration(task)`` gives a compute task's :class:`TaskCost` (or just ``(seconds, parts)``: no host
    model); ``collective_phases(task)`` a collective's phases."""
    # imported at the first simulation, not with the package: simpy reads its own version through
    # importlib.metadata at import (simpy/__init__.py, 4.1.2), 8 ms that a command which only checks a file,
    # lists scenarios or prints help never needs
    import simpy

    env = simpy.Environment()
    net = FluidNetwork(env)
    tasks = program.tasks
    n = len(tasks)
    known = [False] * n  # the task's end is known: compute once planned, communication once finished
    announce: list = [None] * n  # SimPy event fired when the task's end becomes known (made on demand)
    blocked_on: dict[int, list[list]] = defaultdict(list)  # task -> compute streams whose next task needs it
    timeline = Timeline(program, n)
    free, start, end, blocker, parts_of, host_idle, busy, issued = (
        timeline.free,
        timeline.start,
        timeline.end,
        timeline.blocker,
        timeline.parts,
        timeline.host_idle,
        timeline.busy,
        timeline.issued,
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
        """Plan compute streams as far as their dependencies allow; ``stream`` = [tasks, next index, GPU clock,
        host clock]."""
        work = [stream]
        while work:
            s = work.pop()
            queue, k, clock, host = s
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
                for d in t.host_waits:
                    if not known[d]:
                        missing = d
                        break
                if missing >= 0:
                    blocked_on[missing].append(s)
                    break
                i = t.id
                cost = task_duration(t)
                seconds, parts = cost[0], cost[1]
                if parts:
                    parts_of[i] = parts
                if begin > clock:  # the stream sat idle: remember which dependency held it
                    blocker[i] = max(t.deps, key=end.__getitem__)
                free[i] = clock
                for d in t.host_waits:  # the host blocks on another stream's event first
                    if end[d] > host:
                        host = end[d]
                if len(cost) > 2 and cost[3] > 0.0:  # a host thread issues the kernels
                    if t.sync and begin > host:
                        host = begin
                    first = host + cost[4]
                    start[i] = first if first > begin else begin
                    finish = begin + cost[5]  # the first segment: the GPU's pace or the host's
                    if host + cost[3] > finish:
                        finish = host + cost[3]
                    if cost[6]:  # segments after a sync inside the task
                        finish += cost[6]
                        host = finish - cost[7]
                    else:
                        host += cost[2]
                    host_idle[i] = finish - begin - seconds
                    busy[i] = seconds
                    end[i] = clock = finish
                    issued[i] = host
                else:  # an infinitely fast host: it issues the task the moment it is free to
                    if host > begin:
                        begin = host
                    start[i] = begin
                    busy[i] = seconds
                    end[i] = clock = begin + seconds
                    issued[i] = host
                k += 1
                if announce[i] is None and i not in blocked_on:
                    known[i] = True  # nobody waits for it yet
                else:
                    became_known(i, work)
            s[1], s[2], s[3] = k, clock, host

    def run_stream(queue: list[Task]):
        clock = 0.0
        for t in queue:
            deps = t.deps
            waits = (*deps, t.issued_after) if t.issued_after >= 0 else deps  # the issuing task planned first
            if waits:
                pending = []
                for d in waits:
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
            hold = -1  # the issuing task, when the host's pace is what holds this one back
            if t.issued_after >= 0 and issued[t.issued_after] > ready:
                ready, hold = issued[t.issued_after], t.issued_after
            i = t.id
            now = env.now
            begin = ready if ready > now else now
            free[i], start[i] = clock, begin
            if begin > clock and waits:
                blocker[i] = hold if hold >= 0 or not deps else max(deps, key=end.__getitem__)
            if t.group is None:  # a compute task on a stream that also communicates (no host model)
                seconds, parts = task_duration(t)[:2]
                if parts:
                    parts_of[i] = parts
                yield env.timeout(begin - now + seconds)
            else:
                # the wait for the dependencies and the first phase's latency in one event (one SimPy step less
                # per collective: thousands a ZeRO-3 or FSDP iteration)
                wait = begin - now
                for phase in collective_phases(t):
                    if phase.latency_s > 0 or wait > 0:
                        yield env.timeout(wait + phase.latency_s)
                        wait = 0.0
                    if phase.demand_s:
                        yield net.transfer(phase.demand_s, phase.busiest_s)
                if wait > 0:  # no phases
                    yield env.timeout(wait)
            end[i] = clock = env.now
            woken: list = []
            became_known(i, woken)
            for s in woken:
                plan(s)

    compute_streams = []
    for queue in streams.values():
        if all(t.group is None for t in queue):
            compute_streams.append([queue, 0, 0.0, 0.0])
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
