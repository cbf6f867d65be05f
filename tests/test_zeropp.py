"""ZeRO++ (Wang et al. 2023): qwZ, hpZ and qgZ change bytes, where they travel, and memory as the paper says."""

import pytest
from conftest import make

from simulator import simulate
from simulator.errors import ScenarioError

MODEL = {
    "num_layers": 4,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "seq_length": 1024,
    "vocab_size": 32000,
    "tied_embeddings": False,
}
# release every parameter after use and prefetch nothing past it: backward gathers everything again, as for
# models much larger than stage3_max_reuse_distance and stage3_max_live_parameters
NO_REUSE = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}


def run(**zero):
    return simulate(
        make(
            model=MODEL,
            cluster={"topology": "dgx2-v100", "num_nodes": 2},
            training={"global_batch_size": 32, "micro_batch_size": 1, "precision": "fp16"},
            parallelism={"zero_stage": 3, "zero": {**NO_REUSE, **zero}},
        )
    )


def gather_bytes(r, phase):
    return sum(t.bytes for t in r.program.tasks if t.kind == "all_gather" and t.phase == phase)


def test_qwz_halves_the_all_gather_bytes():
    """partitioned_param_coordinator.py (v0.16.4) gathers with quantize=zero_quantized_weights on every fetch."""
    plain, qwz = run(), run(zero_quantized_weights=True)
    for phase in ("forward", "backward"):
        ratio = gather_bytes(qwz, phase) / gather_bytes(plain, phase)
        assert ratio == pytest.approx((1 + 4 / 256) / 2)  # INT8 plus one fp32 scale per 256-element block
    dequant = [op for t in qwz.program.tasks for op in t.ops if op.name == "qwZ dequantize weights"]
    assert dequant and qwz.metrics.iteration_time_s != plain.metrics.iteration_time_s


def test_hpz_over_a_node_keeps_backward_all_gathers_inside_the_node():
    r = run(zero_hpz_partition_size=16)  # DGX-2: 16 GPUs per node
    bwd = r.metrics.comm_by_collective["all_gather:dp/16"]
    assert bwd["bytes_sent_per_gpu"] > 0 and bwd["bytes_cross_node_per_gpu"] == 0
    assert (
        r.metrics.comm_by_collective["all_gather:dp"]["bytes_cross_node_per_gpu"] > 0
    )  # forward still crosses


def test_hpz_costs_the_memory_of_its_secondary_copy():
    plain, hpz = run(), run(zero_hpz_partition_size=16)
    extra = hpz.program.ranks[0].memory.buffers - plain.program.ranks[0].memory.buffers
    assert extra == pytest.approx(hpz.workload.params_per_rank * 2 / 16)


def test_qgz_cuts_cross_node_gradient_bytes_to_at_most_a_quarter_of_a_ring_reduce_scatter():
    plain, qgz = run(), run(zero_quantized_gradients=True)
    ring = plain.metrics.comm_by_collective["reduce_scatter:dp"]["bytes_cross_node_per_gpu"]
    quantized = sum(
        d["bytes_cross_node_per_gpu"]
        for k, d in qgz.metrics.comm_by_collective.items()
        if k.startswith("all_to_all")
    )
    assert 0 < quantized <= ring / 4
    assert "reduce_scatter:dp" not in qgz.metrics.comm_by_collective


def test_zero_plus_plus_beats_zero3_on_a_slow_network():
    slow = {"cluster": {"topology": "dgx2-v100", "num_nodes": 2, "nics_per_node": 1}}
    kw = dict(
        model=MODEL, training={"global_batch_size": 32, "micro_batch_size": 1, "precision": "fp16"}, **slow
    )
    z3 = simulate(make(**kw, parallelism={"zero_stage": 3, "zero": NO_REUSE})).metrics
    zpp = simulate(
        make(
            **kw,
            parallelism={
                "zero_stage": 3,
                "zero": {
                    **NO_REUSE,
                    "zero_quantized_weights": True,
                    "zero_hpz_partition_size": 16,
                    "zero_quantized_gradients": True,
                },
            },
        )
    ).metrics
    assert zpp.tokens_per_s > 1.3 * z3.tokens_per_s
    assert zpp.comm["bytes_cross_node_per_gpu"] < z3.comm["bytes_cross_node_per_gpu"] / 3


def test_zero_plus_plus_needs_stage_3():
    with pytest.raises(ScenarioError, match=r"zero_quantized_weights \(ZeRO\+\+\) need zero_stage: 3"):
        make(model=MODEL, parallelism={"zero_stage": 2, "zero": {"zero_quantized_weights": True}})
