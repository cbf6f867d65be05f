"""Megatron-LM's pipeline schedules with tensor and data parallelism (Narayanan et al. SC21), and the
same schedules under Megatron-DeepSpeed with ZeRO-1 and under torch.distributed.pipelining with FSDP2.

One simulated rank per pipeline stage stands for its TP x CP x DP ranks. A stage runs the steps of the chosen
schedule (``schedules/``): a forward or backward step is one compute task over the layers of a model chunk,
with the chunk's tensor-parallel collectives and the send to the neighbouring stage as blocking parts (Megatron
waits for its p2p transfers). The next stage's step depends on it. Embedding on the first stage, output layer and
loss on the last: their imbalance shows in the timeline. The iteration ends as ``pipeline/flush.py`` describes.
With FSDP2 the stage's memory is ZeRO-1's: 16-bit parameters and gradients whole, optimizer states sharded.
"""

from __future__ import annotations

from simulator.hardware.cluster import Cluster
from simulator.program import Program, RankClass
from simulator.scenario.schema import Scenario
from simulator.strategy.groups import ranks_per_stage
from simulator.strategy.pipeline.chunk_ops import chunk_pieces, ops_of, send_bytes
from simulator.strategy.pipeline.combined import combined_ops
from simulator.strategy.pipeline.flush import flush_and_step, reduce_per_batch
from simulator.strategy.pipeline.memory import stage_memory
from simulator.strategy.pipeline.partition import check, chunk_units, stage_label
from simulator.strategy.pipeline.route import Route
from simulator.strategy.pipeline.step_ids import StepIds
from simulator.strategy.schedules import (
    ASYNCHRONOUS,
    DUAL,
    SPLITS_BACKWARD,
    Step,
    combined_1f1b,
    dualpipe,
    get_schedule,
)
from simulator.strategy.steps import add_optimizer, overlaps_a2a
from simulator.strategy.units import unit_tensors
from simulator.workload.ops import collective_op
from simulator.workload.transformer import Workload


def p2p_overlapped(s: Scenario, w: Workload) -> bool:
    """Do pipeline sends run beside compute? Megatron-Core's --overlap-p2p-communication, which its interleaved
    schedule uses (megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving:
    ``config.overlap_p2p_comm``; p2p_communication.py posts isend / irecv and waits only before the step that needs
    the data); the scenario's setting, else the framework profile's."""
    par = s.parallelism
    return overlaps_p2p(
        par.overlap_p2p_comm, w.framework.overlap_p2p, par.pipeline_parallel, par.pipeline_schedule
    )


def overlaps_p2p(setting: bool | None, profile: bool, pp: int, schedule: str) -> bool:
    """``p2p_overlapped`` for a pipeline of ``pp`` stages run by ``schedule`` (the planner's layouts)."""
    if pp == 1 or schedule != "interleaved-1f1b":
        return False
    return profile if setting is None else setting


def sends_output(step: Step, st: int, route: Route) -> bool:
    """Does this step send to another stage (the last stage's last chunk's forward and the first stage's first
    chunk's backward feed nobody; W steps send nothing)?"""
    kind, _, c = step
    if kind == "F":
        return route.sends(st, c)
    if kind in ("B", "I"):
        return route.receives(st, c)
    return False


def build(s: Scenario, w: Workload, cluster: Cluster) -> Program:
    check(s)
    par = s.parallelism
    pp, v = par.pipeline_parallel, par.virtual_pipeline_stages
    m = s.gradient_accumulation_steps
    split = par.pipeline_schedule in SPLITS_BACKWARD
    # Megatron-Core's combined 1F1B (MoE all-to-alls behind another micro-batch's compute): a forward and the
    # backward after it in the steady state are one task
    combined = overlaps_a2a(s)
    dual = par.pipeline_schedule in DUAL
    if dual:  # DualPipe / DualPipeV: their own tasks, a forward beside a backward as one
        tasks = {st: list(dualpipe.tasks(par.pipeline_schedule, pp, m, st)) for st in range(pp)}
        order = {st: [x for task in tasks[st] for x in task] for st in range(pp)}
    elif combined:
        tasks = {st: combined_1f1b.tasks(pp, m, v, st) for st in range(pp)}
        order = {st: [x for task in tasks[st] for x in task] for st in range(pp)}
    else:
        order = {st: get_schedule(par.pipeline_schedule)(pp, m, v, st) for st in range(pp)}
        tasks = {st: [(x,) for x in order[st]] for st in range(pp)}
    chunks = chunk_units(w, pp, v)
    route = Route(par.pipeline_schedule, pp, v)
    overlap_p2p = p2p_overlapped(s, w)
    pieces = {
        key: chunk_pieces(s, w, us, key, pp, v, not overlap_p2p, (route.receives(*key), route.sends(*key)))
        for key, us in chunks.items()
    }
    ops = {key: ops_of(p, split) for key, p in pieces.items()}
    # DualPipe's zero-bubble backwards (I) leave their weight gradients to a later W step
    split_ops = {key: ops_of(p, True) for key, p in pieces.items()} if dual else ops

    sharding = " + fsdp" if par.fsdp else (f" + zero-{par.zero_stage}" if par.zero_stage else "")
    prog = Program(f"megatron {par.pipeline_schedule}{sharding}")
    # ids are sequential, so a step's id is known before its task exists; pos[st][step] is that id
    pos: list[dict[Step, int]] = []
    n = 0
    for st in range(pp):
        pos.append({step: n + i for i, steps in enumerate(tasks[st]) for step in steps})
        n += len(tasks[st])
    ids = StepIds(pos)
    # with overlapped p2p every step's send is a task of its own on the stage's p2p stream, numbered after the
    # compute tasks (in the same order), and the receiving step waits for that send
    sends: dict[tuple[int, Step], int] = {}
    if overlap_p2p:
        for st in range(pp):
            for step in order[st]:
                if sends_output(step, st, route):
                    sends[(st, step)] = n + len(sends)

    def upstream(st: int, step: Step) -> tuple[int, ...]:
        """The step on the neighbouring stage whose output this step receives (none for W): the same step one
        stage up (F) or down (B), or across the chunk boundary between the last and the first stage (its send,
        where sends are tasks of their own)."""
        kind, mb, c = step
        if kind == "F":
            key, kinds = route.upstream(st, c), ("F",)
        elif kind in ("B", "I"):
            key, kinds = route.downstream(st, c), ("B", "I")
        else:
            return ()
        if key is None:
            return ()
        for k in kinds:
            # a plain tuple finds the Step keys (a named tuple hashes and compares as its fields), unbuilt
            src = (key[0], (k, mb, key[1]))
            i = sends.get(src) if overlap_p2p else pos[src[0]].get(src[1])
            if i is not None:
                return (i,)
        return ()

    stage_params = [sum(u.params for c in range(v) for u in chunks[(st, c)]) for st in range(pp)]
    stage_tensors = [unit_tensors(s, [u for c in range(v) for u in chunks[(st, c)]]) for st in range(pp)]
    names: dict[Step, str] = {}  # every stage runs the same steps: one name string per step
    joined_ops: dict[tuple[int, int, int], tuple] = {}
    add = prog.add_compute
    # where the host thread waits for the GPU: at every pipeline send / receive (Megatron synchronizes after
    # its batched p2p: megatron/core/pipeline_parallel/p2p_communication.py, _communicate), and at each
    # forward's input broadcast (get_batch)
    host = w.framework.host
    sync_steps = host.syncs.p2p and pp > 1 and not overlap_p2p  # overlapped p2p does not batch-and-sync
    sync_forward = sync_steps or host.syncs.microbatch
    for st in range(pp):
        # (ops, phase) of each step kind, per chunk
        work = [
            {
                "F": (ops[(st, c)][0], "forward"),
                "B": (ops[(st, c)][1], "backward"),
                "I": (split_ops[(st, c)][1], "backward"),
                "W": (split_ops[(st, c)][2], "backward"),
            }
            for c in range(v)
        ]
        for steps in tasks[st]:
            if len(steps) == 2:  # combined 1F1B: this forward and that backward as one task
                f, b = steps
                for x in steps:
                    names.setdefault(
                        x, f"{x.kind}{x.microbatch}.{x.chunk}" if v > 1 else f"{x.kind}{x.microbatch}"
                    )
                pair = (st, f.chunk, b.chunk)  # one op tuple per chunk pair: its cost is computed once
                # merged in Megatron-Core's windows; DualPipe without the a2a overlap: the forward, then the backward
                if pair not in joined_ops:
                    joined_ops[pair] = (
                        combined_ops(pieces[(st, f.chunk)][0], pieces[(st, b.chunk)][1])
                        if combined
                        else ops[(st, f.chunk)][0] + ops[(st, b.chunk)][1]
                    )
                joined = joined_ops[pair]
                deps = upstream(st, f) + upstream(st, b)
                add(
                    st,
                    "backward",
                    "backward",
                    f"{names[f]}+{names[b]}",
                    deps,
                    joined,
                    f.microbatch,
                    sync_forward,
                )
                continue
            step = steps[0]
            kind, mb, c = step
            if kind == "O":
                # asynchronous schedule: this stage steps its optimizer now, no flush, no global sync
                add_optimizer(prog, s, stage_params[st], (), rank=st, w=w, tensors=stage_tensors[st])
                continue
            task_ops, phase = work[c][kind]
            name = names.get(step)
            if name is None:
                name = names[step] = f"{kind}{mb}.{c}" if v > 1 else f"{kind}{mb}"
            sync = sync_forward if kind == "F" else sync_steps
            add(st, phase, phase, name, upstream(st, step), task_ops, mb, sync)
    last_compute = [ids[(st, *order[st][-1])] for st in range(pp)]
    # each send costed alone (pipeline neighbours use their own links), on the stage's p2p stream
    send_op = (collective_op("pipeline send", "send_recv", "pp", send_bytes(s)),)
    for (st, step), sid in sends.items():  # the same order as numbered above
        kind, mb, c = step
        phase = "forward" if kind == "F" else "backward"
        name = f"send {names[step]}"
        added = prog.add(st, "p2p", "send_recv", phase, name, (ids[(st, *step)],), ops=send_op, microbatch=mb)
        if added != sid:
            raise RuntimeError(f"send task numbered {added}, expected {sid}")

    asynchronous = par.pipeline_schedule in ASYNCHRONOUS
    if asynchronous:
        reduce_per_batch(prog, s, w, order, ids, stage_params)
        # one iteration = the steady-state period between stage 0's first and second weight updates
        prog.window = (ids[(0, "O", 0, 0)], ids[(0, "O", 1, 0)])
    else:
        flush_and_step(prog, s, w, order, ids, chunks, stage_params, stage_tensors, last_compute)
    for st in range(pp):
        mine = [u for c in range(v) for u in chunks[(st, c)]]
        versions = 2 if asynchronous else 1
        memory = stage_memory(s, w, cluster, chunks, tasks[st], st, v, stage_params[st], versions=versions)
        prog.ranks.append(RankClass(stage_label(st, mine), ranks_per_stage(s), memory, stage=st))
    return prog
