"""DeepSpeed ZeRO-3's parameter fetching and gradient bucketing, replayed module by module.

DeepSpeed (v0.16.4, deepspeed/runtime/zero/parameter_offload.py) hooks every ``nn.Module``: before a module
runs forward or backward, ``PartitionedParameterCoordinator.fetch_sub_module``
(deepspeed/runtime/zero/partitioned_param_coordinator.py) all-gathers its own parameters that are not on the GPU,
in one coalesced call, then prefetches: it walks the recorded trace of (module, parameters) ahead and gathers up
to ``stage3_prefetch_bucket_size`` elements of not-yet-available parameters in one more call, unless
``stage3_max_live_parameters`` are already gathered. After the module, ``release_sub_module`` frees each of its
parameters unless it is persistent (at most ``stage3_param_persistence_threshold`` elements), the prefetcher has
already passed its next use, or it is used again within ``stage3_max_reuse_distance`` elements of the trace.
Under activation checkpointing the recomputed forward is part of the backward trace, so a released layer is
gathered again there.

Gradients (deepspeed/runtime/zero/stage3.py, ``reduce_independent_p_g_buckets_and_remove_grads``) go into a
bucket as each parameter's gradient is ready; a parameter that would overflow ``reduce_bucket_size`` first
flushes the bucket in one reduce-scatter, and the backward epilogue flushes the rest.

This module replays both for one microbatch (every microbatch of an iteration behaves alike: the trace is
reset at each forward) and returns the calls; :mod:`simulator.strategy.sharded` turns them into tasks.
Nothing here knows about SimPy or the program.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from functools import cache

# A block is where a module's compute lands in the program: (unit index, "forward" | "backward")
Block = tuple[int, str]


@dataclass(frozen=True)
class Module:
    """One module invocation in the trace: its own parameters (ids), where its compute lands, and whether
    DeepSpeed fetches it as forward (also in a recomputation) or backward."""

    name: str
    params: tuple[int, ...]
    block: Block
    forward: bool


@dataclass(frozen=True)
class Gather:
    """One coalesced all-gather call: the parameters it fetches and where it was issued."""

    step: int  # trace position of the module whose fetch issued it
    numel: int
    params: tuple[int, ...]
    prefetch: bool
    block: Block  # where the issuing module's compute lands (a recomputation's fetches land in backward)
    regather: bool  # every parameter was already gathered earlier in this microbatch (hpZ's secondary shard)


@dataclass(frozen=True)
class Reduce:
    """One gradient bucket flush: elements reduce-scattered and the block whose gradient triggered it."""

    numel: int
    block: Block
    module: str = ""  # the module whose backward readied that gradient: the hook flushes as it ends


@dataclass
class FetchSchedule:
    gathers: list[Gather]
    waits: dict[Block, list[int]]  # block -> gathers (indices) its modules wait for
    reduces: list[Reduce]
    peak_live: int  # most gathered (non-persistent) elements at once, as DeepSpeed counts them
    persistent: int  # elements of persistent parameters (kept whole on every rank)
    steps: int = 0  # module invocations per microbatch (each runs DeepSpeed's hooks)
    modules: list[Module] = field(default_factory=list)


def model_modules(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    ffn: int,
    vocab: int,
    seq: int,
    swiglu: bool,
    bias: bool,
    layernorm: bool,
    learned_positions: bool,
    tied: bool,
    fused: bool,
    recompute: bool,
) -> tuple[list[int], list[Module]]:
    """(numel of each parameter, the module trace of one forward and backward) of a GPT / Llama model on one
    tensor-parallel rank (pass sizes already divided by TP). ``fused``: Megatron's modules (query_key_value,
    dense, dense_h_to_4h, dense_4h_to_h); otherwise Hugging Face's (q/k/v/o_proj, gate/up/down_proj). Container
    modules (the layer, attention, MLP) have no parameters of their own but run the hooks and the prefetcher."""
    numel: list[int] = []

    def param(n: int) -> int:
        numel.append(n)
        return len(numel) - 1

    def linear(name: str, n_in: int, n_out: int, out_bias: int | None = None) -> tuple[str, tuple[int, ...]]:
        ps = (param(n_in * n_out),)
        if bias:
            ps += (param(n_out if out_bias is None else out_bias),)
        return name, ps

    def norm(name: str) -> tuple[str, tuple[int, ...]]:
        return name, (param(hidden), param(hidden)) if layernorm else (param(hidden),)

    q, kv = heads * head_dim, kv_heads * head_dim
    f_up = 2 * ffn if swiglu else ffn
    word = param(vocab * hidden)
    embed = [("embedding", ()), ("word_embeddings", (word,))]
    if learned_positions:
        embed.append(("position_embeddings", (param(seq * hidden),)))
    body: list[list[tuple[str, tuple[int, ...]]]] = []
    for i in range(layers):
        attn = (
            [
                linear("query_key_value", hidden, q + 2 * kv),
                ("core_attention", ()),
                linear("dense", q, hidden, hidden),
            ]
            if fused
            else [
                linear("q_proj", hidden, q),
                linear("k_proj", hidden, kv),
                linear("v_proj", hidden, kv),
                ("attention", ()),
                linear("o_proj", q, hidden, hidden),
            ]
        )
        if fused:
            mlp = [linear("dense_h_to_4h", hidden, f_up), linear("dense_4h_to_h", ffn, hidden, hidden)]
        elif swiglu:
            mlp = [
                linear("gate_proj", hidden, ffn),
                linear("up_proj", hidden, ffn),
                linear("down_proj", ffn, hidden),
            ]
        else:
            mlp = [linear("fc1", hidden, ffn), linear("fc2", ffn, hidden)]
        body.append(
            [(f"layer {i}", ()), norm("input_layernorm"), ("self_attention", ()), *attn]
            + [norm("post_attention_layernorm"), ("mlp", ()), *mlp]
        )
    head = [norm("final_layernorm"), ("output_layer", (word if tied else param(vocab * hidden),))]

    def run(unit: int, mods, phase: str, forward: bool) -> list[Module]:
        order = mods if forward else reversed(mods)
        return [Module(n, ps, (unit, phase), forward) for n, ps in order]

    trace = run(0, embed, "forward", True)
    for i, mods in enumerate(body):
        trace += run(i + 1, mods, "forward", True)
    trace += run(layers + 1, head, "forward", True)
    trace += run(layers + 1, head, "backward", False)
    for i in reversed(range(layers)):
        if recompute:  # the checkpointed layer runs forward again (forward hooks) before its backward
            trace += run(i + 1, body[i], "backward", True)
        trace += run(i + 1, body[i], "backward", False)
    trace += run(0, embed, "backward", False)
    return numel, trace


def replay(
    numel: list[int],
    trace: list[Module],
    *,
    prefetch_bucket: float,
    max_live: float,
    max_reuse: float,
    persistence_threshold: float,
    model_persistence_threshold: float = float("inf"),
    reduce_bucket: float,
) -> FetchSchedule:
    """Replay DeepSpeed's coordinator (complete trace, steady state) and gradient bucketing on one
    microbatch's ``trace``."""
    # mark_persistent_parameters: in registration order, small parameters until the model-wide budget is spent
    persist = [False] * len(numel)
    budget = 0
    for pid, n in enumerate(numel):
        if n + budget > model_persistence_threshold:
            continue
        if n <= persistence_threshold:
            persist[pid] = True
            budget += n

    steps = len(trace)
    # each module's parameters once: as listed, as a set, sorted (the coordinator's order), and their elements
    own_params = [m.params for m in trace]
    own_sets = [set(ps) for ps in own_params]
    # prefix sums of each module's parameter elements (persistent ones count too: iter_params sees them)
    prefix = [0] * (steps + 1)
    for k, ps in enumerate(own_params):
        prefix[k + 1] = prefix[k] + sum(numel[p] for p in ps)
    # next use of each (step, parameter) after that step
    next_use: list[dict[int, int]] = [{} for _ in range(steps)]
    seen: dict[int, int] = {}
    for k in range(steps - 1, -1, -1):
        for p in own_params[k]:
            if p in seen:
                next_use[k][p] = seen[p]
            seen[p] = k

    NOT_AVAILABLE, INFLIGHT, AVAILABLE = 0, 1, 2
    NEVER = -(10**18)
    status = [AVAILABLE if persist[p] else NOT_AVAILABLE for p in range(len(numel))]
    handle: dict[int, int] = {}  # in-flight parameter -> gather index
    gathered_before: set[int] = set()
    queue = deque((p, k) for k, own in enumerate(own_sets) for p in sorted(own))
    most_recent: dict[int, int] = {}
    live = peak = 0
    gathers: list[Gather] = []
    waits: dict[Block, list[int]] = {}

    def all_gather(step: int, todo: list[int], prefetch: bool, block: Block) -> None:
        """One coalesced call for ``todo`` (sorted, every one not available)."""
        nonlocal live, peak
        # DeepSpeed gathers parameters that already have a secondary (hpZ) shard apart from those without
        for again in (False, True):
            part = tuple(p for p in todo if (p in gathered_before) == again)
            if not part:
                continue
            n = sum(numel[p] for p in part)
            for p in part:
                status[p], handle[p] = INFLIGHT, len(gathers)
            gathers.append(Gather(step, n, part, prefetch, block, again))
            live += n
        gathered_before.update(todo)
        peak = max(peak, live)

    for k, m in enumerate(trace):
        own = own_sets[k]
        if not own:  # a container module: no fetch, no wait, no release; the prefetcher still runs
            pending_count = 0
        else:
            todo = sorted(p for p in own if status[p] == NOT_AVAILABLE)
            if todo:
                all_gather(k, todo, False, m.block)
            for p in own:  # wait for in-flight parameters (their gather, or an earlier prefetch)
                if status[p] == INFLIGHT:
                    g = handle.pop(p)
                    w = waits.setdefault(m.block, [])
                    if g not in w:
                        w.append(g)
                    status[p] = AVAILABLE
            pending_count = sum(1 for p in own if most_recent.get(p, NEVER) < k)
        # pop this module's own parameters off the prefetch queue
        popped: set[int] = set()
        while queue and len(popped) < pending_count:
            p, used_at = queue.popleft()
            most_recent[p] = used_at
            popped.add(p)
        # prefetch: up to the bucket of not-available parameters, ahead in the trace
        if prefetch_bucket > 0:
            limit = min(max_live - live, prefetch_bucket)
            chosen: list[int] = []
            count = 0
            while queue and count < limit:
                p, used_at = queue.popleft()
                if status[p] == NOT_AVAILABLE and p not in chosen:
                    chosen.append(p)
                    count += numel[p]
                recent = most_recent.get(p, NEVER)
                if used_at > recent:
                    most_recent[p] = used_at
            if chosen:
                all_gather(k, sorted(chosen), True, m.block)
        # release after the module (step id is now k + 1)
        for p in own:
            if persist[p] or status[p] != AVAILABLE:
                continue
            if most_recent.get(p, NEVER) > k + 1:
                continue  # the prefetcher already passed its next use
            j = next_use[k].get(p)
            if j is not None and j > k and prefix[j] - prefix[k + 1] < max_reuse:
                continue  # reused soon
            status[p] = NOT_AVAILABLE
            live -= numel[p]

    # gradient buckets, in the order gradients become ready (a parameter's last backward use)
    last_backward: dict[int, int] = {}
    for k, m in enumerate(trace):
        if not m.forward:
            for p in m.params:
                last_backward[p] = k
    reduces: list[Reduce] = []
    in_bucket = 0
    for p, k in sorted(last_backward.items(), key=lambda kv: (kv[1], kv[0])):
        if in_bucket + numel[p] > reduce_bucket and in_bucket > 0:
            reduces.append(Reduce(in_bucket, trace[k].block, trace[k].name))
            in_bucket = 0
        in_bucket += numel[p]
    if in_bucket:  # independent_gradient_partition_epilogue
        reduces.append(Reduce(in_bucket, trace[-1].block))
    return FetchSchedule(
        gathers,
        waits,
        reduces,
        peak,
        sum(n for p, n in enumerate(numel) if persist[p]),
        steps,
        trace,
    )


@cache
def schedule_for(key: tuple, knobs: tuple) -> FetchSchedule:
    """Cached :func:`replay` of :func:`model_modules` (``key`` and ``knobs`` are their keyword items)."""
    numel, trace = model_modules(**dict(key))
    return replay(numel, trace, **dict(knobs))


# What the planner's screen needs of a replay is only how many calls of each size each pass makes
# (simulator/study/screen.py); that it can get without replaying every layer.
CallSizes = Counter  # ("all_gather" | "reduce_scatter", "forward" | "backward", elements) -> calls


@cache
def call_sizes(key: tuple, knobs: tuple) -> CallSizes:
    """The calls of :func:`schedule_for` counted by (operation, pass, elements), for a deep model from shallow
    replays. The layers are alike, so away from the model's ends (farther than the coordinator's windows, the
    prefetch bucket and the reuse distance, reach) a layer's calls repeat layer after layer, and a layer more
    adds one such layer's calls. A model of ``shallow`` layers is replayed (a window's worth of layers at each
    end, three between), then one of ``shallow + 1``: where the three middle layers of the first made the same
    calls and the second added exactly those, the deep model's gathers are the shallow one's plus ``layers -
    shallow`` middle layers'. Otherwise (a period longer than a layer, windows as wide as the model, a
    model-wide persistence budget that runs out at some depth) the whole model is replayed. Gradient buckets
    fill in the order gradients become ready, which does not repeat per layer (a bucket holds a fraction of
    layers), so they are packed over the deep model's order, built from the shallow one's with a middle layer
    repeated. tests/test_zero3_fetch.py checks the counts against whole replays."""
    args, k = dict(key), dict(knobs)
    layers = args["layers"]
    numel, trace = model_modules(**{**args, "layers": 1})
    own = [numel[p] for p in {p for m in trace if m.block[0] == 1 for p in m.params}]
    per_layer = sum(own)
    span = max(k["prefetch_bucket"], k["max_reuse"], 1.0)
    window = math.ceil(span / max(per_layer, 1)) + 1  # layers a window can reach
    shallow = 2 * window + 3
    # the persistent parameters are the small ones unless their elements together pass the model-wide budget
    small = [n for n in numel if n <= k["persistence_threshold"]]
    small_layer = sum(n for n in own if n <= k["persistence_threshold"])
    within = sum(small) + (layers - 1) * small_layer <= k["model_persistence_threshold"]
    if shallow + 1 >= layers or not within:
        return _counted(schedule_for(key, knobs))
    built = [model_modules(**{**args, "layers": n}) for n in (shallow, shallow + 1)]
    first, second = (replay(numel, trace, **k) for numel, trace in built)
    mid = shallow // 2 + 1  # a middle layer's unit (the embedding is unit 0, layer i unit i + 1)
    middle = _gathers(first, mid)
    if not middle or any(_gathers(first, u) != middle for u in range(window + 1, shallow - window + 1)):
        return _counted(schedule_for(key, knobs))
    out = _gathers(first)
    if _gathers(second) != out + middle:
        return _counted(schedule_for(key, knobs))
    for c, n in middle.items():
        out[c] += n * (layers - shallow)
    ready = _ready(*built[0])
    at = next(i for i, (u, _) in enumerate(ready) if u == mid)
    one = [n for u, n in ready if u == mid]
    order = [n for _, n in ready[:at]] + one * (layers - shallow) + [n for _, n in ready[at:]]
    in_bucket = 0
    for n in order:  # as replay() fills the buckets
        if in_bucket + n > k["reduce_bucket"] and in_bucket > 0:
            out[("reduce_scatter", "backward", in_bucket)] += 1
            in_bucket = 0
        in_bucket += n
    if in_bucket:
        out[("reduce_scatter", "backward", in_bucket)] += 1
    return out


def _counted(fs: FetchSchedule) -> CallSizes:
    out = _gathers(fs)
    out.update(("reduce_scatter", "backward", r.numel) for r in fs.reduces)
    return out


def _gathers(fs: FetchSchedule, unit: int | None = None) -> CallSizes:
    """The gathers of ``fs`` (those issued in ``unit``'s blocks only, if given) counted by pass and size."""
    return Counter(
        ("all_gather", g.block[1], g.numel) for g in fs.gathers if unit is None or g.block[0] == unit
    )


def _ready(numel: list[int], trace: list[Module]) -> list[tuple[int, int]]:
    """(unit, elements) of each parameter in the order its gradient becomes ready (its last backward use, ties
    by parameter), as :func:`replay` fills the buckets."""
    last: dict[int, tuple[int, int]] = {}
    for k, m in enumerate(trace):
        if not m.forward:
            for p in m.params:
                last[p] = (k, m.block[0])
    return [(unit, numel[p]) for p, (_, unit) in sorted(last.items(), key=lambda kv: (kv[1][0], kv[0]))]
