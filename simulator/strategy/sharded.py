"""The iteration shared by fully sharded strategies (DeepSpeed ZeRO-3, PyTorch FSDP2 / HSDP).

Before a unit computes, its parameters are all-gathered on the all-gather stream; the gather of unit i may start
once the compute ``depth`` positions before i has finished (prefetch bounded by memory). Backward re-gathers
the units whose parameters were freed after forward and reduce-scatters each unit's gradients on a reduction stream; HSDP
then all-reduces the shard across replicas. Compute waits for its gather; the optimizer waits for every reduction.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.program import COMPUTE, Program
from simulator.scenario.schema import Scenario
from simulator.strategy.offload import add_grad_copy, add_host_step, add_param_copy
from simulator.strategy.steps import (
    add_backward,
    add_forward,
    add_optimizer,
    microbatch_sync,
    recompute_name,
    with_setup,
)
from simulator.strategy.units import Unit, gather_params, parameter_tensors
from simulator.strategy.zero3_fetch import FetchSchedule
from simulator.strategy.zero3_hooks import ModuleHooks, module_ends
from simulator.strategy.zero3_waits import Waits
from simulator.workload.ops import memory_op
from simulator.workload.transformer import Workload


@dataclass(frozen=True)
class ShardingPlan:
    gather_group: str  # e.g. "dp" or "dp_shard"
    replicate_group: str | None  # HSDP: all-reduce of the reduced shard across replicas
    shard_size: int
    prefetch_depth: int  # units gathered ahead of the one computing
    kept_after_forward: frozenset[int]  # units whose gathered parameters stay until their backward
    reduce_every_microbatch: bool
    overlap_reduce: bool  # reductions on their own stream; otherwise compute waits for each one
    weight_bytes: float
    grad_bytes: int  # per gradient element reduced (FSDP2: its reduce dtype's)
    # per element of the gradient autograd leaves unsharded (the parameter's dtype)
    unsharded_grad_bytes: int = 2
    # FSDP2's per-parameter copies around each collective (framework.fsdp_copies); FSDP1's flat parameter has none
    copies: bool = False
    # ZeRO++ (Wang et al. 2023): forward gathers in fewer bytes per parameter (qwZ), backward gathers from a
    # secondary shard in a smaller group (hpZ), gradients as a two-step quantized all-to-all (qgZ)
    forward_gather_bytes: float | None = (
        None  # bytes per parameter of forward all-gathers (default: weight_bytes)
    )
    backward_gather_group: str | None = None  # default: gather_group
    forward_extra_bytes_per_param: float = 0.0  # dequantize kernel traffic per gathered parameter
    quantized_reduce: tuple[str, str, int, float] | None = (
        None  # (intra group, inter group, size, bytes/param)
    )
    backward_extra_bytes_per_param: float = 0.0  # gradient (de)quantize kernel traffic per parameter
    # ZeRO-Offload / ZeRO-Infinity: where optimizer states and parameter shards live ("cpu", "nvme" or None)
    offload_optimizer: str | None = None
    offload_param: str | None = None
    # DeepSpeed ZeRO-3: the coordinator's calls, module by module (simulator/strategy/zero3_fetch.py); without it
    # every unit is gathered whole, ``prefetch_depth`` units ahead (FSDP2)
    fetch: FetchSchedule | None = None


def add_sharded_iteration(p: Program, s: Scenario, w: Workload, us: list[Unit], plan: ShardingPlan) -> None:
    """DeepSpeed ZeRO-3 (``plan.fetch``): the coordinator's calls. Otherwise FSDP2's per-unit iteration: units
    gather ``gather_params`` (the head also needs a tied embedding's weight) ``prefetch_depth`` computes ahead
    and reduce-scatter the gradients of their own ``params`` (HSDP then all-reduces the shard across replicas)."""
    if plan.fetch is not None:
        _fetched_iteration(p, s, w, us, plan)
        return
    gas = s.gradient_accumulation_steps
    computes: list[int] = []  # compute task ids in execution order, for prefetch limits
    reductions: list[int] = []

    def gather(u: Unit, phase: str, after: int | None = None) -> int:
        # the next compute is computes[len]; with depth d its gather may overlap the d computes before it
        pos = len(computes) - 1 - plan.prefetch_depth
        deps = ((computes[pos],) if pos >= 0 else ()) + ((after,) if after is not None else ())
        nbytes = gather_params(w, u) * plan.weight_bytes
        gid = p.add(
            0,
            "comm.ag",
            "all_gather",
            phase,
            f"{u.name} param all-gather",
            deps,
            group=plan.gather_group,
            bytes=nbytes,
        )
        # FSDP2 copies the gathered buffer out into the unit's parameters on the compute stream before the unit
        # runs (_fsdp_collectives.py foreach_all_gather_copy_out, split_with_sizes_copy, from wait_for_unshard)
        if not plan.copies:
            return gid
        copy = memory_op("all-gather copy-out", FSDP_COPY_OUT_PER_BYTE * nbytes)
        return p.add(0, COMPUTE, "copy", phase, f"{u.name} all-gather copy-out", (gid,), ops=(copy,))

    def add_reduction(
        kind: str, name: str, after: int, group: str, nbytes: float, copy_in: float = 0.0
    ) -> int:
        """A gradient reduction step on the reduction stream, after ``after`` (``copy_in``: bytes its input copy
        moves first on the same stream)."""
        if copy_in:
            ops = (memory_op("reduce-scatter copy-in", copy_in, direction="backward"),)
            after = p.add(0, "comm.rs", "copy", "backward", f"{name} copy-in", (after,), ops=ops)
        return p.add(0, "comm.rs", kind, "backward", name, (after,), group=group, bytes=nbytes)

    setup: dict = {}
    for mb in range(gas):
        # backward ends by waiting for its reductions (FSDP2's post-backward final callback), so the next
        # microbatch starts after them
        sync = reductions[-1] if reductions else None
        for i, u in enumerate(us):
            ops = with_setup(w, u.block.forward, setup) if i == 0 else u.block.forward
            deps = (gather(u, "forward", sync if i == 0 else None),)
            computes.append(add_forward(p, u, mb, deps, ops=ops, sync=i == 0 and microbatch_sync(w)))
        reduce = plan.reduce_every_microbatch or mb == gas - 1
        blocking = None
        for u in reversed(us):
            deps = () if u.index in plan.kept_after_forward else (gather(u, "backward"),)
            if blocking is not None:
                deps += (blocking,)
            computes.append(add_backward(p, s, u, mb, deps))
            if not reduce:
                continue
            nbytes = u.params * plan.grad_bytes
            # FSDP2's foreach_reduce_scatter_copy_in (torch._chunk_cat): the unsharded gradients read, cast to
            # the reduce dtype into the reduce-scatter input. FSDP1 reduces the flat gradient in place, unless
            # its reduce dtype differs: then _post_backward_hook casts it first, on the reduce-scatter's stream
            # (torch/distributed/fsdp/_runtime_utils.py, ``flat_param.grad.to(handle._reduce_dtype)``, torch
            # 2.1 to 2.13)
            cast = plan.copies or plan.grad_bytes != plan.unsharded_grad_bytes
            copy_in = u.params * (plan.unsharded_grad_bytes + plan.grad_bytes) if cast else 0.0
            rid = add_reduction(
                "reduce_scatter",
                f"{u.name} grad reduce-scatter",
                computes[-1],
                plan.gather_group,
                nbytes,
                copy_in,
            )
            if plan.replicate_group:
                rid = add_reduction(
                    "all_reduce",
                    f"{u.name} grad all-reduce across replicas",
                    rid,
                    plan.replicate_group,
                    nbytes / plan.shard_size,
                )
            blocking = None if plan.overlap_reduce else rid
            reductions.append(rid)
    _step(p, s, w, us, plan, reductions)


def _step(
    p: Program,
    s: Scenario,
    w: Workload,
    us: list[Unit],
    plan: ShardingPlan,
    reductions: list[int],
    tensor_host_s: float = 0.0,
) -> None:
    """The optimizer step on the rank's shard, once every reduction is done (on the host with ZeRO-Offload);
    ``tensor_host_s`` more host seconds per parameter tensor (DeepSpeed ZeRO-3's step)."""
    params = sum(u.params for u in us) / plan.shard_size
    if not plan.offload_optimizer:
        tensors = parameter_tensors(s, w.num_layers, True, True)
        add_optimizer(p, s, params, reductions, w=w, tensors=tensors, tensor_host_s=tensor_host_s)
        return
    step = add_host_step(p, s, params, reductions)
    if not plan.offload_param:  # updated 16-bit shards back to the GPU for the next gathers
        add_param_copy(p, "updated weights to GPU", params * plan.weight_bytes, (step,), "optimizer")


# DeepSpeed ZeRO-3 keeps at most this many gradient-bucket reductions in flight past the one it launches: before
# launching another, the host synchronises on the oldest event once more are outstanding (stage3.py
# __reduce_and_partition_ipg_grads, max_param_reduce_events = 2, v0.6.2 to v0.16.4), so a bucket flush cannot run
# ahead of the reduction three flushes before it
MAX_REDUCE_EVENTS = 2
# Bytes per gathered element that DeepSpeed's coalesced all-gather copies on the GPU (partition_parameters.py,
# _all_gather_dtype and AllGatherCoalescedHandle.wait): the local shard into the flat buffer (1/N of a read and
# a write) and, on wait, each parameter out of the flat buffer (a read and a write); a single-parameter gather
# writes in place.
COALESCED_COPY_PER_BYTE = 2.0
# Bytes per reduced element copied around one reduce-scatter call (stage3.py __add_grad_to_ipg_bucket and
# runtime/comm/coalesced_collectives.py reduce_scatter_coalesced): the gradient into the bucket, the bucket into
# the per-rank flat buffer (a read and a write each).
REDUCE_COPY_PER_BYTE = 4.0
# Bytes per gathered byte FSDP2 copies out of the all-gather buffer into the unit's parameters (a read and a
# write; torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_all_gather_copy_out, torch 2.4-2.13)
FSDP_COPY_OUT_PER_BYTE = 2.0


def _fetched_iteration(p: Program, s: Scenario, w: Workload, us: list[Unit], plan: ShardingPlan) -> None:
    """ZeRO-3 as DeepSpeed's hooks drive it: the coordinator's all-gather calls in their order on the all-gather
    stream, each followed by its buffer copies, each sent by the hook of the module that issues it, so no
    earlier than the host has issued the compute before that module's unit (``Task.issued_after``: early
    where the host runs ahead, as the GPU gets there behind syncs); a unit's compute waits for the calls its
    modules wait for; gradient buckets reduce-scatter on the reduction stream as the module whose gradient
    overflows them ends its backward, the host holding back until the reduction MAX_REDUCE_EVENTS + 1 flushes
    earlier has ended."""
    f = plan.fetch
    gas = s.gradient_accumulation_steps
    wb = plan.weight_bytes
    reductions: list[int] = []
    setup: dict = {}
    # DeepSpeed's Python hooks around every module run on the host thread (measured: docs/deepspeed.md)
    hooked = ModuleHooks(f.modules, w.framework.host)

    def gather(g, mb: int, after: tuple, issued_after: int) -> int:
        # hpZ: a re-gather, or any gather after the first microbatch, reads the secondary (intra-node) shard
        secondary = plan.backward_gather_group is not None and (g.regather or mb > 0)
        group = plan.backward_gather_group if secondary else plan.gather_group
        # qwZ quantizes every fetch (partitioned_param_coordinator.py: quantize=self.zero_quantized_weights)
        per = plan.forward_gather_bytes or wb
        deps = after
        phase = g.block[1]
        if plan.offload_param:  # ZeRO-Infinity: the rank's shard comes from host memory or NVMe first
            where = "host" if plan.offload_param == "cpu" else "nvme"
            deps = (add_param_copy(p, "param fetch", g.numel * wb / plan.shard_size, deps, phase, where),)
        what = "prefetch" if g.prefetch else "fetch"
        gid = p.add(
            0,
            "comm.ag",
            "all_gather",
            phase,
            f"param {what} all-gather ({g.numel:,} elements)",
            deps,
            group=group,
            bytes=g.numel * per,
            issued_after=issued_after,
        )
        ops: tuple = ()
        if len(g.params) > 1:
            ops += (memory_op("all-gather buffer copies", COALESCED_COPY_PER_BYTE * wb * g.numel),)
        if plan.forward_extra_bytes_per_param:
            ops += (memory_op("qwZ dequantize weights", plan.forward_extra_bytes_per_param * g.numel),)
        if ops:
            gid = p.add(0, "comm.ag", "copy", phase, "gathered parameters to their buffers", (gid,), ops=ops)
        return gid

    # the calls each block's hooks issue (the trace is block after block, so this keeps the trace's order)
    issued_in: dict[tuple, list[int]] = {}
    for i, g in enumerate(f.gathers):
        issued_in.setdefault(g.block, []).append(i)
    reduces: dict[tuple, list] = {}
    for r in f.reduces:
        reduces.setdefault(r.block, []).append(r)

    def issue(block, mb: int, ids: dict[int, int], sync: tuple, last: int) -> None:
        """The block's own calls (``ids``: this microbatch's so far), issued by its hooks once the host has
        issued ``last``, the first after ``sync``."""
        for g in issued_in.get(block, ()):
            ids[g] = gather(f.gathers[g], mb, sync if not ids else (), last)

    def pieces(block, forward: bool, ops: tuple, ids: dict[int, int]) -> list[tuple[tuple, tuple]]:
        """(ops, gather tasks it waits for) of each piece of a block's compute, cut where a module's hook waits
        for gathers the compute has not waited for yet (strategy/zero3_waits.py)."""
        out: list[tuple[tuple, tuple]] = []
        start, deps = 0, ()
        for at, g in hook_waits.cuts(block, forward, ops):
            if at > start:
                out.append((ops[start:at], deps))
                start, deps = at, ()
            deps += (ids[g],)
        return [*out, (ops[start:], deps)]

    hook_waits = Waits(f)
    sync: tuple[int, ...] = ()
    waits: list[int] = []  # flushes the host has waited for before issuing the next compute
    last = -1  # the compute task the host issued last: the next block's hooks run after it
    for mb in range(gas):
        ids: dict[int, int] = {}
        hook_waits.reset()
        for i, u in enumerate(us):
            block = (u.index, "forward")
            issue(block, mb, ids, sync, last)
            ops = hooked(block, u.block.forward)
            ops = with_setup(w, ops, setup) if i == 0 else ops
            for k, (part, deps) in enumerate(pieces(block, True, ops, ids)):
                if k == 0:
                    last = add_forward(p, u, mb, deps, ops=part, sync=i == 0 and microbatch_sync(w))
                else:
                    last = p.add_compute(0, "forward", "forward", f"{u.name} forward", deps, part, mb)
        blocking = None
        flushed: list[int] = []  # this microbatch's bucket reductions, in launch order
        for u in reversed(us):
            block = (u.index, "backward")
            issue(block, mb, ids, sync, last)
            after = (blocking,) if blocking is not None else ()
            again = u.block.recompute_ops(u.recompute) if u.is_layer else ()
            for part, deps in pieces(block, True, again, ids) if again else ():
                last = p.add_compute(0, "recompute", "backward", recompute_name(u), after + deps, part, mb)
                after = ()
                if waits:
                    p.tasks[last].host_waits = (waits[-1],)
                    waits = []
            ops = hooked(block, u.block.backward)
            if plan.backward_extra_bytes_per_param:
                ops = (
                    memory_op("qgZ quantize gradients", plan.backward_extra_bytes_per_param * u.params),
                    *ops,
                )
            # the unit's backward in pieces, each ending where a module's gradient overflows the bucket: its hook
            # flushes the bucket there, the host first waiting for the flush MAX_REDUCE_EVENTS + 1 earlier
            # (stage3.py __reduce_and_partition_ipg_grads: param_reduce_events.popleft().synchronize()), so it
            # issues nothing after that module until then; and where a module's hook waits for gathers (above)
            flushes = reduces.get(block, [])
            cuts = module_ends(ops, [r.module for r in flushes])
            done = [False] * len(flushes)
            start = 0
            for part, deps in pieces(block, False, ops, ids):
                stop = start + len(part)
                for end in sorted({c for c in cuts if start < c < stop} | {stop}):
                    last = p.add_compute(
                        0, "backward", "backward", f"{u.name} backward", after + deps, ops[start:end], mb
                    )
                    after, deps, start = (), (), end
                    if waits:
                        p.tasks[last].host_waits = (waits[-1],)
                        waits = []
                    for j, cut in enumerate(cuts):
                        if cut != end or done[j]:
                            continue
                        done[j] = True
                        if len(flushed) >= MAX_REDUCE_EVENTS + 1:
                            waits.append(flushed[-1 - MAX_REDUCE_EVENTS])
                        rid = _reduce_bucket(p, plan, flushes[j].numel, last)
                        blocking = None if plan.overlap_reduce else rid
                        reductions.append(rid)
                        flushed.append(rid)
                        after = (blocking,) if blocking is not None else ()  # without overlap_comm
        waits = []  # the backward's epilogue waits for every reduction
        if mb < gas - 1 and reductions:
            # backward ends with the host waiting for its reductions (stage3.py
            # independent_gradient_partition_epilogue: reduce_and_partition_stream.synchronize()), so the next
            # microbatch's fetches and forward start after them
            last = p.add_compute(
                0, "backward", "backward", "gradient epilogue", (reductions[-1],), (), mb, True
            )
            sync = (last,)
    _step(p, s, w, us, plan, reductions, w.framework.host.zero3_tensor_step_s)


def _reduce_bucket(p: Program, plan: ShardingPlan, numel: int, after: int) -> int:
    """One gradient bucket: copies, then a reduce-scatter (or ZeRO++ qgZ's two all-to-alls) on the reduction
    stream; with ZeRO-Offload the rank's reduced shard goes to host memory."""
    gb = plan.grad_bytes
    rid = p.add(
        0,
        "comm.rs",
        "copy",
        "backward",
        "gradients to the bucket",
        (after,),
        ops=(memory_op("reduce bucket copies", REDUCE_COPY_PER_BYTE * gb * numel),),
    )
    if plan.quantized_reduce:
        intra, inter, size, per_param = plan.quantized_reduce
        rid = p.add(
            0,
            "comm.rs",
            "all_to_all",
            "backward",
            "qgZ intra-node all-to-all",
            (rid,),
            group=intra,
            bytes=numel * per_param,
        )
        rid = p.add(
            0,
            "comm.rs",
            "all_to_all",
            "backward",
            "qgZ inter-node all-to-all",
            (rid,),
            group=inter,
            bytes=numel * per_param / size,
        )
    else:
        rid = p.add(
            0,
            "comm.rs",
            "reduce_scatter",
            "backward",
            f"grad reduce-scatter ({numel:,} elements)",
            (rid,),
            group=plan.gather_group,
            bytes=numel * gb,
        )
    if plan.offload_optimizer:
        rid = add_grad_copy(p, "gradient bucket", rid, numel * gb / plan.shard_size)
    return rid
