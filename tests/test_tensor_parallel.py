"""Tensor and sequence parallelism: bytes per layer, blocking collectives, FLOP accounting."""

import pytest
from conftest import ideal_network_cluster, make

from simulator import simulate

MODEL = {
    "num_layers": 2,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "seq_length": 1024,
    "vocab_size": 32000,
}


def tp_run(t: int, sp: bool = False, **training):
    return simulate(
        make(
            model=MODEL,
            cluster={"gpus_per_node": t},
            training={"global_batch_size": 2, "micro_batch_size": 2, **training},
            parallelism={"tensor_parallel": t, "sequence_parallel": sp},
        )
    )


def layer_tp_bytes(r) -> float:
    """Bytes each GPU sends in one layer's tensor-parallel collectives (forward + backward, one microbatch)."""
    from simulator.costs.collectives import ring_bytes_per_rank

    t = r.scenario.parallelism.tensor_parallel
    ops = [op for op in (*r.workload.layer.forward, *r.workload.layer.backward) if op.kind == "collective"]
    return sum(ring_bytes_per_rank(op.collective, t, op.bytes) for op in ops)


@pytest.mark.parametrize("t", [2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
def test_tp_bytes_per_layer_are_8bsh_t_minus_1_over_t(t, sp):
    """Narayanan et al. SC21 Sec. 3.2: 8 b s h (t-1)/t elements per layer per microbatch (2 bytes each);
    sequence parallelism replaces each all-reduce by an all-gather plus a reduce-scatter: same volume."""
    b, s, h = 2, 1024, 2048
    assert layer_tp_bytes(tp_run(t, sp)) == pytest.approx(8 * b * s * h * (t - 1) / t * 2, rel=1e-12)


def test_tp_collectives_block_compute_and_show_as_exposed_communication():
    r = tp_run(8)
    tp = r.metrics.comm_by_collective["all_reduce:tp"]
    # per microbatch: 4 per layer x 2 layers, 1 for the embedding, 1 for the logits-input gradient, 1 cross-entropy
    assert tp["count"] == 4 * 2 + 3
    assert tp["exposed_s"] == pytest.approx(tp["time_s"])
    assert r.metrics.comm["exposed_s"] >= tp["time_s"]


def test_tp_on_an_ideal_network_splits_the_gemm_flops_evenly():
    s = make(
        model=MODEL,
        cluster={"gpus_per_node": 4},
        training={"global_batch_size": 2, "micro_batch_size": 2},
        parallelism={"tensor_parallel": 4},
    )
    r = simulate(s, cluster=ideal_network_cluster(s))
    one = tp_run(1).metrics
    assert r.metrics.model_tflops_per_gpu * r.metrics.iteration_time_s == pytest.approx(
        one.model_tflops_per_gpu * one.iteration_time_s / 4, rel=1e-9
    )
    assert r.metrics.comm["exposed_s"] < 1e-9


def test_sequence_parallelism_shards_the_norm_and_dropout_work():
    no_sp, sp = tp_run(8).workload.layer, tp_run(8, sp=True).workload.layer
    norm = {op.name: op.bytes for op in no_sp.forward}["input layernorm"]
    assert {op.name: op.bytes for op in sp.forward}["input layernorm"] == pytest.approx(norm / 8)


def test_the_gpu_count_check_names_all_four_degrees():
    from simulator.errors import ScenarioError

    with pytest.raises(
        ScenarioError,
        match=r"tensor_parallel\(8\) x pipeline_parallel\(2\) x context_parallel\(1\) "
        r"x data_parallel\(3\) = 48, but the cluster has 64 GPUs",
    ):
        make(
            model=MODEL,
            cluster={"num_nodes": 8},
            training={"global_batch_size": 6},
            parallelism={"tensor_parallel": 8, "pipeline_parallel": 2, "data_parallel": 3},
        )
