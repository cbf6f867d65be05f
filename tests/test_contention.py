"""NCCL's thread blocks take SMs from the compute beside them (costs/contention.py): the slowdown in closed form,
the seconds each compute task loses counted by hand on a small timeline, and what the second pass replays."""

import pytest
from conftest import make

from simulator import simulate
from simulator.costs.contention import P2P_CHANNELS, contention_s, lengthened, sm_slowdown
from simulator.engine.engine import TaskCost
from simulator.program import COMPUTE, Program
from simulator.timeline.timeline import Part, Timeline
from simulator.workload.ops import memory_op


def test_a_collective_of_16_channels_leaves_the_rest_of_the_sms():
    """SMs / (SMs - channels): A100 108 / 92 = 1.174, H100 132 / 116 = 1.138; no channel, no slowdown."""
    assert sm_slowdown(108, 16) == pytest.approx(1.1739, abs=1e-4)
    assert sm_slowdown(132, 16) == pytest.approx(1.1379, abs=1e-4)
    assert sm_slowdown(132, 0) == 1.0
    assert P2P_CHANNELS == 2


def _timeline(spans: dict[int, tuple[float, float]], program: Program) -> Timeline:
    tl = Timeline(program, len(program.tasks))
    for i, (a, b) in spans.items():
        tl.start[i], tl.end[i] = a, b
    return tl


def test_the_seconds_a_compute_task_loses_counted_by_hand():
    """Rank 0 computes from 0 to 10 s (80% of it in GEMMs) and from 10 to 12 s; beside it an all-gather runs
    from 2 to 6 s, a pipeline send from 5 to 9 s, and a copy to host memory from 0 to 12 s. The first task ran
    4 s beside the all-gather (16 channels of 108 SMs) and 3 s more beside the send alone (2 channels): it loses
    0.8 x (4 x 16/92 + 3 x 2/106) = 0.6017 s. The second ran beside nothing that takes SMs. Rank 1's compute
    overlaps rank 0's all-gather in time, not on its GPU: nothing."""
    p = Program("hand")
    op = (memory_op("kernels", 1.0),)
    first = p.add_compute(0, "forward", "forward", "layer", (), op, 0)
    second = p.add_compute(0, "forward", "forward", "layer", (), op, 0)
    gather = p.add(0, "comm.ag", "all_gather", "forward", "gather", group="dp", bytes=1.0)
    send = p.add(0, "comm.pp", "send_recv", "forward", "send", group="pp", bytes=1.0)
    host = p.add(0, "comm.host", "d2h", "forward", "offload", group="host", bytes=1.0)
    other = p.add_compute(1, "forward", "forward", "layer", (), op, 0)
    tl = _timeline(
        {first: (0, 10), second: (10, 12), gather: (2, 6), send: (5, 9), host: (0, 12), other: (0, 10)}, p
    )
    extra = contention_s(p, tl, lambda ops: 0.8, 108, 16)
    assert set(extra) == {first}
    assert extra[first] == pytest.approx(0.8 * (4 * 16 / 92 + 3 * 2 / 106))
    assert all(t.stream == COMPUTE for t in p.tasks if t.id in extra)


def test_a_lengthened_task_keeps_its_parts_adding_up():
    cost = TaskCost(2.0, (Part("kernels", "compute", "", 0.0, 1.5), Part("ar", "all_reduce", "tp", 8.0, 0.5)))
    longer = lengthened(cost, 0.25)
    assert longer.seconds == 2.25 and longer.first_s == 0.25  # first_s was 0: no host model
    assert sum(part.duration_s for part in longer.parts) == pytest.approx(2.25)
    assert lengthened(TaskCost(1.0, (), 0.1, 1.1, 0.0, 1.0), 0.5) == TaskCost(1.5, (), 0.1, 1.6, 0.0, 1.5)


def test_fsdp_replays_its_layers_lengthened_by_what_ran_beside_them():
    """FSDP over 2 nodes of A100: each layer's compute runs beside the next layer's all-gather or the last one's
    reduce-scatter. The second pass lengthens each compute task by at most the time it ran beside them on the
    first pass times 16/92 (all of it in compute-bound kernels), the GEMM-heavy layers by more than half that;
    the iteration takes longer. Off, the first pass stands."""
    base = make(
        model={
            "num_layers": 4,
            "hidden_size": 2048,
            "num_attention_heads": 16,
            "seq_length": 2048,
            "vocab_size": 32000,
        },
        cluster={"num_nodes": 2, "gpus_per_node": 8},
        training={"global_batch_size": 16},
        parallelism={"data_parallel": 16, "fsdp": {}},
    )
    off = base.model_copy(update={"cluster": base.cluster.model_copy(update={"nccl_sm_contention": False})})
    r_off, r_on = simulate(off, periodic=False), simulate(base, periodic=False)
    assert r_on.metrics.iteration_time_s > r_off.metrics.iteration_time_s
    bound = contention_s(r_off.program, r_off.timeline, lambda ops: 1.0, 108, 16)
    assert bound
    heavy = 0
    for t in r_on.program.tasks:
        if t.stream != COMPUTE:
            continue
        added = r_on.timeline.busy[t.id] - r_off.timeline.busy[t.id]
        assert -1e-12 <= added <= bound.get(t.id, 0.0) + 1e-12
        heavy += added > 0.5 * bound.get(t.id, 0.0) > 0
    assert heavy >= 4
