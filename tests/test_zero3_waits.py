"""DeepSpeed ZeRO-3's compute waits for a gather at the hook of the module that owns its parameters
(strategy/zero3_waits.py): a unit's compute is cut there, not held at its start for every gather of the unit."""

import pytest
from conftest import make
from test_zero3_fetch import four_modules

from simulator import simulate
from simulator.strategy.zero3_fetch import model_modules, replay
from simulator.strategy.zero3_waits import Waits, covers


def test_each_gather_is_waited_for_by_the_first_module_after_it_that_owns_a_parameter_of_it():
    """The by-hand replay of test_zero3_fetch (prefetch bucket 250, reuse distance 0): calls 0 [p0] fetched at
    step 0, 1 [p1, p2] prefetched at step 0, 2 [p3] at step 1, 3 [p0, p1] at step 2, 4 [p3] fetched at step 4.
    Step 0 (M0) waits for call 0, step 1 (M1) and step 2 (M2) for call 1, step 3 (M3) for call 2, step 4 (M3's
    backward) for call 4, step 5 (M2's backward: p2 kept) for none, steps 6 and 7 (M1, M0) for call 3. NCCL runs
    the calls in launch order, so M1's and M0's backward, behind call 4, wait for nothing new: no cut there."""
    numel, trace = four_modules()
    f = replay(
        numel, trace, prefetch_bucket=250, max_live=float("inf"), max_reuse=0, persistence_threshold=0,
        reduce_bucket=450,
    )  # fmt: skip
    assert covers(f) == [0, 1, 1, 2, 4, -1, 3, 3]
    w = Waits(f)
    ops = ("kernel",)
    assert [w.cuts((u, "forward"), True, ops) for u in range(4)] == [[(0, 0)], [(0, 1)], [], [(0, 2)]]
    assert [w.cuts((u, "backward"), False, ops) for u in (3, 2, 1, 0)] == [[(0, 4)], [], [], []]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("knobs", [(1, 1e12, 0), (20_000, 1e12, 0), (20_000, 40_000, 1e5), (0, 1e12, 0)])
def test_the_gathers_waited_for_per_module_are_those_the_coordinator_waits_for_per_unit(
    fused, recompute, knobs
):
    """Across prefetch buckets, live-parameter limits and reuse distances, the modules of each unit wait for
    exactly the calls the coordinator's replay has that unit wait for (``FetchSchedule.waits``)."""
    bucket, live, reuse = knobs
    numel, trace = model_modules(
        layers=3, hidden=64, heads=4, kv_heads=4, head_dim=16, ffn=256, vocab=1000, seq=128, swiglu=not fused,
        bias=fused, layernorm=fused, learned_positions=fused, tied=True, fused=fused, recompute=recompute,
    )  # fmt: skip
    f = replay(
        numel, trace, prefetch_bucket=bucket, max_live=live, max_reuse=reuse, persistence_threshold=256,
        reduce_bucket=1e9,
    )  # fmt: skip
    per_unit: dict = {}
    for m, c in zip(f.modules, covers(f), strict=True):
        if c >= 0:
            per_unit.setdefault(m.block, set()).add(c)
    assert per_unit == {block: set(calls) for block, calls in f.waits.items()}


def test_a_layer_computes_its_attention_while_its_mlp_weights_are_still_gathered():
    """One GPU per node on a 10 Gb/s network, every weight gathered in a call of its own (prefetch bucket of one
    element; biases and norms persistent): layer 1's forward is cut at each module that waits for a call, each
    piece after the gather of its own weight (h x h for the output projection, h x 4h for each MLP matrix), and
    its first kernels run before the MLP's weights have arrived."""
    h = 512
    s = make(
        model={
            "num_layers": 4,
            "hidden_size": h,
            "num_attention_heads": 8,
            "seq_length": 512,
            "vocab_size": 8192,
        },
        cluster={"num_nodes": 2, "gpus_per_node": 1, "nic_bandwidth_gbps": 10.0},
        training={"global_batch_size": 2},
        parallelism={
            "zero_stage": 3,
            "zero": {"stage3_prefetch_bucket_size": 1, "stage3_param_persistence_threshold": 1e4},
        },
    )
    r = simulate(s)
    tl, tasks = r.timeline, r.program.tasks
    pieces = [t for t in tasks if t.name == "layer 1 forward"]
    assert [t.ops[0].name for t in pieces] == [
        "input layernorm",
        "qkv projection",
        "attention output projection",
        "mlp up projection",
        "mlp down projection",
    ]
    waited = [[tasks[d] for d in t.deps] for t in pieces]
    assert waited[0] == []  # its norm is persistent; nothing gathered for it
    assert [[g.bytes / 2 for g in gs] for gs in waited[2:]] == [[h * h], [4 * h * h], [4 * h * h]]
    mlp_up = waited[3][0]
    assert tl.start[pieces[0].id] < tl.start[pieces[1].id] < tl.end[mlp_up.id]
    assert tl.start[pieces[3].id] >= tl.end[mlp_up.id]
