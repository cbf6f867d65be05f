"""The end of a pipeline iteration. Synchronous schedules (every Megatron schedule but PipeDream-2BW, and
DeepSpeed's engine): after the flush each stage reduces its gradients over data parallelism (per chunk as soon as
its last backward ends with ``overlap_grad_reduce``; DeepSpeed's way with its engine), the first and last stage
sum the tied word embedding's gradient, every stage agrees on the gradient norm, and each steps its optimizer
(distributed optimizer / ZeRO-1: reduce-scatter, step on 1/DP, all-gather). Asynchronous schedules reduce and step
per batch, with no flush.

FSDP2 beside the pipeline (``parallelism.fsdp`` with ``reshard_after_forward: false``, torchtitan's setting
when pipelining): a stage's parameters are all-gathered before its first forward and stay gathered for every
micro-batch, gradients accumulate unsharded (in fp32 where FSDP reduces in fp32: torchtitan), and the stage
reduce-scatters them once its last backward is done (PyTorch ``torch/distributed/pipelining/stage.py``,
``backward_maybe_with_nosync`` keeps ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)``
until ``perform_reduce_grad``, "scheduled after all microbatches W, B actions"); the optimizer steps on its 1/DP
shard.
"""

from __future__ import annotations

from simulator.program import Program
from simulator.scenario.schema import Scenario
from simulator.strategy.groups import EXPERT_GROUP, expert_grad_group_size, grad_group, grad_group_size
from simulator.strategy.reduction import bf16_optimizer, ddp_settings, pipeline_grad_reduction
from simulator.strategy.schedules import DUAL
from simulator.strategy.state_bytes import fsdp_reduce_bytes, gather_bytes, grad_bytes
from simulator.strategy.steps import add_optimizer
from simulator.workload.ops import memory_op
from simulator.workload.transformer import Workload


def flush_and_step(
    prog: Program, s: Scenario, w: Workload, order, ids, chunks, stage_params, stage_tensors, last_compute
) -> None:
    """Synchronous schedules: after the flush each stage reduces its gradients over data parallelism (per chunk
    as soon as its last backward ends with overlap_grad_reduce), the first and last stage sum the tied word
    embedding's gradient, every stage agrees on the gradient norm, and each steps its optimizer."""
    par = s.parallelism
    pp, v, dp = par.pipeline_parallel, par.virtual_pipeline_stages, grad_group_size(s)
    edp = expert_grad_group_size(s)
    gb = grad_bytes(s, w.framework)
    fsdp = par.fsdp is not None  # FSDP2 under torch.distributed.pipelining (module docstring)
    if fsdp:
        gb = fsdp_reduce_bytes(s, w.framework)  # the accumulated gradients, fp32 under torchtitan
    deepspeed = par.pipeline_schedule == "deepspeed"  # DeepSpeed's PipelineEngine reduces as DeepSpeed does
    bf16_opt = deepspeed and bf16_optimizer(s)
    if bf16_opt:
        gb = 4  # BF16_Optimizer's gradients, the tied embedding's _hp_grad included, are fp32
    distributed = par.zero_stage == 1 or fsdp or bf16_opt
    overlap = ddp_settings(s, w)[0] and not fsdp  # FSDP's REDUCE_GRAD follows the stage's last backward
    tied = None
    mirrors: dict[int, int] = {}
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
            # each chunk's buckets reduce when its last backward ends (Megatron-Core param_and_grad_buffer.py,
            # core_r0.9.0+: a bucket's reduce-scatter is launched once its last gradient is in), so the comm stream
            # takes them in the order the chunks finish: under interleaving the last chunk first
            for c in sorted(range(v), key=lambda c: last_backward(ids, st, c)):
                params = sum(u.params for u in chunks[(st, c)])
                last_b = last_backward(ids, st, c)
                after = last_b if overlap else last_compute[st]
                if fsdp and w.framework.fsdp_copies:
                    # FSDP2's foreach_reduce first copies the accumulated gradients into the reduce-scatter input
                    # (foreach_reduce_scatter_copy_in: a read and a write in the reduce dtype)
                    copy = memory_op("grad reduce-scatter copy-in", 2 * gb * params, direction="backward")
                    after = prog.add(
                        st, "comm.dp", "copy", "backward", f"chunk {c} grad copy-in", (after,), ops=(copy,)
                    )
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
        experts = sum(u.expert_params for c in range(v) for u in chunks[(st, c)])
        if experts and edp > 1 and not deepspeed:
            # a mixture-of-experts model's routed experts: their own buffers, reduced over expert data
            # parallelism (Megatron-Core distributed_data_parallel.py expert_parallel_buffers)
            for c in sorted(range(v), key=lambda c: last_backward(ids, st, c)):
                params = sum(u.expert_params for u in chunks[(st, c)])
                if not params:
                    continue
                last_b = last_backward(ids, st, c)
                kind = "reduce_scatter" if distributed else "all_reduce"
                reductions.append(
                    prog.add(
                        st,
                        "comm.dp",
                        kind,
                        "backward",
                        f"chunk {c} expert grad {kind.replace('_', '-')}",
                        (last_b if overlap else last_compute[st],),
                        group=EXPERT_GROUP,
                        bytes=params * gb,
                    )
                )
        if par.pipeline_schedule == "dualpipe":
            # DualPipe holds every model stage on two ranks, i and p - 1 - i, whose gradients are summed
            # (deepseek-ai/DualPipe 3da1bbe examples/example_dualpipe.py: p0.grad += p1all[pp_size - 1 - rank])
            mirror = pp - 1 - st
            if st < mirror:
                mirrors[st] = mirrors[mirror] = prog.add(
                    st,
                    "comm.dp",
                    "all_reduce",
                    "backward",
                    "mirror-stage grad all-reduce",
                    (last_compute[st], last_compute[mirror]),
                    group="mirror",
                    bytes=stage_params[st] * gb,
                )
            reductions.append(mirrors[st])
        if st == 0 and s.model.tied_embeddings and pp > 1 and par.pipeline_schedule not in DUAL:
            # (DualPipe's and DualPipeV's first and last model stages share a rank)
            # the first and last stage each hold the word embedding and sum its gradients after the flush (Megatron
            # finalize_model_grads: after the data-parallel reductions, _allreduce_word_embedding_grads; DeepSpeed
            # allreduce_tied_weight_gradients): one collective of the two stages, simulated once, awaited by both
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
        if tied is not None and st in (0, pp - 1):
            reductions.append(tied)
        # gradient clipping all-reduces the norm over every stage: a global sync before the step
        opt = add_optimizer(
            prog,
            s,
            stage_params[st] / (dp if distributed else 1) + experts / (edp if distributed else 1),
            (*reductions, *last_compute),
            rank=st,
            w=w,
            tensors=stage_tensors[st],
        )
        if distributed and dp > 1 and (par.ddp.overlap_param_gather or fsdp):
            # the previous step's weights are gathered under this iteration's forward (steady state), one model
            # chunk's buckets at a time in forward order, each chunk's first forward waiting for its own
            # (Megatron-Core --overlap-param-gather: distributed_data_parallel.py forward pre-hooks, the next
            # bucket dispatched as one is waited on); FSDP gathers them at the first forward and keeps them
            for c in sorted(range(v), key=lambda c: first_forward(ids, st, c)):
                params = sum(u.params for u in chunks[(st, c)])
                if not params:
                    continue
                gid = prog.add(
                    st,
                    "comm.dp.gather",
                    "all_gather",
                    "forward",
                    f"chunk {c} param all-gather" if v > 1 else "param all-gather",
                    (),
                    group=grad_group(s),
                    bytes=params * gather_bytes(s, w),
                )
                first = prog.tasks[first_forward(ids, st, c)]
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
                bytes=stage_params[st] * gather_bytes(s, w),
            )
        if experts and distributed and edp > 1:
            prog.add(
                st,
                "comm.dp",
                "all_gather",
                "optimizer",
                "expert param all-gather",
                (opt,),
                group=EXPERT_GROUP,
                bytes=experts * gather_bytes(s, w, experts=True),
            )


def last_backward(ids, st: int, c: int) -> int:
    """The task of stage ``st``'s last backward (or weight-gradient) step of chunk ``c``."""
    return max(i for x, i in ids.pos[st].items() if x.chunk == c and x.kind != "F")


def first_forward(ids, st: int, c: int) -> int:
    """The task of stage ``st``'s first forward step of chunk ``c``."""
    return min(i for x, i in ids.pos[st].items() if x.chunk == c and x.kind == "F")


def reduce_per_batch(prog: Program, s: Scenario, w: Workload, order, ids, stage_params) -> None:
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
