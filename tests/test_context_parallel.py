"""Context parallelism: ring attention splits the sequence, exchanges K/V around the CP group, hides the
exchange behind attention, and the CP ranks join the gradient reduction."""

import pytest
from conftest import make

from simulator import simulate
from simulator.costs.collectives import ring_bytes_per_rank
from simulator.errors import ScenarioError

MODEL = {
    "num_layers": 2,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_query_groups": 8,
    "seq_length": 32768,
    "vocab_size": 32000,
    "attention": "flash",
}


def run(cp: int, **cluster):
    return simulate(
        make(
            model=MODEL,
            cluster={"gpus_per_node": cp, **cluster},
            training={"global_batch_size": 1, "micro_batch_size": 1},
            parallelism={"context_parallel": cp, "data_parallel": 1},
        )
    )


def attention(r, name="flash attention"):
    return next(op for op in r.workload.layer.forward if op.name == name)


def test_each_cp_rank_does_one_cp_th_of_the_attention_and_of_the_gemms():
    one, four = run(1), run(4)
    assert attention(four).flops == pytest.approx(attention(one).flops / 4)
    qkv = {op.name: op for op in four.workload.layer.forward}["qkv projection"]
    assert qkv.m == 32768 // 4


def test_kv_exchange_moves_cp_minus_1_blocks_of_k_and_v_per_rank():
    r = run(4)
    kv = next(op for op in r.workload.layer.forward if op.group == "cp")
    block = 2 * 1 * (32768 // 4) * 8 * 128 * 2  # K and V of one rank's tokens: 2 x b x s/cp x g x d x 2 bytes
    assert ring_bytes_per_rank(kv.collective, 4, kv.bytes) == pytest.approx(3 * block)


def test_kv_exchange_hides_behind_attention_on_nvlink_and_shows_on_a_slow_network():
    fast = run(2).metrics.comm_by_collective["all_gather:cp"]
    assert fast["exposed_s"] == pytest.approx(0.0, abs=1e-12) and fast["time_s"] > 0
    slow = simulate(
        make(
            model=MODEL,
            cluster={"topology": "ethernet-2node", "num_nodes": 2, "nic_bandwidth_gbps": 1},
            training={"global_batch_size": 1, "micro_batch_size": 1},
            parallelism={"context_parallel": 2, "data_parallel": 1},
        )
    ).metrics
    assert (
        slow.comm_by_collective["all_gather:cp"]["exposed_s"]
        > 0.5 * slow.comm_by_collective["all_gather:cp"]["time_s"]
    )


def test_cp_ranks_join_the_gradient_reduction():
    r = simulate(
        make(
            model=MODEL,
            cluster={"gpus_per_node": 8},
            training={"global_batch_size": 4, "micro_batch_size": 1},
            parallelism={"context_parallel": 2, "data_parallel": 4},
        )
    )
    assert "all_reduce:dp+cp" in r.metrics.comm_by_collective
    assert r.placement.group_size("dp+cp") == 8


@pytest.mark.parametrize(
    "model,message",
    [
        ({**MODEL, "attention": "standard"}, "context_parallel (2) needs model.attention: flash"),
        (
            {**MODEL, "seq_length": 30},
            "model.seq_length (30) is not divisible by 2 x context_parallel (2) = 4",
        ),
    ],
)
def test_invalid_context_parallel_inputs(model, message):
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make(
            model=model,
            cluster={"gpus_per_node": 2},
            training={"global_batch_size": 1},
            parallelism={"context_parallel": 2, "data_parallel": 1},
        )


@pytest.mark.parametrize(
    "par",
    [
        {"context_parallel": 2, "data_parallel": 4},
        {"context_parallel": 2, "data_parallel": 4, "fsdp": {}},
        {"context_parallel": 2, "data_parallel": 4, "zero_stage": 3},
        {"context_parallel": 2, "pipeline_parallel": 2, "data_parallel": 2},
    ],
)
def test_simulated_ranks_stand_for_exactly_the_gpus_of_the_job(par):
    """Each simulated rank stands for every TP x CP x DP rank of its stage: counts add up to the GPUs, and the
    model FLOPs reported per GPU add up to the job's (they doubled with CP before)."""
    r = simulate(
        make(
            model={**MODEL, "num_layers": 4},
            cluster={"gpus_per_node": 8},
            training={"global_batch_size": 8, "micro_batch_size": 1},
            parallelism=par,
        )
    )
    assert sum(rc.count for rc in r.program.ranks) == r.placement.world_size == 8
    m = r.metrics
    job = r.workload.model_flops_per_microbatch * 2 * 8  # per CP rank x 2 CP ranks x 8 microbatches in all
    assert m.model_tflops_per_gpu * 1e12 * m.iteration_time_s * 8 == pytest.approx(job, rel=1e-9)
