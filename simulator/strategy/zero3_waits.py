"""Where DeepSpeed ZeRO-3's compute waits for its all-gathers: at the hook of each module whose parameters a
gather brings, not at the start of the unit.

``PartitionedParameterCoordinator.fetch_sub_module`` (deepspeed/runtime/zero/partitioned_param_coordinator.py,
v0.6.2 lines 226-246, v0.16.4 lines 322-343) runs before every module (stage3.py ``_register_hooks_recursively``
hooks each submodule): it waits on the all-gather stream for the handle of each of the module's own parameters
still in flight (``AllGatherCoalescedHandle.wait``: torch's ``Work.wait`` makes that stream wait for the NCCL
stream up to that call), then makes the compute stream wait for the all-gather stream (``wait_stream``). NCCL runs
the calls one after another in the order they were launched, so the module's kernels start once the last gather
any module up to it has waited for has ended, and gathers prefetched for modules further on go on meanwhile.
A unit's compute is cut at the modules where that gather moves on (:func:`covers`, :class:`Waits`), each piece
after its gather, instead of the whole unit waiting at its start for every gather its modules wait for.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from simulator.strategy.zero3_fetch import Block, FetchSchedule
from simulator.strategy.zero3_hooks import MODULE_OPS

# Where a module without an entry in MODULE_OPS begins in a unit's ops: core attention at its first kernel
# (workload/attention.py: the unfused scores GEMM or the flash kernel), forward and in the backward
ATTENTION_STARTS = {
    True: ("attention scores", "flash attention"),
    False: ("attention context PV dgrad", "flash attention backward"),
}
ATTENTION_MODULES = ("core_attention", "attention")


def covers(fs: FetchSchedule) -> list[int]:
    """For each module of the trace, the last gather (index into ``fs.gathers``, -1 for none) whose handle its
    hook waits for: each gather is waited for by the first module after it was issued (at or after, for a
    module's own fetch) that owns one of its parameters."""
    uses: dict[int, list[int]] = {}
    for k, m in enumerate(fs.modules):
        for p in m.params:
            uses.setdefault(p, []).append(k)
    out = [-1] * fs.steps
    for i, g in enumerate(fs.gathers):
        for p in g.params:
            steps = uses.get(p, [])
            j = (bisect_right if g.prefetch else bisect_left)(steps, g.step)
            if j < len(steps):
                out[steps[j]] = max(out[steps[j]], i)
    return out


def _start(name: str, ops: tuple, forward: bool) -> int | None:
    """The index of the first op of module ``name`` in ``ops`` (None where the module has no op of its own)."""
    if name in ATTENTION_MODULES:
        prefixes = ATTENTION_STARTS[forward]
    elif name in MODULE_OPS:
        prefixes = (MODULE_OPS[name] if forward else f"{MODULE_OPS[name]} ",)
    else:
        return None
    for i, op in enumerate(ops):
        if (
            (op.name == prefixes[0])
            if forward and name not in ATTENTION_MODULES
            else op.name.startswith(prefixes)
        ):
            return i
    return None


class Waits:
    """The gathers each piece of a unit's compute waits for, per microbatch (``reset``), from the coordinator's
    replay ``fs``."""

    def __init__(self, fs: FetchSchedule):
        cover = covers(fs)
        self.modules: dict[tuple[Block, bool], list[tuple[str, bool, int]]] = {}
        for m, c in zip(fs.modules, cover, strict=True):
            self.modules.setdefault((m.block, m.forward), []).append((m.name, bool(m.params), c))
        self.seen = -1

    def reset(self) -> None:
        """A new microbatch: its trace starts again (the coordinator resets it at each forward)."""
        self.seen = -1

    def cuts(self, block: Block, forward: bool, ops: tuple) -> list[tuple[int, int]]:
        """(op index, gather index) where the compute of ``block``'s modules that run ``forward`` (forward or
        recomputation; else backward) in ``ops`` must wait for a later gather than any it has waited for this
        microbatch, in order; op index 0 is the piece's start. A container begins where its next module begins; a module with parameters
        but no op of its own here (embedding, output layer) at the previous module's start, so it never waits
        later than it does."""
        mods = self.modules.get((block, forward), [])
        starts: list[int | None] = [_start(name, ops, forward) for name, _, _ in mods]
        out: dict[int, int] = {}
        previous = 0
        for k, (_, has_params, cover) in enumerate(mods):
            at = starts[k]
            if at is None and not has_params:  # a container: at its next module's start
                at = next((s for s in starts[k + 1 :] if s is not None), None)
            at = previous if at is None else max(at, previous)
            previous = at
            if cover > self.seen:
                self.seen = cover
                out[at] = cover
        return sorted(out.items())
