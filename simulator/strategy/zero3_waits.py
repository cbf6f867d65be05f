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
    """The index of the first op of module ``name`` in ``ops`` (None where the module has no op of its own):
    forward, the op MODULE_OPS names; backward, the first of its gradients (``qkv projection dgrad``)."""
    if name in ATTENTION_MODULES:
        found = (i for i, op in enumerate(ops) if op.name.startswith(ATTENTION_STARTS[forward]))
    elif name in MODULE_OPS and forward:
        found = (i for i, op in enumerate(ops) if op.name == MODULE_OPS[name])
    elif name in MODULE_OPS:
        found = (i for i, op in enumerate(ops) if op.name.startswith(f"{MODULE_OPS[name]} "))
    else:
        return None
    return next(found, None)


class Waits:
    """The gathers each piece of a unit's compute waits for, per microbatch (``reset``), from the coordinator's
    replay ``fs``."""

    def __init__(self, fs: FetchSchedule):
        cover = covers(fs)
        self.modules: dict[tuple[Block, bool], list[tuple[str, bool, int]]] = {}
        for m, c in zip(fs.modules, cover, strict=True):
            self.modules.setdefault((m.block, m.forward), []).append((m.name, bool(m.params), c))
        self.seen = -1
        self._kept: dict[tuple, tuple] = {}

    def reset(self) -> None:
        """A new microbatch: its trace starts again (the coordinator resets it at each forward)."""
        self.seen = -1

    def cuts(self, block: Block, forward: bool, ops: tuple) -> list[tuple[int, int]]:
        """(op index, gather index) where the compute of ``block``'s modules that run ``forward`` (forward or
        recomputation; else backward) in ``ops`` must wait for a later gather than any it has waited for this
        microbatch, in order; op index 0 is the piece's start. A container begins where its next module
        begins; a module with parameters but no op of its own here (embedding, output layer) at the previous
        module's start, so it never waits later than it does."""
        mods = self.modules.get((block, forward), [])
        out: dict[int, int] = {}
        for at, (_, _, cover) in zip(self._starts(block, forward, ops), mods, strict=True):
            if cover > self.seen:
                self.seen = cover
                out[at] = cover
        return sorted(out.items())

    def _starts(self, block: Block, forward: bool, ops: tuple) -> list[int]:
        """Where each of the block's modules begins in ``ops`` (kept per ops tuple: every microbatch asks)."""
        key = (block, forward, id(ops))
        if key not in self._kept:
            mods = self.modules.get((block, forward), [])
            found: list[int | None] = [_start(name, ops, forward) for name, _, _ in mods]
            starts, previous = [], 0
            for k, (_, has_params, _) in enumerate(mods):
                at = found[k]
                if at is None and not has_params:  # a container: at its next module's start
                    at = next((s for s in found[k + 1 :] if s is not None), None)
                previous = previous if at is None else max(at, previous)
                starts.append(previous)
            self._kept[key] = (ops, starts)  # the tuple kept alive, so its id is not reused
        return self._kept[key][1]
