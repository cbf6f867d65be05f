"""Megatron-LM 3D parallelism: tensor x pipeline x data (Narayanan et al. SC21), and Megatron-DeepSpeed's
pipeline with ZeRO-1.

One simulated rank per pipeline stage stands for its TP x CP x DP ranks. A stage runs the steps of the chosen
schedule (``schedules/``): a forward or backward step is one compute task over the layers of a model chunk,
with the chunk's tensor-parallel collectives and the send to the neighbouring stage as blocking parts (Megatron
waits for its p2p transfers). The next stage's step depends on it. Embedding on the first stage, output layer and
loss on the last: their imbalance shows in the timeline. After the flush each stage reduces its gradients
over data parallelism (per chunk as soon as its last backward ends with ``overlap_grad_reduce``), all stages
agree on the gradient norm, and each steps its optimizer (distributed optimizer / ZeRO-1: reduce-scatter,
step on 1/DP, all-gather).

FSDP2 beside the pipeline (``parallelism.fsdp`` with ``reshard_after_forward: false``, torchtitan's setting
when pipelining): a stage's parameters are all-gathered before its first forward and stay gathered for every
micro-batch, gradients accumulate unsharded, and the stage reduce-scatters them once its last backward is done
(PyTorch ``torch/distributed/pipelining/stage.py``, ``backward_maybe_with_nosync`` keeps
``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)`` until ``perform_reduce_grad``,
"scheduled after all microbatches W, B actions"); the optimizer steps on its 1/DP shard. Memory is ZeRO-1's:
16-bit parameters and gradients whole, optimizer states sharded.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.errors import ScenarioError
from simulator.hardware.gpus import GPU
from simulator.program import Program, RankClass
from simulator.scenario.schema import Scenario
from simulator.strategy.common import (
    Unit,
    add_optimizer,
    ddp_settings,
    grad_bytes,
    grad_group,
    grad_group_size,
    parameter_tensors,
    ranks_per_stage,
    units,
    weight_bytes,
    with_host_checkpoints,
)
from simulator.strategy.schedules import ASYNCHRONOUS, SPLITS_BACKWARD, Step, get_schedule
from simulator.strategy.zero import bf16_optimizer, pipeline_grad_reduction
from simulator.workload.memory import (
    MemoryBreakdown,
    activation_bytes_per_layer,
    head_activation_bytes,
    state_bytes_per_param,
    zero_model_state_bytes,
)
from simulator.workload.transformer import Op, Workload, collective_op


def check(s: Scenario) -> None:
    """One clear message per combination the modelled frameworks do not support."""
    p, m = s.parallelism, s.model
    pp, v = p.pipeline_parallel, p.virtual_pipeline_stages
    if v > 1 and p.pipeline_schedule != "interleaved-1f1b":
        raise ScenarioError(
            f"parallelism.virtual_pipeline_stages ({v}) needs pipeline_schedule: interleaved-1f1b "
            f"(got {p.pipeline_schedule})"
        )
    first, last = p.first_pipeline_stage_layers, p.last_pipeline_stage_layers
    if first or last:
        middle_layers = m.num_layers - (first or 0) - (last or 0)
        middle_stages = pp - (first is not None) - (last is not None)
        if (
            middle_layers < 0
            or (middle_stages == 0 and middle_layers)
            or (middle_stages and middle_layers % middle_stages)
        ):
            raise ScenarioError(
                f"parallelism: model.num_layers ({m.num_layers}) - first_pipeline_stage_layers ({first or 0}) - "
                f"last_pipeline_stage_layers ({last or 0}) = {middle_layers} does not split evenly over the "
                f"{middle_stages} other stages"
            )
        per_middle = middle_layers // middle_stages if middle_stages else 0
        if v > 1 and per_middle % v:
            raise ScenarioError(
                f"parallelism: the middle stages' {per_middle} layers each do not split into "
                f"virtual_pipeline_stages ({v}) equal chunks"
            )
        for name, n in (("first", first), ("last", last)):
            if v > 1 and n is not None and n < v:
                raise ScenarioError(
                    f"parallelism: {name}_pipeline_stage_layers ({n}) gives some of the stage's "
                    f"virtual_pipeline_stages ({v}) chunks no layer"
                )
    elif m.num_layers % (pp * v):
        raise ScenarioError(
            f"model.num_layers ({m.num_layers}) is not divisible by pipeline_parallel ({pp}) x "
            f"virtual_pipeline_stages ({v}) = {pp * v}"
        )
    gas = s.gradient_accumulation_steps
    if p.pipeline_schedule == "interleaved-1f1b" and gas % pp:
        raise ScenarioError(
            f"parallelism: interleaved-1f1b needs the microbatches per pipeline, global_batch_size / "
            f"(micro_batch_size x data_parallel) = {s.training.global_batch_size} / ({s.training.micro_batch_size}"
            f" x {p.data_parallel}) = {gas}, to be a multiple of pipeline_parallel ({pp})"
        )
    if p.zero_stage > 1:
        raise ScenarioError(
            f"parallelism: zero_stage {p.zero_stage} with pipeline_parallel ({pp}) is not supported by "
            "DeepSpeed's pipeline engine or Megatron (use zero_stage 0 or 1)"
        )
    if p.fsdp is not None and p.fsdp.reshard_after_forward:
        raise ScenarioError(
            "parallelism: fsdp with pipeline_parallel > 1 needs fsdp.reshard_after_forward: false (torchtitan's "
            "setting under pipelining: parameters stay gathered across the micro-batches); gathering them again "
            "for every micro-batch is not modelled"
        )
    if p.fsdp is not None and p.fsdp.hybrid_shard_size:
        raise ScenarioError(
            "parallelism: fsdp.hybrid_shard_size (HSDP) with pipeline_parallel > 1 is not modelled; leave it unset "
            "to shard over the whole data-parallel group"
        )


def chunk_units(w: Workload, pp: int, v: int) -> dict[tuple[int, int], list[Unit]]:
    """Units of each (stage, chunk): global chunk g = chunk x pp + stage holds layers [g L/(pp v), ...);
    the embedding goes first on chunk 0 of stage 0, the output head last on the last chunk of the last stage."""
    us = units(w)
    par = w.scenario.parallelism
    first, last = par.first_pipeline_stage_layers, par.last_pipeline_stage_layers
    if first or last:
        # uneven stages: the given counts at the ends, the rest evenly in between; with interleaving each stage's
        # layers split over its v chunks as evenly as possible, the first stage's first chunk and the last
        # stage's last chunk the lightest (Llama 3's 126 layers on 16 x 2 chunks: one layer fewer in each)
        middle = (w.num_layers - (first or 0) - (last or 0)) // max(
            pp - (first is not None) - (last is not None), 1
        )
        per_stage = [middle] * pp
        if first is not None:
            per_stage[0] = first
        if last is not None:
            per_stage[-1] = last
        split = {}
        for st, n in enumerate(per_stage):
            base, extra = divmod(n, v)
            chunks = [base] * v
            for k in range(extra):  # the remainder goes to the chunks away from the model's ends
                chunks[v - 1 - k if st == 0 else k] += 1
            split[st] = chunks
        counts = [split[st][c] for c in range(v) for st in range(pp)]
    else:
        counts = [w.num_layers // (pp * v)] * (pp * v)
    starts = [sum(counts[:g]) for g in range(len(counts))]
    out: dict[tuple[int, int], list[Unit]] = {}
    for c in range(v):
        for st in range(pp):
            g = c * pp + st
            out[(st, c)] = us[1 + starts[g] : 1 + starts[g] + counts[g]]
    out[(0, 0)].insert(0, us[0])
    # with tied embeddings Megatron keeps a copy of the word embedding on the last stage for the logits
    out[(pp - 1, v - 1)].append(replace(us[-1], params=w.head.params))
    return out


def build(s: Scenario, w: Workload, gpu: GPU) -> Program:
    check(s)
    par = s.parallelism
    if par.pipeline_schedule == "deepspeed":
        from simulator.strategy import deepspeed_pipe

        return deepspeed_pipe.build(s, w, gpu)
    pp, v = par.pipeline_parallel, par.virtual_pipeline_stages
    m = s.gradient_accumulation_steps
    split = par.pipeline_schedule in SPLITS_BACKWARD
    order = {st: get_schedule(par.pipeline_schedule)(pp, m, v, st) for st in range(pp)}
    chunks = chunk_units(w, pp, v)
    ops = {key: _chunk_ops(s, w, us, key, pp, v, split) for key, us in chunks.items()}

    sharding = " + fsdp" if par.fsdp else (f" + zero-{par.zero_stage}" if par.zero_stage else "")
    prog = Program(f"megatron {par.pipeline_schedule}{sharding}")
    # ids are sequential, so a step's id is known before its task exists; pos[st][step] is that id
    pos: list[dict[Step, int]] = []
    n = 0
    for st in range(pp):
        pos.append({step: n + i for i, step in enumerate(order[st])})
        n += len(order[st])
    ids = _StepIds(pos)

    def upstream(st: int, step: Step) -> tuple[int, ...]:
        """The step on the neighbouring stage whose output this step receives (none for W): the same step one
        stage up (F) or down (B), or across the chunk boundary between the last and the first stage."""
        kind, mb, c = step
        if kind == "F":
            i = pos[st - 1].get(step) if st > 0 else pos[pp - 1].get(Step("F", mb, c - 1))
        elif kind == "B":
            i = pos[st + 1].get(step) if st < pp - 1 else pos[0].get(Step("B", mb, c + 1))
        else:
            return ()
        return () if i is None else (i,)

    stage_params = [sum(u.params for c in range(v) for u in chunks[(st, c)]) for st in range(pp)]
    stage_tensors = [_tensors(s, [u for c in range(v) for u in chunks[(st, c)]]) for st in range(pp)]
    names: dict[Step, str] = {}  # every stage runs the same steps: one name string per step
    add = prog.add_compute
    # where the host thread waits for the GPU: at every pipeline send / receive (Megatron synchronizes after
    # its batched p2p: megatron/core/pipeline_parallel/p2p_communication.py, _communicate), and at each
    # forward's input broadcast (get_batch)
    host = w.framework.host
    sync_steps = host.syncs.p2p and pp > 1
    sync_forward = sync_steps or host.syncs.microbatch
    for st in range(pp):
        # (ops, phase) of each step kind, per chunk
        work = [
            {"F": (f, "forward"), "B": (b, "backward"), "W": (wg, "backward")}
            for f, b, wg in (ops[(st, c)] for c in range(v))
        ]
        for step in order[st]:
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

    asynchronous = par.pipeline_schedule in ASYNCHRONOUS
    if asynchronous:
        _reduce_per_batch(prog, s, w, order, ids, stage_params)
        # one iteration = the steady-state period between stage 0's first and second weight updates
        prog.window = (ids[(0, "O", 0, 0)], ids[(0, "O", 1, 0)])
    else:
        _flush_and_step(prog, s, w, order, ids, chunks, stage_params, stage_tensors, last_compute)
    for st in range(pp):
        mine = [u for c in range(v) for u in chunks[(st, c)]]
        extras = [
            name
            for name, unit in (("embedding", "embedding"), ("output layer", "head"))
            if any(u.name == unit for u in mine)
        ]
        label = f"stage {st}: {sum(u.is_layer for u in mine)} layers" + "".join(f" + {e}" for e in extras)
        prog.ranks.append(
            RankClass(
                label,
                ranks_per_stage(s),
                _stage_memory(
                    s, w, gpu, chunks, order[st], st, v, stage_params[st], versions=2 if asynchronous else 1
                ),
                stage=st,
            )
        )
    return prog


class _StepIds:
    """``ids[(stage, kind, microbatch, chunk)]``: the task id of a stage's step."""

    def __init__(self, pos: list[dict[Step, int]]):
        self.pos = pos

    def __getitem__(self, key: tuple) -> int:
        st, *step = key
        return self.pos[st][Step(*step)]


def _tensors(s: Scenario, us: list[Unit]) -> int:
    """Parameter tensors of a stage's units (for the optimizer's per-tensor host work)."""
    names = {u.name for u in us}
    return parameter_tensors(s, sum(u.is_layer for u in us), "embedding" in names, "head" in names)


def _flush_and_step(
    prog: Program, s: Scenario, w: Workload, order, ids, chunks, stage_params, stage_tensors, last_compute
) -> None:
    """Synchronous schedules: after the flush each stage reduces its gradients over data parallelism (per chunk
    as soon as its last backward ends with overlap_grad_reduce), the first and last stage sum the tied word
    embedding's gradient, every stage agrees on the gradient norm, and each steps its optimizer."""
    par = s.parallelism
    pp, v, dp = par.pipeline_parallel, par.virtual_pipeline_stages, grad_group_size(s)
    wb, gb = weight_bytes(s), grad_bytes(s, w.framework)
    fsdp = par.fsdp is not None  # FSDP2 under torch.distributed.pipelining (module docstring)
    deepspeed = par.pipeline_schedule == "deepspeed"  # DeepSpeed's PipelineEngine reduces as DeepSpeed does
    bf16_opt = deepspeed and bf16_optimizer(s)
    if bf16_opt:
        gb = 4  # BF16_Optimizer's gradients, the tied embedding's _hp_grad included, are fp32
    distributed = par.zero_stage == 1 or fsdp or bf16_opt
    overlap = ddp_settings(s, w)[0] and not fsdp  # FSDP's REDUCE_GRAD follows the stage's last backward
    tied = None
    if s.model.tied_embeddings and pp > 1:
        # the first and last stage each hold the word embedding and sum its gradients after the flush (Megatron
        # _allreduce_word_embedding_grads, DeepSpeed allreduce_tied_weight_gradients): one collective of the
        # two stages, simulated once and awaited by both
        words = s.model.vocab_size * s.model.hidden_size // par.tensor_parallel
        tied = prog.add(
            0,
            "comm.dp",
            "all_reduce",
            "backward",
            "tied embedding grad all-reduce",
            (last_compute[0], last_compute[-1]),
            group="embedding",
            bytes=words * gb,
        )
    for st in range(pp):
        reductions = []
        if deepspeed:
            rid = last_compute[st]
            for kind, nbytes in pipeline_grad_reduction(s, stage_params[st]):
                rid = prog.add(
                    st,
                    "comm.dp",
                    kind,
                    "backward",
                    f"grad {kind.replace('_', '-')}",
                    (rid,),
                    group=grad_group(s),
                    bytes=nbytes,
                )
                reductions.append(rid)
        elif dp > 1:
            for c in range(v):
                params = sum(u.params for u in chunks[(st, c)])
                last_b = max(i for x, i in ids.pos[st].items() if x.chunk == c and x.kind != "F")
                after = last_b if overlap else last_compute[st]
                reductions.append(
                    prog.add(
                        st,
                        "comm.dp",
                        "reduce_scatter" if distributed else "all_reduce",
                        "backward",
                        f"chunk {c} grad {'reduce-scatter' if distributed else 'all-reduce'}",
                        (after,),
                        group=grad_group(s),
                        bytes=params * gb,
                    )
                )
        if tied is not None and st in (0, pp - 1):
            reductions.append(tied)
        # gradient clipping all-reduces the norm over every stage: a global sync before the step
        opt = add_optimizer(
            prog,
            s,
            stage_params[st] / (dp if distributed else 1),
            (*reductions, *last_compute),
            rank=st,
            w=w,
            tensors=stage_tensors[st],
        )
        if distributed and dp > 1 and (par.ddp.overlap_param_gather or fsdp):
            # the previous step's weights are gathered under this iteration's first forward (steady state);
            # FSDP gathers them at the first forward and keeps them for every micro-batch
            gid = prog.add(
                st,
                "comm.dp.gather",
                "all_gather",
                "forward",
                "param all-gather",
                (),
                group=grad_group(s),
                bytes=stage_params[st] * wb,
            )
            first = prog.tasks[ids[(st, *order[st][0])]]
            first.deps = (*first.deps, gid)
        elif distributed and dp > 1:
            prog.add(
                st,
                "comm.dp",
                "all_gather",
                "optimizer",
                "param all-gather",
                (opt,),
                group=grad_group(s),
                bytes=stage_params[st] * wb,
            )


def _reduce_per_batch(prog: Program, s: Scenario, w: Workload, order, ids, stage_params) -> None:
    """Asynchronous schedules: before each optimizer step a stage all-reduces that batch's gradients over data
    parallelism (no flush, no global sync)."""
    par = s.parallelism
    if grad_group_size(s) == 1:
        return
    for st in range(par.pipeline_parallel):
        for i, step in enumerate(order[st]):
            if step.kind != "O":
                continue
            rid = prog.add(
                st,
                "comm.dp",
                "all_reduce",
                "backward",
                f"batch {step.microbatch} grad all-reduce",
                (ids[(st, *order[st][i - 1])],),
                group=grad_group(s),
                bytes=stage_params[st] * grad_bytes(s, w.framework),
            )
            opt = prog.tasks[ids[(st, *step)]]
            opt.deps = (*opt.deps, rid)


def _chunk_ops(
    s: Scenario,
    w: Workload,
    us: list[Unit],
    key: tuple[int, int],
    pp: int,
    v: int,
    split: bool,
    sends: bool = True,
):
    """(forward, backward, weight-gradient) ops of one chunk, with the p2p sends as blocking collectives (unless
    ``sends`` is false: DeepSpeed's engine runs them as instructions of their own)."""
    st, c = key
    par, mdl = s.parallelism, s.model
    t = par.tensor_parallel
    e = 4 if s.training.precision == "fp32" else 2
    act = s.training.micro_batch_size * (mdl.seq_length // par.context_parallel) * mdl.hidden_size * e
    scatter_gather = t > 1 and not par.sequence_parallel  # Narayanan Sec. 4.1: send 1/t, all-gather after
    send = collective_op(
        "pipeline send", "send_recv", "pp", act / t if scatter_gather or par.sequence_parallel else act
    )
    regather = (
        collective_op("tp all-gather (pipeline scatter/gather)", "all_gather", "tp", act)
        if scatter_gather
        else None
    )
    first, last = st == 0 and c == 0, st == pp - 1 and c == v - 1
    mode = s.training.activation_recompute
    if not sends:
        send = None

    fwd: list[Op] = list(w.microbatch_setup)  # every forward step calls get_batch (pretrain_gpt.py)
    if not first and regather is not None:
        fwd.append(regather)
    for u in us:
        fwd += u.block.forward
    if not last and send is not None:
        fwd.append(send)
    bwd: list[Op] = [] if last or regather is None else [regather]
    wgt: list[Op] = []
    for u in reversed(us):
        if u.is_layer and mode == "full":
            bwd += u.block.recompute_full or u.block.forward
        elif u.is_layer and mode == "selective":
            bwd += u.block.recompute_selective
        for op in u.block.backward:
            (wgt if split and op.name.endswith(" wgrad") else bwd).append(op)
    if not first and send is not None:
        bwd.append(send)
    return tuple(fwd), tuple(bwd), tuple(wgt)


def _stage_memory(
    s: Scenario,
    w: Workload,
    gpu: GPU,
    chunks,
    steps: list[Step],
    st: int,
    v: int,
    params: float,
    versions: int = 1,
) -> MemoryBreakdown:
    """Model states of the stage's layers (ZeRO-1 / distributed optimizer shards the optimizer states over DP),
    and activations for the microbatches in flight, counted by walking the schedule: +1 at a chunk's forward,
    -1 at its backward (at W for the half of the activations the weight gradient still needs). PipeDream-2BW
    keeps ``versions`` = 2 copies of the weights (the extra one counted as a buffer)."""
    par = s.parallelism
    w_b, _, k_b = state_bytes_per_param(s.training.precision, s.training.optimizer)
    g_b = grad_bytes(s, w.framework)
    stage = 1 if par.fsdp else par.zero_stage
    if par.pipeline_schedule == "deepspeed" and bf16_optimizer(s):
        # BF16_Optimizer: the bf16 gradients of the last backward and the fp32 copy of every gradient, whole
        # on each rank; the fp32 weights and Adam states of the rank's 1/N (bf16_optimizer.py, v0.16.5)
        g_b, stage = g_b + 4, 1
    p_bytes, g_bytes, o_bytes = zero_model_state_bytes(params, grad_group_size(s), stage, k_b, w_b, g_b)
    layers = {c: sum(1 for u in chunks[(st, c)] if u.is_layer) for c in range(v)}
    heads = {c: chunks[(st, c)][-1].name == "head" for c in range(v)}

    change = {"F": 1.0, "B": -0.5 if par.pipeline_schedule in SPLITS_BACKWARD else -1.0, "W": -0.5, "O": 0.0}

    def in_flight_peak(chunk_bytes: dict) -> float:
        live = peak = 0.0
        for kind, _, chunk in steps:
            live += change[kind] * chunk_bytes[chunk]
            if live > peak:
                peak = live
        return peak

    per_layer = activation_bytes_per_layer(s)
    peak = in_flight_peak({c: layers[c] * per_layer + heads[c] * head_activation_bytes(s) for c in range(v)})
    if s.training.activation_recompute == "full":
        peak += activation_bytes_per_layer(s, recompute="none")
    mem = MemoryBreakdown(p_bytes, g_bytes, o_bytes, peak, (versions - 1) * params * w_b, gpu.hbm_bytes)
    if not s.training.cpu_checkpointing:
        return mem
    # checkpoints of the microbatches in flight, in host memory instead
    return with_host_checkpoints(s, mem, in_flight_peak(layers))
