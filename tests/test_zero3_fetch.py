"""DeepSpeed ZeRO-3's coordinator replayed against what its logic gives by hand (partitioned_param_coordinator.py
and stage3.py, v0.16.4), and the calls of a whole iteration."""

import sys
from collections import Counter

import pytest
from conftest import make

from simulator import simulate
from simulator.strategy import zero3_fetch
from simulator.strategy.units import parameter_tensors, units
from simulator.strategy.zero3_fetch import Module, call_sizes, model_modules, replay, schedule_for


def four_modules():
    """Parameters p0..p3 of 100, 200, 300 and 400 elements, one per module M0..M3 (units 0..3), run forward
    then backward."""
    numel = [100, 200, 300, 400]
    fwd = [Module(f"M{i}", (i,), (i, "forward"), True) for i in range(4)]
    bwd = [Module(f"M{i}", (i,), (i, "backward"), False) for i in reversed(range(4))]
    return numel, fwd + bwd


def test_prefetch_bucket_reuse_distance_and_gradient_buckets_by_hand():
    """prefetch bucket 250, reuse distance 0, reduce bucket 450, nothing persistent. By hand:

    step 0 (M0 fwd): fetch [p0] (call 0). Prefetch pops (p1, used at step 1) and (p2, step 2): 500 >= 250, one
      call [p1, p2] (call 1). p0 is released (next use at step 7, beyond distance 0): live 500.
    step 1 (M1 fwd): waits for call 1. Prefetch [p3] (call 2, 400). p1 released.
    step 2 (M2 fwd): waits for call 1. Prefetch pops (p3, step 4) in flight, (p2, step 5) available, then
      (p1, step 6) and (p0, step 7), not available: call 3 [p0, p1] (300), live peaks at 1000. p2 is KEPT: the
      prefetcher already passed its next use (step 5 > step id 3).
    step 3 (M3 fwd): waits for call 2; p3 released (its use at step 4 is at distance 0, not below 0).
    step 4 (M3 bwd): fetch [p3] again (call 4). Steps 5-7: p2 available, p1 and p0 wait for call 3.
    Gradients ready p3, p2, p1, p0: 400 | 300 (400 + 300 > 450) | 200 + 100 (300 + 200 > 450), flushed at
    M2's and M1's backward, the rest by the epilogue."""
    numel, trace = four_modules()
    f = replay(
        numel,
        trace,
        prefetch_bucket=250,
        max_live=float("inf"),
        max_reuse=0,
        persistence_threshold=0,
        reduce_bucket=450,
    )
    assert [(g.params, g.numel, g.prefetch, g.regather) for g in f.gathers] == [
        ((0,), 100, False, False),
        ((1, 2), 500, True, False),
        ((3,), 400, True, False),
        ((0, 1), 300, True, True),
        ((3,), 400, False, True),
    ]
    assert sum(g.numel for g in f.gathers) == 1700
    assert f.waits == {
        (0, "forward"): [0],
        (1, "forward"): [1],
        (2, "forward"): [1],
        (3, "forward"): [2],
        (3, "backward"): [4],
        (1, "backward"): [3],
        (0, "backward"): [3],
    }
    assert [(r.numel, r.block) for r in f.reduces] == [
        (400, (2, "backward")),
        (300, (1, "backward")),
        (300, (0, "backward")),
    ]
    assert f.peak_live == 1000


def test_max_live_parameters_stops_the_prefetcher():
    """With stage3_max_live_parameters 500 the prefetch at step 0 may add min(500 - 100, 250) elements: it pops
    p1 (200 < 250) and p2 (500): one call of 500 all the same (the limit is checked before each pop). After p0's
    release 500 are live, so step 1 prefetches nothing; p1's release leaves 300, and step 2 may prefetch
    min(500 - 300, 250) = 200 elements: p3 (400), in a call of its own."""
    numel, trace = four_modules()
    f = replay(
        numel,
        trace,
        prefetch_bucket=250,
        max_live=500,
        max_reuse=0,
        persistence_threshold=0,
        reduce_bucket=1e9,
    )
    assert [(g.params, g.step, g.prefetch) for g in f.gathers][:3] == [
        ((0,), 0, False),
        ((1, 2), 0, True),
        ((3,), 2, True),
    ]
    assert [r.numel for r in f.reduces] == [1000]  # one bucket, flushed by the epilogue


def test_persistent_parameters_are_never_gathered():
    numel, trace = four_modules()
    f = replay(
        numel,
        trace,
        prefetch_bucket=0,
        max_live=1e9,
        max_reuse=1e9,
        persistence_threshold=250,
        reduce_bucket=1e9,
    )
    assert {p for g in f.gathers for p in g.params} == {2, 3}
    assert f.persistent == 300


GPT = {
    "num_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "seq_length": 256,
    "vocab_size": 1024,
    "tied_embeddings": True,
}


def test_a_small_gpt_is_gathered_in_one_call_per_microbatch_and_reduced_in_one_bucket():
    """DeepSpeed's defaults on a model far below stage3_prefetch_bucket_size (5e7 elements): the first module's
    fetch prefetches every parameter above the persistence threshold (1e5 elements) in one coalesced call, the
    reuse distance (1e9) keeps them all until backward, and reduce_bucket_size (5e8) holds every gradient, so
    each microbatch is one all-gather and one reduce-scatter. The ideal profile splits layers as Hugging Face
    does: the two MLP matrices (256 x 1,024 = 262,144 elements each) and the 1,024 x 256 word embedding are
    gathered; q/k/v/o_proj (65,536 each), the position embedding (65,536), biases and norms persist."""
    r = simulate(
        make(
            model=GPT,
            cluster={"gpus_per_node": 2},
            training={"global_batch_size": 8},
            parallelism={"zero_stage": 3},
        )
    )
    h = 256
    gathered = 2 * (4 * h * h + 4 * h * h) + 1024 * h  # per layer the two MLP matrices
    ags = [t for t in r.program.tasks if t.kind == "all_gather"]
    rss = [t for t in r.program.tasks if t.kind == "reduce_scatter"]
    microbatches = 8 // 2
    assert len(ags) == microbatches and all(t.bytes == 2 * gathered for t in ags)
    psi = r.workload.params_per_rank
    assert len(rss) == microbatches and all(t.bytes == 2 * psi for t in rss)


def test_recomputation_gathers_a_layer_again_when_it_exceeds_the_reuse_distance():
    """Activation checkpointing puts each layer's forward back into the backward trace. With a reuse distance
    below one layer's weights, a layer released after forward is gathered again by its recomputation (as
    forward fetches); its backward then reuses only the last module (dense_4h_to_h, whose backward comes right
    after its recomputation) and gathers QKV, the projection and dense_h_to_4h a third time, each more than
    1e5 elements of trace away from its next use. The word embedding, used first and last, is gathered again
    too; the output layer's backward follows its forward at once and keeps it."""
    dims = dict(
        layers=2,
        hidden=512,
        heads=8,
        kv_heads=8,
        head_dim=64,
        ffn=2048,
        vocab=1024,
        seq=128,
        swiglu=False,
        bias=False,
        layernorm=True,
        learned_positions=False,
        tied=False,
        fused=True,
    )
    knobs = dict(
        prefetch_bucket=0, max_live=1e12, max_reuse=1e5, persistence_threshold=1e4, reduce_bucket=5e8
    )
    h = 512
    layer, fc2 = 12 * h * h, 4 * h * h
    for recompute, expected in ((False, 2 * layer), (True, 2 * layer + 2 * (layer - fc2))):
        numel, trace = model_modules(**dims, recompute=recompute)
        f = replay(numel, trace, **knobs)
        backward = sum(g.numel for g in f.gathers if g.block[1] == "backward")
        assert backward == expected + 1024 * h
        assert any(m.forward and m.block[1] == "backward" for m in trace) == recompute


def test_deepspeed_hooks_cost_host_time_per_module_invocation():
    """DeepSpeed's hooks run around every module (measured on an H100 host: docs/deepspeed.md). A 2-layer GPT in
    Hugging Face's layout runs 29 modules forward (embedding container, word and position embeddings; per layer
    the layer, 2 norms, attention container, q/k/v/o_proj, the attention, MLP container, fc1, fc2; final norm,
    output layer) and the same 29 in backward; the step adds a cost per parameter tensor."""
    s = make(
        model=GPT,
        cluster={"gpus_per_node": 2},
        training={"global_batch_size": 2},
        parallelism={"zero_stage": 3},
    )
    r = simulate(s.model_copy(update={"framework": "pytorch-2024"}))
    host = r.workload.framework.host
    hooks = [op.host_s for t in r.program.tasks for op in t.ops if op.name == "DeepSpeed ZeRO-3 module hooks"]
    per_microbatch = 29 * host.zero3_module_forward_s + 29 * host.zero3_module_backward_s
    assert sum(hooks) == pytest.approx(per_microbatch, rel=1e-12)
    (step,) = [t for t in r.program.tasks if t.kind == "optimizer"]
    (loops,) = [op.host_s for op in step.ops if op.kind == "host"]
    tensors = parameter_tensors(r.scenario, 2, True, True)
    assert loops == pytest.approx(tensors * (host.optimizer_tensor_s + host.zero3_tensor_step_s), rel=1e-12)


def test_zero3_calls_go_out_as_the_host_reaches_the_hooks_and_at_most_three_reductions_fly():
    """DeepSpeed's coordinator issues each all-gather from a module's hook, so a call starts no earlier than the
    host has issued the compute before that module's layer; before flushing a gradient bucket the host
    synchronises on the reduction three flushes back (stage3.py: more than max_param_reduce_events = 2
    outstanding), so it issues nothing more until then. On a slow network with one bucket per matrix the
    reductions fall behind and that wait binds."""
    s = make(
        model={**GPT, "num_layers": 4},
        cluster={"num_nodes": 2, "gpus_per_node": 1, "nic_bandwidth_gbps": 10.0},
        training={"global_batch_size": 2},
        parallelism={"zero_stage": 3, "zero": {"reduce_bucket_size": 1e5, "overlap_comm": True}},
    )
    r = simulate(s.model_copy(update={"framework": "pytorch-2024"}))
    tl, tasks = r.timeline, r.program.tasks
    gathers = [t for t in tasks if t.kind == "all_gather"]
    assert gathers and all(t.issued_after >= 0 for t in gathers[1:])
    assert all(tl.start[t.id] >= tl.issued[t.issued_after] for t in gathers if t.issued_after >= 0)
    reductions = [t.id for t in tasks if t.kind == "reduce_scatter"]
    assert len(reductions) >= 8
    waiting = [t for t in tasks if t.host_waits]
    assert waiting
    for t in waiting:
        (r3,) = t.host_waits
        assert reductions.index(r3) <= len(reductions) - 4  # three more were launched after it
        assert tl.issued[t.id] >= tl.end[r3]
    # the wait binds: some step's host resumed only when a reduction ended, leaving the GPU idle
    assert any(tl.host_idle[t.id] > 0 and tl.start[t.id] >= tl.end[t.host_waits[0]] for t in waiting)


def test_a_bucket_is_flushed_as_the_module_that_fills_it_ends_its_backward():
    """stage3.py hooks each parameter's AccumulateGrad, which autograd runs as soon as it has issued that
    module's weight gradient: a layer's buckets go out while the layer's backward goes on, each right after the
    GEMM of the module whose gradient overflowed it, not after the whole layer; the layer's backward is cut
    there, nothing of it lost or repeated. By hand (Hugging Face's modules, bucket 1e5 elements; backward order
    fc2 w 262,144 + b 256, fc1 w 262,144 + b 1,024, layernorm, o_proj 65,536 + 256, v/k/q_proj 65,536 + 256
    each): fc2's weight and bias each overflow the bucket (2 flushes at fc2), so do fc1's (2 at fc1), then
    v_proj, k_proj and q_proj each push it past 1e5 (3 flushes, all at the fused QKV GEMM)."""
    s = make(
        model={**GPT, "num_layers": 4},
        cluster={"num_nodes": 2, "gpus_per_node": 1},
        training={"global_batch_size": 2},
        parallelism={"zero_stage": 3, "zero": {"reduce_bucket_size": 1e5, "overlap_comm": True}},
    )
    r = simulate(s.model_copy(update={"framework": "pytorch-2024"}))
    tl, tasks = r.timeline, r.program.tasks
    pieces = [t for t in tasks if t.name == "layer 2 backward"]
    flushes = [t for t in tasks if t.name == "gradients to the bucket" and tasks[t.deps[0]] in pieces]
    assert [tasks[t.deps[0]].ops[-1].name for t in flushes] == [
        *["mlp down projection wgrad"] * 2,
        *["mlp up projection wgrad"] * 2,
        *["qkv projection wgrad"] * 3,
    ]
    assert len(pieces) == 4
    assert tl.start[flushes[0].id] < tl.end[pieces[-1].id]  # the first flush overlaps the layer's backward
    unit = next(u for u in units(r.workload) if u.name == "layer 2")
    whole = [op.name for t in pieces for op in t.ops if "hooks" not in op.name]
    assert whole == [op.name for op in unit.block.backward]


def _shape(layers, hidden, heads, ffn, vocab, tp, fused, recompute, tied):
    return (
        ("layers", layers),
        ("hidden", hidden),
        ("heads", heads // tp),
        ("kv_heads", heads // tp),
        ("head_dim", hidden // heads),
        ("ffn", ffn // tp),
        ("vocab", vocab // tp),
        ("seq", 2048),
        ("swiglu", not fused),
        ("bias", fused),
        ("layernorm", fused),
        ("learned_positions", fused),
        ("tied", tied),
        ("fused", fused),
        ("recompute", recompute),
    )


def _knobs(prefetch, live, reuse, persist, model_persist, reduce):
    return (
        ("prefetch_bucket", prefetch),
        ("max_live", live),
        ("max_reuse", reuse),
        ("persistence_threshold", persist),
        ("model_persistence_threshold", model_persist),
        ("reduce_bucket", reduce),
    )


@pytest.mark.parametrize("tp", [1, 4])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize(
    "knobs",
    [
        _knobs(5e7, 1e9, 1e9, 1e5, float(sys.maxsize), 5e8),  # DeepSpeed's defaults
        _knobs(1e8, 3e8, 2e8, 0, float("inf"), 2e8),  # max_live stops the prefetcher mid-layer
        _knobs(1e9, 1e9, 5e9, 1e6, float("inf"), 1e9),  # windows of several layers
        _knobs(5e7, 1e9, 1e9, 1e5, 2e5, 5e8),  # a model-wide persistence budget that runs out
    ],
)
@pytest.mark.parametrize(
    "model",
    [
        (96, 12288, 96, 49152, 51200, True),
        (80, 8192, 64, 28672, 128256, False),
        (24, 2048, 16, 8192, 51200, True),
    ],
)
def test_call_counts_from_shallow_replays_equal_the_whole_replay(tp, fused, recompute, knobs, model):
    """The planner counts ZeRO-3's calls from replays of a few layers (call_sizes): every (operation, pass,
    size) count equals the whole model's replay, for GPT-3 175B, a Llama-3-70B shape and a 24-layer model
    (windows as wide as the model: the whole replay), at DeepSpeed's defaults and at settings that make the
    pattern longer than a layer or the persistence budget run out partway."""
    layers, hidden, heads, ffn, vocab, tied = model
    key = _shape(layers, hidden, heads, ffn, vocab, tp, fused, recompute, tied)
    whole = schedule_for(key, knobs)
    expected = Counter(("all_gather", g.block[1], g.numel) for g in whole.gathers)
    expected.update(("reduce_scatter", "backward", r.numel) for r in whole.reduces)
    assert call_sizes(key, knobs) == expected
    assert sum(n for (op, _, _), n in expected.items() if op == "reduce_scatter") == len(whole.reduces) > 0


def test_shallow_replays_stand_for_gpt3_175b():
    """GPT-3 175B on 8 tensor-parallel ranks at DeepSpeed's defaults: a layer is 226,576,896 elements on a rank,
    the 1e9-element reuse distance reaches ceil(1e9 / 226,576,896) = 5 layers, a window of 6; the counts come
    from a one-layer model (the layer's size) and replays of 2 x 6 + 3 = 15 and 16 layers, not 96."""
    key = _shape(96, 12288, 96, 49152, 51200, 8, True, True, True)
    knobs = _knobs(5e7, 1e9, 1e9, 1e5, float(sys.maxsize), 5e8)
    replayed = []
    with pytest.MonkeyPatch.context() as mp:
        real = zero3_fetch.model_modules

        def spy(**kw):
            replayed.append(kw["layers"])
            return real(**kw)

        mp.setattr(zero3_fetch, "model_modules", spy)
        zero3_fetch.call_sizes.__wrapped__(key, knobs)
    assert replayed == [1, 15, 16]


def test_zero_offload_holds_the_host_for_every_bucket_and_one_nccl_queue_serves_both_directions():
    """With ZeRO-Offload, stage3.py copies each reduced gradient partition into the host's fp32 buffer with a
    blocking copy_ at the accumulation boundary (__partition_grads, v0.6.2 line 1706; v0.16.4 line 1515): the host
    issues nothing after a flush until that bucket's reduction and copy have ended. And the all-gathers and
    reduce-scatters, one process group's collectives, run on its one NCCL stream in issue order."""
    s = make(
        model={**GPT, "num_layers": 4},
        cluster={"num_nodes": 2, "gpus_per_node": 1, "nic_bandwidth_gbps": 10.0},
        training={"global_batch_size": 2},
        parallelism={
            "zero_stage": 3,
            "zero": {"reduce_bucket_size": 1e5, "overlap_comm": True, "offload_optimizer": {"device": "cpu"}},
        },
    )
    r = simulate(s.model_copy(update={"framework": "pytorch-2024"}))
    tl, tasks = r.timeline, r.program.tasks
    copies = [t.id for t in tasks if "gradient bucket" in t.name]
    waiting = [t for t in tasks if t.host_waits]
    assert len(copies) >= 8 and len(waiting) >= 4
    for t in waiting:
        (w,) = t.host_waits
        assert w == max(c for c in copies if c < t.id)  # the latest bucket's own copy, not one three back
        assert tl.issued[t.id] >= tl.end[w]
    nccl = [t for t in tasks if t.kind in ("all_gather", "reduce_scatter")]
    assert {t.stream for t in nccl} == {"comm.nccl.dp"}
    ends = [tl.end[t.id] for t in nccl]
    starts = [tl.start[t.id] for t in nccl]
    assert all(b >= a - 1e-12 for a, b in zip(ends, starts[1:], strict=False))  # one after another
