"""Megatron-Core's combined 1F1B (parallelism.moe.overlap_a2a): the schedule's tasks, the three windows of a
layer pair by hand, and what it does to a run's exposed all-to-all time and memory."""

import copy
from pathlib import Path

import pytest
import yaml

from simulator import load_scenario, simulate
from simulator.costs.dispatch import gpu_times
from simulator.strategy.pipeline.combined import merge_layers
from simulator.strategy.schedules import combined_1f1b, interleaved
from simulator.workload.ops import Op, collective_op

ROOT = Path(__file__).parents[1]


def test_one_more_warm_up_forward_and_each_steady_forward_with_the_backward_after_it():
    p, m, v = 4, 8, 2
    for st in range(p):
        tasks = combined_1f1b.tasks(p, m, v, st)
        warmup = (p - st - 1) * 2 + (v - 1) * p + 1  # Megatron's interleaved warm-up, plus one
        assert all(len(t) == 1 and t[0].kind == "F" for t in tasks[:warmup])
        steady = [t for t in tasks if len(t) == 2]
        assert len(steady) == m * v - warmup
        assert all(f.kind == "F" and b.kind == "B" for f, b in steady)
        flat = [x for t in tasks for x in t]
        assert flat == interleaved.schedule(p, m, v, st, extra_warmup=1)
    # where the warm-up covers every forward there is nothing to pair (m = p on the first stages)
    assert not [t for t in combined_1f1b.tasks(8, 8, 4, 0) if len(t) == 2]


class Times:
    """A compute model of fixed kernel times by op name."""

    def __init__(self, seconds: dict):
        self.seconds = seconds

    def op_time_s(self, op):
        return self.seconds.get(op.name, 0.0)


def kernel(name):
    return Op(name, "gemm", flops=1.0)


def a2a(name):
    return collective_op(name, "all_to_all", "ep", 1.0)


def test_a_layer_pair_takes_three_windows_each_as_long_as_its_longer_stream():
    """comm: combine_bwd | dispatch_fwd, dispatch_bwd | combine_fwd against comp: attn_fwd | mlp_bwd, mlp_fwd |
    attn_bwd (model_chunk_schedule_plan.py), with what precedes the backward's combine first."""
    fwd = (kernel("attn f"), a2a("dispatch f"), kernel("experts f"), a2a("combine f"), kernel("post f"))
    bwd = (kernel("pre b"), a2a("combine b"), kernel("experts b"), a2a("dispatch b"), kernel("attn b"))
    compute = {"attn f": 3.0, "experts f": 4.0, "post f": 0.5, "pre b": 0.5, "experts b": 8.0, "attn b": 6.0}
    comm = {"combine b": 5.0, "dispatch f": 7.0, "dispatch b": 7.0, "combine f": 2.0}
    gpu, _ = gpu_times(merge_layers(fwd, bwd), Times(compute), lambda op: comm[op.name])
    want = 0.5 + max(3.0, 5.0) + max(8.0 + 4.0, 7.0 + 7.0) + max(0.5 + 6.0, 2.0)
    assert sum(gpu) == pytest.approx(want, rel=1e-12)
    # run one after the other the same layers take every second of both
    alone, _ = gpu_times((*fwd, *bwd), Times(compute), lambda op: comm[op.name])
    assert sum(alone) == sum(compute.values()) + sum(comm.values())


def case(overlap: bool, gbs: int = 128):
    cases = yaml.safe_load((ROOT / "simulator" / "validation" / "moe.yaml").read_text())
    cases = cases["cases"] if isinstance(cases, dict) else cases
    c = next(c for c in cases if c["id"] == "MZ-QWEN3-235B-TP4-EP8")  # PP 8 x 4 virtual, EP 8, DeepEP
    d = {k: copy.deepcopy(c[k]) for k in ("model", "cluster", "training", "parallelism")}
    d["parallelism"]["moe"]["overlap_a2a"] = overlap
    d["training"]["global_batch_size"] = gbs
    return load_scenario(d)


def test_overlap_hides_most_of_the_all_to_all_and_holds_one_more_micro_batch():
    off, on = simulate(case(False)).metrics, simulate(case(True)).metrics
    exposed_off = off.comm_by_collective["all_to_all:ep"]["exposed_s"]
    exposed_on = on.comm_by_collective["all_to_all:ep"]["exposed_s"]
    assert exposed_on < 0.6 * exposed_off
    assert on.iteration_time_s < off.iteration_time_s
    assert on.memory_gib["activations"] > off.memory_gib["activations"]  # one more warm-up forward in flight


def test_without_pipeline_stages_each_forward_runs_beside_the_previous_backward():
    """combined_1f1b_schedule_for_no_pipelining: F0 alone, F1 + B0, ..., the last backward alone (it reduces the
    gradients); one micro-batch's activations and a layer of the next are live."""
    from simulator.strategy.steps import microbatch_order

    d = {
        "model": {"preset": "mixtral-8x7b", "seq_length": 4096},
        "cluster": {"topology": "dgx-h100", "num_nodes": 8},
        "training": {"global_batch_size": 256, "micro_batch_size": 1},
        "framework": "megatron-core-2024",
        "parallelism": {
            "tensor_parallel": 2,
            "sequence_parallel": True,
            "expert_parallel": 8,
            "zero_stage": 1,
        },
    }
    off = load_scenario(d)
    on_d = copy.deepcopy(d)
    on_d["parallelism"]["moe"] = {"overlap_a2a": True}
    on = load_scenario(on_d)
    gas = on.gradient_accumulation_steps
    assert microbatch_order(on) == [
        ("F", 0, -1),
        *(("FB", i, i - 1) for i in range(1, gas)),
        ("B", gas - 1, -1),
    ]
    assert microbatch_order(off)[:4] == [("F", 0, -1), ("B", 0, -1), ("F", 1, -1), ("B", 1, -1)]
    a, b = simulate(off).metrics, simulate(on).metrics
    assert (
        b.comm_by_collective["all_to_all:ep"]["exposed_s"]
        < 0.6 * a.comm_by_collective["all_to_all:ep"]["exposed_s"]
    )
    assert b.iteration_time_s < a.iteration_time_s
    # forward layer i beside backward layer 31 - i, each backward layer releasing its activations as it ends
    # (model_chunk_schedule_plan.py run, ScheduleNode._release_state): one micro-batch's activations and at most
    # one layer of the next's, not two micro-batches'
    assert (
        a.memory_gib["activations"]
        <= b.memory_gib["activations"]
        <= a.memory_gib["activations"] * (1 + 1 / 32)
    )


def test_the_periodic_replay_of_a_combined_schedule_equals_replaying_every_micro_batch():
    """On NCCL 2.17's constants: with 2.18's (the H100 default) the forward / backward split of this schedule's
    combined steps is not exactly linear at 16-40 micro-batches (its iteration time is, to 1e-5), so the periodic
    replay declines and every micro-batch is replayed, which is exact too."""
    s = case(True, gbs=2048)  # 256 micro-batches per pipeline
    s = s.model_copy(update={"cluster": s.cluster.model_copy(update={"nccl_version": "2.17.1"})})
    fast, every = simulate(s, periodic=True).metrics, simulate(s, periodic=False).metrics
    assert fast.periodic is not None and every.periodic is None
    assert fast.iteration_time_s == pytest.approx(every.iteration_time_s, rel=1e-9)
