"""Strategies against closed forms: single-GPU sums, DDP on an ideal network, ZeRO volumes and memory, FSDP."""

import pytest
from conftest import GPT_SMALL, ideal_network_cluster, make

from simulator import simulate
from simulator.costs.compute import ComputeModel
from simulator.workload.memory import zero_model_state_bytes

UNTIED = {**GPT_SMALL, "tied_embeddings": False}


def test_one_gpu_iteration_equals_the_sum_of_its_operation_costs():
    s = make(
        cluster={"gpus_per_node": 1},
        training={"global_batch_size": 4, "micro_batch_size": 2, "activation_recompute": "full"},
    )
    for kernels in ("none", "auto"):  # the pure model, then the shipped A100 table
        r = simulate(s.model_copy(update={"kernels": kernels}))
        expected = sum(r.compute.ops_time_s(t.ops) for t in r.program.tasks)
        assert r.metrics.iteration_time_s == pytest.approx(expected, rel=1e-12)
    pure = ComputeModel(r.cluster.gpu, "bf16")
    assert r.compute.kernels is not None and pure.kernels is None
    # two microbatches, each: 6 units forward, 6 backward, 4 layer recomputes; one optimizer step
    assert len(r.program.tasks) == 2 * (6 + 6 + 4) + 1


def test_ddp_on_an_infinitely_fast_network_equals_the_single_gpu_time():
    single = make(cluster={"gpus_per_node": 1}, training={"global_batch_size": 2})
    # every GPU as fast as the typical one (the slowest GPU's pace is tests/test_variability.py's)
    ddp = make(cluster={"num_nodes": 2, "gpu_speed_sd": 0}, training={"global_batch_size": 32})
    t1 = simulate(single).metrics.iteration_time_s
    r = simulate(ddp, cluster=ideal_network_cluster(ddp))
    assert r.program.strategy == "ddp"
    assert r.metrics.iteration_time_s == pytest.approx(t1, rel=1e-12)


def test_ddp_bucket_all_reduces_overlap_backward_on_a_fast_network():
    m = simulate(
        make(model={**GPT_SMALL, "num_layers": 16}, training={"global_batch_size": 64, "micro_batch_size": 8})
    ).metrics
    assert m.comm["overlapped_s"] > 2 * m.comm["exposed_s"]


def test_pytorch_ddp_keeps_a_second_copy_of_the_gradients_in_its_buckets():
    """PyTorch DDP's Reducer copies every gradient into bucket storage of its own unless
    gradient_as_bucket_view=True (pytorch/pytorch#41954): the quickstart's GPT-3 1.3B (1,317,654,528 parameters,
    bf16 gradients) holds 2 B x 1,317,654,528 = 2.454 GiB of buckets, 2 x 25 MiB in flight with the view, and
    Megatron-Core's grad buffer (the buckets) nothing beyond the two in flight either; DeepSpeed's 1-bit Adam
    reduces through its engine's transient buckets, unchanged."""
    from simulator.scenario.loader import load_scenario

    quick = load_scenario("quickstart")
    copy = simulate(quick).metrics.memory_gib
    assert copy["buffers"] == pytest.approx(2 * 1_317_654_528 / 2**30, rel=1e-12)
    view = quick.model_copy(
        update={"parallelism": quick.parallelism.model_copy(
            update={"ddp": quick.parallelism.ddp.model_copy(update={"gradient_as_bucket_view": True})}
        )}
    )  # fmt: skip
    viewed = simulate(view).metrics.memory_gib
    assert viewed["buffers"] == pytest.approx(2 * 25 / 1024, rel=1e-12)
    assert copy["peak"] - viewed["peak"] == pytest.approx(copy["buffers"] - viewed["buffers"], rel=1e-9)
    mcore = quick.model_copy(update={"framework": "megatron-core-2024"})
    ddp = mcore.parallelism.ddp.model_copy(update={"overlap_grad_reduce": True})
    mcore = mcore.model_copy(update={"parallelism": mcore.parallelism.model_copy(update={"ddp": ddp})})
    assert simulate(mcore).metrics.memory_gib["buffers"] == pytest.approx(2 * 160 / 1024, rel=1e-12)


# ZeRO-3 as the ZeRO paper counts it: nothing persistent, nothing prefetched past its use, nothing kept
RELEASE_ALL = {
    "stage3_max_reuse_distance": 0,
    "stage3_prefetch_bucket_size": 0,
    "stage3_param_persistence_threshold": 0,
}


def test_zero3_moves_one_and_a_half_times_the_bytes_of_ddp():
    """ZeRO paper Sec. 7.2.2: all-gather in forward and again in backward, reduce-scatter the gradients: 3 Psi
    (n-1)/n against DDP's 2 Psi (n-1)/n, when every parameter is released after each use."""
    ddp = simulate(make(model=UNTIED)).metrics.comm["bytes_per_gpu"]
    z3 = simulate(make(model=UNTIED, parallelism={"zero_stage": 3, "zero": RELEASE_ALL})).metrics
    assert z3.comm["bytes_per_gpu"] / ddp == pytest.approx(1.5, rel=1e-12)


def test_zero3_keeps_parameters_reused_within_the_reuse_distance():
    """A model smaller than stage3_max_reuse_distance (1e9) is never re-gathered in backward: 1.0 x DDP's bytes.
    GPT-3 175B's layers (1.8e9 elements) are bigger than the distance: backward gathers them again."""
    ddp = simulate(make(model=UNTIED)).metrics.comm["bytes_per_gpu"]
    keep = {"zero_stage": 3, "zero": {"stage3_param_persistence_threshold": 0}}
    z3 = simulate(make(model=UNTIED, parallelism=keep)).metrics.comm["bytes_per_gpu"]
    assert z3 / ddp == pytest.approx(1.0, rel=1e-12)
    big = simulate(
        make(
            model={"preset": "gpt3-175b", "tied_embeddings": False},
            cluster={"num_nodes": 4},
            training={"global_batch_size": 32, "activation_recompute": "full"},
            parallelism={"zero_stage": 3},
        )
    )
    h = 12288
    layer_weights = 12 * h * h  # QKV, projection and the two MLP matrices
    backward = sum(t.bytes for t in big.program.tasks if t.kind == "all_gather" and t.phase == "backward")
    assert backward >= 96 * layer_weights * 2  # every layer's weights, in fp16, once more


def zero(stage: int, version: str | None = None, **zero_cfg):
    cfg = {**zero_cfg, **({"deepspeed_version": version} if version else {})}
    return simulate(make(model=UNTIED, parallelism={"zero_stage": stage, "zero": cfg})).metrics


def test_before_deepspeed_0_12_4_zero1_and_zero2_move_the_same_bytes_as_ddp_without_accumulation():
    """ZeRO paper: stage 1/2 reduce each rank's slice ((n-1)/n of the gradients, as n reduces) and all-gather
    the updated weights ((n-1)/n): 2(n-1)/n, a DDP all-reduce's volume."""
    ddp = simulate(make(model=UNTIED)).metrics.comm["bytes_per_gpu"]
    for stage in (1, 2):
        m = zero(stage, "0.12.3")
        assert m.comm["bytes_per_gpu"] == pytest.approx(ddp, rel=1e-12)
        assert (
            m.comm_by_collective["reduce:dp"]["count"] == 8 * m.comm_by_collective["all_gather:dp"]["count"]
        )


def test_from_deepspeed_0_12_4_gradient_buckets_are_all_reduced_doubling_the_gradient_bytes():
    """stage_1_and_2.py average_tensor with use_multi_rank_bucket_allreduce (default from v0.12.4): the whole
    bucket is all-reduced, 2(n-1)/n of the gradients, then the weights all-gathered: 1.5 x DDP's bytes. Turning
    the switch off gives the old volume back; reduce_scatter: false all-reduces too."""
    ddp = simulate(make(model=UNTIED)).metrics.comm["bytes_per_gpu"]
    for stage in (1, 2):
        new = zero(stage)
        assert new.comm["bytes_per_gpu"] == pytest.approx(1.5 * ddp, rel=1e-12)
        grads_new = new.comm_by_collective["all_reduce:dp"]["bytes_sent_per_gpu"]
        grads_old = zero(stage, "0.12.3").comm_by_collective["reduce:dp"]["bytes_sent_per_gpu"]
        assert grads_new == pytest.approx(2 * grads_old, rel=1e-12)
        off = zero(stage, use_multi_rank_bucket_allreduce=False).comm["bytes_per_gpu"]
        assert off == pytest.approx(ddp, rel=1e-12)
        assert zero(stage, "0.12.3", reduce_scatter=False).comm["bytes_per_gpu"] == pytest.approx(1.5 * ddp)


def test_zero2_reduces_gradients_every_microbatch_zero1_only_at_the_boundary():
    kw = {"model": UNTIED, "training": {"global_batch_size": 32}}  # 8 GPUs x 1 x 4 microbatches
    z1 = simulate(make(**kw, parallelism={"zero_stage": 1})).metrics.comm_by_collective["all_reduce:dp"]
    z2 = simulate(make(**kw, parallelism={"zero_stage": 2})).metrics.comm_by_collective["all_reduce:dp"]
    assert z2["bytes_sent_per_gpu"] == pytest.approx(4 * z1["bytes_sent_per_gpu"], rel=1e-12)


def test_zero_paper_model_state_memory_for_7_5b_parameters_on_64_gpus():
    """Rajbhandari et al. SC20, Figure 1: 120 GB, 31.4 GB, 16.6 GB and 1.9 GB per device."""
    psi, n = 7.5e9, 64
    totals = [sum(zero_model_state_bytes(psi, n, stage)) / 1e9 for stage in range(4)]
    assert totals == pytest.approx([120, 31.4, 16.6, 1.875], abs=0.05)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_simulated_model_state_memory_follows_the_zero_formulas(stage):
    # no persistent parameters (DeepSpeed keeps those whole on every rank; the paper's formulas have none)
    zero = {"stage3_param_persistence_threshold": 0}
    r = simulate(make(model=UNTIED, parallelism={"zero_stage": stage, "zero": zero}))
    psi, n = r.workload.params_per_rank, 8
    mem = r.program.ranks[0].memory
    assert (mem.params, mem.grads, mem.optimizer) == pytest.approx(zero_model_state_bytes(psi, n, stage))


def test_fsdp_memory_shards_all_model_states_like_zero3():
    r = simulate(make(model=UNTIED, parallelism={"fsdp": {}}))
    mem = r.program.ranks[0].memory
    assert (mem.params, mem.grads, mem.optimizer) == pytest.approx(
        zero_model_state_bytes(r.workload.params_per_rank, 8, 3)
    )


def test_fsdp_prefetch_hides_all_gathers_when_compute_is_long_and_exposes_them_on_a_slow_network():
    model = {**UNTIED, "num_layers": 16, "hidden_size": 2048}
    train = {"global_batch_size": 64, "micro_batch_size": 4}
    fast = simulate(
        make(model=model, training=train, cluster={"num_nodes": 2}, parallelism={"fsdp": {}})
    ).metrics
    slow = simulate(
        make(
            model=model,
            training=train,
            cluster={"num_nodes": 2, "nic_bandwidth_gbps": 1},
            parallelism={"fsdp": {}},
        )
    ).metrics
    ag_fast = fast.comm_by_collective["all_gather:dp"]
    assert ag_fast["exposed_s"] < 0.1 * ag_fast["time_s"]
    assert slow.comm["exposed_s"] > 0.5 * slow.iteration_time_s


def test_fsdp2_copies_each_gathered_unit_out_on_the_compute_stream_and_each_gradient_into_the_reduce_scatter():
    """FSDP2 (the pytorch-2024 profile: torchtitan's fully_shard) copies every all-gather's output into the unit's
    parameters on the compute stream before the unit runs (a read and a write of the gathered bytes), and copies
    each unit's bf16 gradients into the fp32 reduce-scatter input on the reduction stream first (2 + 4 bytes per
    parameter). FSDP1's flat parameter (llm-foundry-2023) gathers into the buffer its parameters view and
    reduce-scatters the flat gradient itself: no copy-out, and a copy-in only where it casts the gradient to an fp32
    reduce dtype first (Composer's DEFAULT mixed precision; none with PURE's bf16 reduction)."""
    kw = {
        "model": {**UNTIED, "num_layers": 4},
        "training": {"global_batch_size": 8},
        "parallelism": {"fsdp": {}},
    }
    r = simulate(make(**kw, framework="pytorch-2024"))
    tasks, tl = r.program.tasks, r.timeline
    by_id = {t.id: t for t in tasks}
    gathers = [t for t in tasks if t.kind == "all_gather"]
    copies = [t for t in tasks if t.name.endswith("all-gather copy-out")]
    assert len(copies) == len(gathers) > 0
    for c in copies:
        (gather,) = [by_id[d] for d in c.deps]
        assert c.stream == "compute" and gather.kind == "all_gather"
        assert sum(op.bytes for op in c.ops) == pytest.approx(2 * gather.bytes)
        assert tl.start[c.id] >= tl.end[gather.id] - 1e-12
    for rs in [t for t in tasks if t.kind == "reduce_scatter"]:
        (copy_in,) = [by_id[d] for d in rs.deps]
        assert copy_in.name == f"{rs.name} copy-in" and copy_in.stream == rs.stream
        params = rs.bytes / 4  # fp32 on the wire
        assert sum(op.bytes for op in copy_in.ops) == pytest.approx(params * (2 + 4))
    flat = simulate(make(**kw, framework="llm-foundry-2023")).program.tasks
    assert not [t for t in flat if "copy-out" in t.name]
    casts = [t for t in flat if "copy-in" in t.name]
    reductions = [t for t in flat if t.kind == "reduce_scatter"]
    assert len(casts) == len(reductions) > 0
    for cast, rs in zip(casts, reductions, strict=True):
        assert sum(op.bytes for op in cast.ops) == pytest.approx(rs.bytes / 4 * (2 + 4))
    pure = {**kw, "parallelism": {"fsdp": {"reduce_in_fp32": False}}}
    flat = simulate(make(**pure, framework="llm-foundry-2023")).program.tasks
    assert not [t for t in flat if "copy-out" in t.name or "copy-in" in t.name]
    assert sum(t.bytes for t in flat if t.kind == "reduce_scatter") == pytest.approx(
        sum(rs.bytes for rs in reductions) / 2
    )


def test_composers_unfused_adamw_and_clipping_stream_92_bytes_per_parameter():
    """The optimizer step of a rank's shard: a fused Adam streams 30 bytes per parameter (fp32 weight, momentum and
    variance read and written, the gradient read, the 16-bit weight written); llm-foundry's Composer DecoupledAdamW
    runs eight elementwise ops per parameter (80 bytes) after FSDP's clip_grad_norm_ (12): 92."""
    kw = {
        "model": {**UNTIED, "num_layers": 4},
        "training": {"global_batch_size": 8},
        "parallelism": {"fsdp": {}},
    }

    def step_bytes(framework: str) -> tuple[float, float]:
        r = simulate(make(**kw, framework=framework))
        (step,) = [t for t in r.program.tasks if t.kind == "optimizer"]
        (op,) = [op for op in step.ops if op.kind == "memory"]
        return op.bytes, op.m  # the op's element count is the shard's parameters

    fused, params = step_bytes("pytorch-2024")
    composer, same = step_bytes("llm-foundry-2023")
    assert params == same > 0
    assert (fused, composer) == (pytest.approx(30 * params), pytest.approx(92 * params))


def test_hsdp_reduce_scatters_inside_the_shard_group_and_all_reduces_across_replicas():
    r = simulate(
        make(
            cluster={"num_nodes": 2},
            training={"global_batch_size": 16},
            parallelism={"fsdp": {"hybrid_shard_size": 8}},
        )
    )
    keys = set(r.metrics.comm_by_collective)
    assert {"all_gather:dp_shard", "reduce_scatter:dp_shard", "all_reduce:dp_replicate"} <= keys
    assert r.program.strategy == "hsdp"


def test_without_overlap_comm_zero2_backward_waits_for_each_reduction():
    kw = {
        "model": {**UNTIED, "num_layers": 8},
        "cluster": {"num_nodes": 2, "nic_bandwidth_gbps": 10},
        "training": {"global_batch_size": 16},
    }
    sync = simulate(make(**kw, parallelism={"zero_stage": 2, "zero": {"reduce_bucket_size": 1e6}})).metrics
    over = simulate(
        make(**kw, parallelism={"zero_stage": 2, "zero": {"reduce_bucket_size": 1e6, "overlap_comm": True}})
    ).metrics
    assert over.iteration_time_s < sync.iteration_time_s
    assert sync.comm["overlapped_s"] < 0.05 * sync.comm["total_s"]


def test_the_same_input_gives_the_same_output_twice():
    s = make(cluster={"num_nodes": 2}, training={"global_batch_size": 32}, parallelism={"zero_stage": 3})
    a, b = simulate(s).metrics.to_dict(), simulate(s).metrics.to_dict()
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


def test_out_of_memory_verdict_against_the_gpu_capacity():
    big = {
        "num_layers": 40,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "seq_length": 2048,
        "vocab_size": 51200,
    }
    ddp = simulate(make(model=big)).metrics
    z3 = simulate(
        make(model=big, parallelism={"zero_stage": 3}, training={"activation_recompute": "full"})
    ).metrics
    assert ddp.oom and ddp.memory_gib["peak"] > 80
    assert not z3.oom


def test_zero3_parameters_below_the_persistence_threshold_are_never_gathered():
    """A 1-layer model, hidden 128: its biggest parameter is the 128 x 512 MLP weight (65,536 elements). With
    DeepSpeed's default threshold (1e5) every parameter persists (full copy on each rank, no all-gather); with
    1e4 the four linear weights, the 256 x 128 word embedding and the 128 x 128 position embedding are
    gathered (every one at least 16,384 elements), the biases and norms (at most 512) are not."""
    tiny = {
        "num_layers": 1,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "seq_length": 128,
        "vocab_size": 256,
        "tied_embeddings": False,
    }
    default = simulate(make(model=tiny, parallelism={"zero_stage": 3}))
    assert "all_gather:dp" not in default.metrics.comm_by_collective
    psi = default.workload.params_per_rank
    assert default.program.ranks[0].memory.params == pytest.approx(2 * psi)
    low = {"zero_stage": 3, "zero": {"stage3_param_persistence_threshold": 1e4}}
    some = simulate(make(model=tiny, parallelism=low))
    # QKV 3h x h, projection h x h, MLP 2 x 4h x h; word embedding and head v x h; positions s x h
    gathered = 12 * 128 * 128 + 2 * 256 * 128 + 128 * 128
    # each gathered once, in fp16: a model this small stays gathered from forward to backward (reuse distance)
    assert sum(t.bytes for t in some.program.tasks if t.kind == "all_gather") == 2 * gathered


def test_model_states_match_deepspeeds_own_estimators():
    """DeepSpeed v0.16.4 estimate_zero2_model_states_mem_needs (stage_1_and_2.py), without offload: 2 Psi + 18
    Psi / N per GPU (16-bit weights; 16-bit and fp32 gradient, fp32 weight and Adam's two moments per shard).
    Here: weights, gradient partition, optimizer states and the step's fp32 gradient partition. The ZeRO-3
    estimator (stage3.py estimate_zero3_model_states_mem_needs) has 18 Psi / N plus the largest layer and leaves
    out the 16-bit shard of the weights themselves (2 Psi / N), which this model keeps."""
    n = 8
    for stage, expected in ((2, lambda psi: 2 * psi + 18 * psi / n), (3, lambda psi: 20 * psi / n)):
        zero = {"stage3_param_persistence_threshold": 0}
        r = simulate(make(model=UNTIED, parallelism={"zero_stage": stage, "zero": zero}))
        mem, psi = r.program.ranks[0].memory, r.workload.params_per_rank
        assert mem.params + mem.grads + mem.optimizer + mem.step == pytest.approx(expected(psi), rel=1e-12)


def test_megatron_bf16_keeps_and_reduces_fp32_gradients():
    """Megatron-LM's distributed-optimizer guide (docs/source/api-guide/dist_optimizer.md), bytes per parameter
    with bf16 parameters and fp32 gradients (megatron/arguments.py turns on accumulate_allreduce_grads_in_fp32
    for bf16): 18 without the distributed optimizer (Megatron-DeepSpeed's LocalDDP, megatron-2022), 6 + 12/d with
    it (Megatron-Core with grad_reduce_in_fp32), whose reduce-scatter moves (d-1)/d x 4 bytes per parameter. The
    megatron-core-2024 profile reduces in bf16 (--grad-reduce-in-bf16: 4 + 12/d), as DeepSpeed ZeRO-1 and PyTorch
    DDP do."""
    d = 8

    def run(framework, **par):
        return simulate(make(model=UNTIED, parallelism=par, framework=framework))

    local = run("megatron-2022")
    mem, psi = local.program.ranks[0].memory, local.workload.params_per_rank
    assert mem.params + mem.grads + mem.optimizer == pytest.approx(18 * psi, rel=1e-12)
    assert local.metrics.comm_by_collective["all_reduce:dp"]["bytes_sent_per_gpu"] == pytest.approx(
        psi * 4 * 2 * (d - 1) / d, rel=1e-9
    )
    for fp32, grad in ((True, 4), (None, 2), (False, 2)):
        ddp = {"overlap_grad_reduce": True, "grad_reduce_in_fp32": fp32}
        r = run("megatron-core-2024", zero_stage=1, ddp=ddp)
        mem = r.program.ranks[0].memory
        assert mem.params + mem.grads + mem.optimizer == pytest.approx(
            (2 + grad) * psi + 12 * psi / d, rel=1e-12
        )
        sent = r.metrics.comm_by_collective["reduce_scatter:dp"]["bytes_sent_per_gpu"]
        assert sent == pytest.approx(psi * grad * (d - 1) / d, rel=1e-9)
    assert run("megatron-2022", zero_stage=1).program.ranks[0].memory.grads == pytest.approx(
        2 * psi, rel=1e-12
    )
    assert run("pytorch-2024").program.ranks[0].memory.grads == pytest.approx(2 * psi, rel=1e-12)


def test_megatron_core_buckets_are_max_of_40m_and_1m_per_data_parallel_rank():
    """megatron/training/training.py get_model: with overlap_grad_reduce the gradient buffer is cut into buckets
    of max(40M, 1M x DP) parameters, closed at the first whole layer that fills one. The units here: embedding
    67.6M, 8 layers of 50.4M, output layer 65.5M. DP 8 (40M): every unit alone, 10 reduce-scatters and 10
    all-gathers; DP 64 (64M): the output layer, 4 pairs of layers, the embedding, 6; no overlap: one bucket."""
    from simulator.strategy.reduction import megatron_bucket_elements

    big = {**UNTIED, "num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16}
    for overlap, dp, calls in ((True, 8, 10), (True, 64, 6), (False, 8, 1)):
        s = make(
            model=big,
            cluster={"num_nodes": dp // 8},
            training={"global_batch_size": dp},
            parallelism={"zero_stage": 1, "ddp": {"overlap_grad_reduce": overlap}},
            framework="megatron-core-2024",
        )
        r = simulate(s)
        assert megatron_bucket_elements(s, r.workload) == (max(4e7, 1e6 * dp) if overlap else float("inf"))
        by = r.metrics.comm_by_collective
        assert by["reduce_scatter:dp"]["count"] == by["all_gather:dp"]["count"] == calls
