"""DeepSpeed's PipelineEngine (deepspeed/runtime/pipe/engine.py, v0.16.4) running ``TrainSchedule``.

Unlike Megatron's schedules, whose sends ride on the step that produced them, DeepSpeed's stages execute
instruction lists in lock-step (``schedules/deepspeed_train.py``): each transfer is a blocking
``dist.send`` / ``dist.recv`` pair (deepspeed/runtime/pipe/p2p.py) that starts when the sender and the receiver
both reach it, and neither stage computes until it ends. Megatron-DeepSpeed's GPTModelPipe sends the hidden
states only (pretrain_gpt.py keeps the causal mask in ``args.attn_mask`` since 2021-06). After the last step every stage runs ReduceTiedGrads (the tied embedding's gradient all-reduced between the first and
last stage), ReduceGrads (data-parallel all-reduce) and OptimizerStep: the same end as Megatron's flush.
"""

from __future__ import annotations

from simulator.hardware.gpus import GPU
from simulator.scenario.schema import Scenario
from simulator.strategy.common import grad_group_size, ranks_per_stage
from simulator.strategy.megatron import (
    _chunk_ops,
    _flush_and_step,
    _stage_memory,
    _StepIds,
    _tensors,
    check,
    chunk_units,
)
from simulator.strategy.program import Program, RankClass
from simulator.strategy.schedules import Step
from simulator.strategy.schedules.deepspeed_train import commands
from simulator.workload.transformer import Workload


def build(s: Scenario, w: Workload, gpu: GPU) -> Program:
    check(s)
    par = s.parallelism
    pp, dp, m = par.pipeline_parallel, grad_group_size(s), s.gradient_accumulation_steps
    chunks = chunk_units(w, pp, 1)
    ops = {st: _chunk_ops(s, w, chunks[(st, 0)], (st, 0), pp, 1, False, sends=False) for st in range(pp)}
    prog = Program(f"deepspeed pipeline (tp {par.tensor_parallel} x pp {pp} x dp {dp})")
    cmds = {st: commands(pp, m, st) for st in range(pp)}

    e = 4 if s.training.precision == "fp32" else 2
    mdl = s.model
    tokens = s.training.micro_batch_size * mdl.seq_length // par.context_parallel
    act = tokens * mdl.hidden_size * e // (par.tensor_parallel if par.sequence_parallel else 1)

    # one transfer task per (boundary, direction, microbatch), on the lower stage's rank; deps are filled in
    # as both stages reach it
    xfer: dict[tuple[str, int, int], int] = {}
    for st in range(pp - 1):
        for mb in range(m):
            xfer[("act", st, mb)] = prog.add(
                st,
                "comm.pp.act",
                "send_recv",
                "forward",
                f"activation {mb} to stage {st + 1}",
                (),
                group="pp",
                bytes=act,
            )
            xfer[("grad", st, mb)] = prog.add(
                st + 1,
                "comm.pp.grad",
                "send_recv",
                "backward",
                f"gradient {mb} to stage {st}",
                (),
                group="pp",
                bytes=act,
            )
    host = w.framework.host
    pos: list[dict[Step, int]] = []
    last_compute: list[int] = []
    for st in range(pp):
        fwd, bwd, _ = ops[st]
        last: int | None = None
        steps: dict[Step, int] = {}
        for c in cmds[st]:
            if c.kind in ("F", "B"):
                phase = "forward" if c.kind == "F" else "backward"
                deps = (last,) if last is not None else ()
                last = prog.add_compute(
                    st,
                    phase,
                    phase,
                    f"{c.kind}{c.microbatch}",
                    deps,
                    fwd if c.kind == "F" else bwd,
                    c.microbatch,
                    c.kind == "F" and host.syncs.microbatch,
                )
                steps[Step(c.kind, c.microbatch)] = last
            elif c.kind != "load":  # LoadMicroBatch: its host work is in the forward's ops
                # a blocking transfer: it waits for this stage's previous instruction, the stage for it
                boundary = st if c.kind in ("send_act", "recv_grad") else st - 1
                key = ("act" if c.kind.endswith("act") else "grad", boundary, c.microbatch)
                t = prog.tasks[xfer[key]]
                if last is not None:
                    t.deps = (*t.deps, last)
                last = t.id
        pos.append(steps)
        last_compute.append(max(steps.values()))
    ids = _StepIds(pos)
    order = {st: [x for x in sorted(pos[st], key=pos[st].get)] for st in range(pp)}
    stage_params = [sum(u.params for u in chunks[(st, 0)]) for st in range(pp)]
    stage_tensors = [_tensors(s, chunks[(st, 0)]) for st in range(pp)]
    _flush_and_step(prog, s, w, order, ids, chunks, stage_params, stage_tensors, last_compute)
    for st in range(pp):
        mine = chunks[(st, 0)]
        extras = [
            n
            for n, unit in (("embedding", "embedding"), ("output layer", "head"))
            if any(u.name == unit for u in mine)
        ]
        label = f"stage {st}: {sum(u.is_layer for u in mine)} layers" + "".join(f" + {x}" for x in extras)
        mem = _stage_memory(s, gpu, chunks, order[st], st, 1, stage_params[st])
        prog.ranks.append(RankClass(label, ranks_per_stage(s), mem, stage=st))
    return prog
