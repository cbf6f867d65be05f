"""DeepSpeed ZeRO-3 as its hooks drive it (deepspeed/runtime/zero/stage3.py, partitioned_param_coordinator.py,
v0.6.2 to v0.16.4): the coordinator's all-gathers module by module (strategy/zero3_fetch.py), each module's
compute waiting for its own (zero3_waits.py), gradient buckets reduce-scattered as the module that overflows them
ends its backward (zero3_hooks.py), the host's brakes on both, and the step on the rank's shard
(strategy/sharded.py's plan and step, shared with FSDP2)."""

from __future__ import annotations

from simulator.program import Program
from simulator.scenario.schema import Scenario
from simulator.strategy.offload import add_grad_copy, add_param_copy
from simulator.strategy.sharded import ShardingPlan, shard_step
from simulator.strategy.steps import add_forward, microbatch_sync, recompute_name, with_setup
from simulator.strategy.units import Unit
from simulator.strategy.zero3_hooks import ModuleHooks, module_ends
from simulator.strategy.zero3_waits import Waits
from simulator.workload.ops import memory_op
from simulator.workload.transformer import Workload

# DeepSpeed ZeRO-3 keeps at most this many gradient-bucket reductions in flight past the one it launches: before
# launching another, the host synchronises on the oldest event once more are outstanding (stage3.py
# __reduce_and_partition_ipg_grads, max_param_reduce_events = 2, v0.6.2 to v0.16.4), so a bucket flush cannot run
# ahead of the reduction three flushes before it
MAX_REDUCE_EVENTS = 2
# DeepSpeed ZeRO-3 issues its parameter all-gathers (from the all-gather stream) and its gradient reduce-scatters
# (from the reduction stream) on one process group, the data-parallel one (zero.Init's data_parallel_group and the
# engine's dp_process_group, v0.6.2 to v0.16.4), and PyTorch's ProcessGroupNCCL runs every collective of a group
# on that group's one NCCL stream per device, in the order the host issued them: an all-gather prefetched in the
# backward waits behind the reduce-scatters issued before it, and the other way round. The copies around them stay
# on their CUDA streams.
DP_NCCL_STREAM = "comm.nccl.dp"
# Bytes per gathered element that DeepSpeed's coalesced all-gather copies on the GPU (partition_parameters.py,
# _all_gather_dtype and AllGatherCoalescedHandle.wait): the local shard into the flat buffer (1/N of a read and
# a write) and, on wait, each parameter out of the flat buffer (a read and a write); a single-parameter gather
# writes in place.
COALESCED_COPY_PER_BYTE = 2.0
# Bytes per reduced element copied around one reduce-scatter call (stage3.py __add_grad_to_ipg_bucket and
# runtime/comm/coalesced_collectives.py reduce_scatter_coalesced): the gradient into the bucket, the bucket into
# the per-rank flat buffer (a read and a write each).
REDUCE_COPY_PER_BYTE = 4.0


def add_fetched_iteration(p: Program, s: Scenario, w: Workload, us: list[Unit], plan: ShardingPlan) -> None:
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
            DP_NCCL_STREAM,
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
                        if plan.offload_optimizer == "cpu" and mb == gas - 1:
                            # ZeRO-Offload copies each reduced fp32 gradient partition into the host's optimizer
                            # buffer with a blocking copy_ at the accumulation boundary (stage3.py __partition_grads
                            # v0.6.2 line 1706, partition_grads v0.16.4 line 1515: fp32_grad_tensor.copy_(...),
                            # no non_blocking): the host waits for this bucket's reduction before issuing more
                            waits.append(rid)
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
    shard_step(p, s, w, us, plan, reductions, w.framework.host.zero3_tensor_step_s)


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
            DP_NCCL_STREAM,
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
