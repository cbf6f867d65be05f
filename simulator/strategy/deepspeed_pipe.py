"""DeepSpeed's PipelineEngine (deepspeed/runtime/pipe/engine.py, v0.16.4) running ``TrainSchedule``.

Unlike Megatron's schedules, whose sends ride on the step that produced them, DeepSpeed's stages execute
instruction lists in lock-step (``schedules/deepspeed_train.py``): each transfer is a blocking
``dist.send`` / ``dist.recv`` pair (deepspeed/runtime/pipe/p2p.py) that starts when the sender and the receiver
both reach it, and neither stage computes until it ends. The stages still keep 1F1B's rhythm (f + b per
microbatch); past two stages each stage meets both neighbours every step, so about 4 transfers per microbatch lie
on the critical path (tests/test_pipeline.py: (m + p - 1)(f + b) + (4m + 2p - 8) T). Megatron-DeepSpeed's
GPTModelPipe sends the hidden states only (pretrain_gpt.py keeps the causal mask in ``args.attn_mask`` since
2021-06). After the last step every stage runs ReduceTiedGrads (the tied embedding's gradient all-reduced between
the first and last stage), ReduceGrads (the data-parallel reduction as DeepSpeed's optimizer wrapper does it:
``zero.pipeline_grad_reduction``) and OptimizerStep: the same end as Megatron's flush. With bf16 and no ZeRO the
wrapper is BF16_Optimizer (fp32 gradients, accumulated after every backward, all-reduced in fp32).
"""

from __future__ import annotations

from simulator.hardware.cluster import Cluster
from simulator.program import Program, RankClass
from simulator.scenario.schema import Scenario
from simulator.strategy.groups import ranks_per_stage
from simulator.strategy.pipeline.chunk_ops import chunk_pieces, ops_of
from simulator.strategy.pipeline.flush import flush_and_step
from simulator.strategy.pipeline.memory import stage_memory
from simulator.strategy.pipeline.partition import check, chunk_units, stage_label
from simulator.strategy.pipeline.step_ids import StepIds
from simulator.strategy.reduction import HP_GRAD_UPDATE_BYTES_PER_PARAM, bf16_optimizer, version
from simulator.strategy.schedules import Step
from simulator.strategy.schedules.deepspeed_train import commands
from simulator.strategy.units import unit_tensors
from simulator.workload.framework_kernels import GRAD_ACCUMULATION
from simulator.workload.ops import Op, collective_op
from simulator.workload.transformer import Workload


def build(s: Scenario, w: Workload, cluster: Cluster) -> Program:
    check(s)
    par = s.parallelism
    pp, m = par.pipeline_parallel, s.gradient_accumulation_steps
    chunks = chunk_units(w, pp, 1)
    # the p2p sends are the engine's instructions of their own (sends=False), the backward whole
    ops = {
        st: ops_of(chunk_pieces(s, w, chunks[(st, 0)], (st, 0), pp, 1, sends=False), False)
        for st in range(pp)
    }
    stage_params = [sum(u.params for u in chunks[(st, 0)]) for st in range(pp)]
    stage_tensors = [unit_tensors(s, chunks[(st, 0)]) for st in range(pp)]
    if bf16_optimizer(s):
        # BF16_Optimizer: no Megatron main_grad hooks; after each backward update_hp_grads adds every bf16
        # gradient into its fp32 copy, two kernels per parameter tensor
        for st in range(pp):
            fwd, bwd, wgt = ops[st]
            update = Op(
                "BF16_Optimizer update_hp_grads",
                "memory",
                bytes=stage_params[st] * HP_GRAD_UPDATE_BYTES_PER_PARAM,
                direction="backward",
                launches=2 * stage_tensors[st],
            )
            kept = tuple(op for op in bwd if not op.name.startswith(GRAD_ACCUMULATION))
            ops[st] = (fwd, (*kept, update), wgt)
    prog = Program("deepspeed pipeline" + (f" + zero-{par.zero_stage}" if par.zero_stage else ""))
    cmds = {st: commands(pp, m, st) for st in range(pp)}

    e = 4 if s.training.precision == "fp32" else 2
    mdl = s.model
    tokens = s.training.micro_batch_size * mdl.seq_length // par.context_parallel
    # with tensor parallelism each rank sends its 1/t slice (engine.py: is_pipe_partitioned, PartitionedTensor)
    # and the receiver all-gathers it over the tensor-parallel group (in the step's ops, as Megatron's
    # scatter-gather)
    act = tokens * mdl.hidden_size * e // par.tensor_parallel
    # before 0.5.4 the gradients went back whole (engine.py v0.5.0-v0.5.3: is_grad_partitioned = False): every
    # tensor-parallel rank sends the full tensor, and the receiver's all-gather restores its own output instead
    whole = version(par.zero.deepspeed_version) < (0, 5, 4)
    send_ops = {
        "act": collective_op("pipeline send", "send_recv", "pp", act),
        "grad": collective_op(
            "pipeline send", "send_recv", "pp", act * (par.tensor_parallel if whole else 1)
        ),
    }

    # Each stage's own instructions (F, B and the sends it makes) run in order on its stream; a send is a
    # blocking transfer task costed alone, as Megatron's sends are (pipeline neighbours use their own links).
    # Pass 1 numbers them, pass 2 adds them with their dependencies: a transfer starts once the sender and
    # the receiver have both reached it, and the instruction after a receive waits for the transfer.
    def key(st: int, c) -> tuple[str, int, int]:
        """(direction, boundary, microbatch) of a transfer instruction of stage ``st``."""
        boundary = st if c.kind in ("send_act", "recv_grad") else st - 1
        return ("act" if c.kind.endswith("act") else "grad", boundary, c.microbatch)

    own = {st: [c for c in cmds[st] if c.kind in ("F", "B", "send_act", "send_grad")] for st in range(pp)}
    ids: dict[tuple[int, int], int] = {}  # (stage, index in own) -> task id
    transfer: dict[tuple[str, int, int], int] = {}
    n = len(prog.tasks)
    for st in range(pp):
        for i, c in enumerate(own[st]):
            ids[(st, i)] = n
            if c.kind.startswith("send"):
                transfer[key(st, c)] = n
            n += 1
    # the instruction each stage ran before each of its receives (the receiver's side of the rendezvous)
    before_recv: dict[tuple[str, int, int], int | None] = {}
    for st in range(pp):
        last, i = None, 0
        for c in cmds[st]:
            if c.kind in ("F", "B", "send_act", "send_grad"):
                last, i = ids[(st, i)], i + 1
            elif c.kind.startswith("recv"):
                before_recv[key(st, c)] = last
                last = transfer[key(st, c)]
    host = w.framework.host
    pos: list[dict[Step, int]] = []
    last_compute: list[int] = []
    for st in range(pp):
        fwd, bwd, _ = ops[st]
        steps: dict[Step, int] = {}
        last, i = None, 0
        for c in cmds[st]:
            if c.kind.startswith("recv"):
                last = transfer[key(st, c)]
                continue
            if c.kind == "load":  # LoadMicroBatch: its host work is in the forward's ops
                continue
            deps = (last,) if last is not None else ()
            if c.kind in ("F", "B"):
                phase = "forward" if c.kind == "F" else "backward"
                tid = prog.add_compute(
                    st,
                    phase,
                    phase,
                    f"{c.kind}{c.microbatch}",
                    deps,
                    fwd if c.kind == "F" else bwd,
                    c.microbatch,
                    c.kind == "F" and host.syncs.microbatch,
                )
                steps[Step(c.kind, c.microbatch)] = tid
            else:
                k = key(st, c)
                other = before_recv.get(k)
                what = "activation" if k[0] == "act" else "gradient"
                to = st + 1 if k[0] == "act" else st - 1
                tid = prog.add_compute(
                    st,
                    "send_recv",
                    "forward" if k[0] == "act" else "backward",
                    f"{what} {c.microbatch} to stage {to}",
                    deps + ((other,) if other is not None else ()),
                    (send_ops[k[0]],),
                    c.microbatch,
                )
            assert tid == ids[(st, i)]
            last, i = tid, i + 1
        pos.append(steps)
        last_compute.append(max(steps.values()))
    step_ids = StepIds(pos)
    order = {st: [x for x in sorted(pos[st], key=pos[st].get)] for st in range(pp)}
    flush_and_step(prog, s, w, order, step_ids, chunks, stage_params, stage_tensors, last_compute)
    for st in range(pp):
        mem = stage_memory(s, w, cluster, chunks, [(x,) for x in order[st]], st, 1, stage_params[st])
        prog.ranks.append(RankClass(stage_label(st, chunks[(st, 0)]), ranks_per_stage(s), mem, stage=st))
    return prog
