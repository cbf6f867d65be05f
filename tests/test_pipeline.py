"""Pipeline schedules simulated step by step meet the closed forms with free communication and equal stages."""

from dataclasses import replace

import pytest
from conftest import GPT_SMALL, ideal_network_cluster, make

from simulator import simulate
from simulator.errors import ScenarioError
from simulator.workload.block import Block
from simulator.workload.transformer import build_workload

MODEL = {
    "num_layers": 16,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "seq_length": 1024,
    "vocab_size": 32000,
    "attention": "flash",
}


def stage_labels(result) -> list[str]:
    return [rc.label for rc in result.program.ranks]


def uneven_labels(first: int, middle: int, last: int, stages: int) -> list[str]:
    """The rank labels of a pipeline with the embedding on the first stage and the output layer on the last."""
    inner = [f"stage {i}: {middle} layers" for i in range(1, stages - 1)]
    return [
        f"stage 0: {first} layers + embedding",
        *inner,
        f"stage {stages - 1}: {last} layers + output layer",
    ]


def pipeline(p, m, schedule, v=1, equal_stages=True, ideal=True, **par):
    s = make(
        model=MODEL,
        cluster={"gpus_per_node": p},
        # DeepSpeed in fp16: bf16 would run BF16_Optimizer, whose per-tensor kernels count the end stages'
        # embedding and output-layer tensors that this test empties
        training={"global_batch_size": m, "micro_batch_size": 1}
        | ({"precision": "fp16"} if schedule == "deepspeed" else {}),
        parallelism={
            "pipeline_parallel": p,
            "pipeline_schedule": schedule,
            "virtual_pipeline_stages": v,
            **par,
        },
    )
    w = build_workload(s)
    if equal_stages:  # no embedding or output layer: every stage holds the same layers
        empty = Block("none", (), (), (), 0)
        w = replace(w, embedding=replace(empty, name="embedding"), head=replace(empty, name="head"))
    # periodic=True: extrapolated wherever the schedule allows, cheaper or not (the tests below check it is exact)
    return simulate(s, cluster=ideal_network_cluster(s) if ideal else None, workload=w, periodic=True)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "deepspeed"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 8)])
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(schedule, p, m):
    assert pipeline(p, m, schedule).metrics.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-9)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "deepspeed", "interleaved-1f1b"])
@pytest.mark.parametrize("p,m", [(2, 64), (4, 256), (8, 1024)])
def test_many_microbatches_extrapolated_keep_the_closed_forms(schedule, p, m):
    """Past six times the pipeline depth the run is simulated at p, p + 1 and p + 2 micro-batches (interleaved:
    p, 2p and 3p) and extrapolated (simulator/metrics/periodic.py): the bubble is still (p-1)/(v m + p-1) and
    the iteration (v m + p - 1) chunk times, the chunk time read off a run of one micro-batch per stage (p
    micro-batches: 2p - 1 slots)."""
    v = 2 if schedule == "interleaved-1f1b" else 1
    r = pipeline(p, m, schedule, v)
    u = max(p, 2)
    assert r.metrics.periodic["microbatches"] == m
    assert r.metrics.periodic["simulated"][:3] == ([u, 2 * u, 3 * u] if v > 1 else [u, u + 1, u + 2])
    assert r.metrics.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-9)
    base = pipeline(p, p, schedule, v).metrics
    slot = (base.iteration_time_s - base.breakdown["optimizer_s"]) / (v * p + p - 1)
    step = r.metrics.breakdown["optimizer_s"]
    assert r.metrics.iteration_time_s == pytest.approx((v * m + p - 1) * slot + step, rel=1e-9)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 8, 4), (2, 8, 2), (8, 16, 2)])
def test_interleaved_bubble_is_p_minus_1_over_v_m_plus_p_minus_1(p, m, v):
    r = pipeline(p, m, "interleaved-1f1b", v)
    assert r.metrics.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-9)


def test_zb_h1_bubble_is_below_1f1b_with_the_same_activation_memory():
    one, zb = pipeline(4, 8, "1f1b"), pipeline(4, 8, "zb-h1")
    assert zb.metrics.bubble_fraction < 0.9 * one.metrics.bubble_fraction
    assert zb.metrics.iteration_time_s < one.metrics.iteration_time_s
    assert [r.memory.activations for r in zb.program.ranks] == pytest.approx(
        [r.memory.activations for r in one.program.ranks]
    )


def test_activations_in_flight_per_schedule():
    """GPipe holds all m microbatches on every stage; 1F1B p - stage; interleaved on the first stage
    p (1 + (p-1)/(p v)) stage-microbatches (Narayanan et al. SC21; Korthikanti et al. Sec. 4.3)."""
    from simulator.workload.memory import activation_bytes_per_layer

    p, m, v = 4, 8, 2
    r = pipeline(p, m, "1f1b")
    per_stage = 16 // p * activation_bytes_per_layer(r.scenario)  # one microbatch through one stage's layers
    # the last stage also keeps the fp32 logits, so compare the others
    gpipe = [r.memory.activations for r in pipeline(p, m, "gpipe").program.ranks][:-1]
    one = [r.memory.activations for r in r.program.ranks][:-1]
    inter = pipeline(p, m, "interleaved-1f1b", v).program.ranks[0].memory.activations
    assert gpipe == pytest.approx([m * per_stage] * (p - 1))
    assert one == pytest.approx([(p - st) * per_stage for st in range(p - 1)])
    assert inter == pytest.approx(p * (1 + (p - 1) / (p * v)) * per_stage)
    assert max(one) < max(gpipe)


def test_more_microbatches_shrink_the_bubble():
    bubbles = [pipeline(4, m, "1f1b").metrics.bubble_fraction for m in (4, 8, 16, 32)]
    assert bubbles == sorted(bubbles, reverse=True)


def test_embedding_and_output_layer_make_the_end_stages_slower():
    r = pipeline(4, 8, "1f1b", equal_stages=False, ideal=False)
    busy = [
        sum(
            r.timeline.end[t.id] - r.timeline.start[t.id]
            for t in r.program.tasks
            if t.rank == st and t.stream == "compute" and t.kind != "optimizer"
        )
        for st in range(4)
    ]
    assert busy[3] > 1.05 * busy[1]  # logits over a 32k vocabulary and the loss
    assert busy[0] > busy[1]


def test_pipeline_sends_travel_between_stages_as_send_recv():
    r = pipeline(4, 8, "1f1b", ideal=False, tensor_parallel=1)
    sends = r.metrics.comm_by_collective["send_recv:pp"]
    b, s, h = 1, 1024, 1024
    # every microbatch crosses 3 boundaries forward and 3 backward; the average stage sends 1.5 of each
    assert sends["bytes_sent_per_gpu"] == pytest.approx(8 * 2 * 3 / 4 * b * s * h * 2)


def test_pipeline_with_tensor_parallel_scatter_gather_sends_one_t_th():
    """Narayanan et al. Sec. 4.1: each TP rank sends b s h / t and the receivers all-gather over NVLink."""
    s = make(
        model=MODEL,
        cluster={"num_nodes": 2},
        training={"global_batch_size": 8, "micro_batch_size": 1},
        parallelism={"tensor_parallel": 8, "pipeline_parallel": 2},
    )
    r = simulate(s)
    send = next(op for op in r.program.tasks[0].ops if op.collective == "send_recv")
    assert send.bytes == 1024 * 1024 * 2 / 8


@pytest.mark.parametrize(
    "par,message",
    [
        (
            {"pipeline_parallel": 3},
            "model.num_layers (16) is not divisible by pipeline_parallel (3) x virtual_pipeline_stages (1) = 3",
        ),
        (
            {
                "pipeline_parallel": 4,
                "pipeline_schedule": "interleaved-1f1b",
                "virtual_pipeline_stages": 2,
                "data_parallel": 2,
            },
            "interleaved-1f1b needs the microbatches per pipeline",
        ),
        (
            {"pipeline_parallel": 2, "virtual_pipeline_stages": 2, "pipeline_schedule": "gpipe"},
            "needs pipeline_schedule: interleaved-1f1b",
        ),
        (
            {"pipeline_parallel": 2, "zero_stage": 3},
            "zero_stage 3 with pipeline_parallel (2) is not supported",
        ),
    ],
)
def test_invalid_pipeline_combinations_get_one_message(par, message):
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        s = make(
            model=MODEL,
            cluster={"gpus_per_node": par["pipeline_parallel"] * par.get("data_parallel", 1)},
            training={"global_batch_size": 12},
            parallelism=par,
        )
        simulate(s)


def test_each_stage_reduces_its_own_gradients_without_contending_with_other_stages():
    """Stages live on different nodes: their end-of-iteration all-reduces share no links, so each takes its
    stand-alone time even though all of them run at once."""
    untied = {**MODEL, "tied_embeddings": False}  # no embedding all-reduce sharing the stages' NICs
    s = make(
        model=untied,
        cluster={"num_nodes": 4},
        training={"global_batch_size": 16, "micro_batch_size": 1},
        parallelism={
            "tensor_parallel": 8,
            "pipeline_parallel": 2,
            "data_parallel": 2,
            "ddp": {"overlap_grad_reduce": False},
        },
    )
    r = simulate(s)
    for task in (t for t in r.program.tasks if t.kind == "all_reduce"):
        alone = r.comm.standalone_time_s("all_reduce", "dp", task.bytes, stage=task.rank)
        assert r.timeline.end[task.id] - r.timeline.start[task.id] == pytest.approx(alone, rel=1e-9)


def test_tied_embeddings_add_a_gradient_all_reduce_between_first_and_last_stage():
    tied = pipeline(4, 8, "1f1b", equal_stages=False, ideal=False)
    words = 32000 * 1024 * 2
    reduces = [t for t in tied.program.tasks if t.group == "embedding"]
    # one collective of the two stages (simulated once, so its links are not loaded twice), awaited by both
    assert len(reduces) == 1 and reduces[0].bytes == words
    steps = [t for t in tied.program.tasks if t.kind == "optimizer"]
    waiting = sorted(t.rank for t in steps if reduces[0].id in t.deps)
    assert waiting == [0, 3]


def test_first_and_last_stage_layer_counts_move_layers_off_the_imbalanced_ends():
    """Megatron-Core --decoder-first/last-pipeline-num-layers: fewer layers beside the embedding and the loss."""
    s = make(
        model=MODEL,
        cluster={"gpus_per_node": 4},
        training={"global_batch_size": 8, "micro_batch_size": 1},
        parallelism={
            "pipeline_parallel": 4,
            "first_pipeline_stage_layers": 3,
            "last_pipeline_stage_layers": 3,
        },
    )
    assert stage_labels(simulate(s)) == uneven_labels(3, 5, 3, 4)
    with pytest.raises(
        ScenarioError,
        match=r"\(16\) - first_pipeline_stage_layers \(2\) .* = 14 does not split evenly over the 3",
    ):
        simulate(
            make(
                model=MODEL,
                cluster={"gpus_per_node": 4},
                training={"global_batch_size": 8},
                parallelism={"pipeline_parallel": 4, "first_pipeline_stage_layers": 2},
            )
        )


def test_rank_order_decides_which_groups_share_a_node():
    from simulator.hardware.placement import Placement

    default = Placement(tp=2, dp=4, order="tp-cp-dp-pp")
    swapped = Placement(tp=2, dp=4, order="dp-cp-tp-pp")
    assert default.groups("tp")[0] == (0, 1) and default.groups("dp")[0] == (0, 2, 4, 6)
    assert swapped.groups("dp")[0] == (0, 1, 2, 3) and swapped.groups("tp")[0] == (0, 4)
    with pytest.raises(ScenarioError, match="rank_order"):
        make(model=MODEL, parallelism={"rank_order": "tp-tp-dp-pp"})


def test_overlapped_param_gather_runs_under_the_first_forward_instead_of_after_the_step():
    par = {"tensor_parallel": 4, "pipeline_parallel": 2, "data_parallel": 2, "zero_stage": 1}
    kw = {
        "model": MODEL,
        "cluster": {"num_nodes": 2},
        "training": {"global_batch_size": 8, "micro_batch_size": 1},
    }
    after = simulate(make(**kw, parallelism=par))
    under = simulate(make(**kw, parallelism={**par, "ddp": {"overlap_param_gather": True}}))
    gathers = [t for t in under.program.tasks if t.kind == "all_gather" and t.group == "dp"]
    assert gathers and all(t.phase == "forward" and not t.deps for t in gathers)
    # each stage's gather ends before its first step starts and nothing runs after its optimizer step; with one
    # task per stage the first stage's first forward waits for its whole gather, so the saving is the tail
    # of the stages that do not set the iteration's end
    tl = under.timeline
    for g in gathers:
        first = min(
            (t for t in under.program.tasks if t.rank == g.rank and t.stream == "compute"), key=lambda t: t.id
        )
        assert tl.end[g.id] <= tl.start[first.id] + 1e-12
    opt_end = max(tl.end[t.id] for t in under.program.tasks if t.kind == "optimizer")
    assert under.metrics.iteration_time_s == pytest.approx(opt_end, rel=1e-12)
    assert under.metrics.iteration_time_s <= after.metrics.iteration_time_s * (1 + 1e-12)


def test_fsdp_beside_the_pipeline_gathers_before_the_first_forward_and_reduces_after_the_last_backward():
    """FSDP2 under torch.distributed.pipelining with reshard_after_forward false: per stage one all-gather of the
    stage's 16-bit weights before its first forward, one reduce-scatter of its gradients after its last
    backward, the step on 1/DP of the states; the bytes and the memory are the distributed optimizer's."""
    par = {"tensor_parallel": 4, "pipeline_parallel": 2, "data_parallel": 2}
    kw = {
        "model": MODEL,
        "cluster": {"num_nodes": 2},
        "training": {"global_batch_size": 8, "micro_batch_size": 1},
    }
    fsdp = simulate(make(**kw, parallelism={**par, "fsdp": {"reshard_after_forward": False}}))
    zero1 = simulate(make(**kw, parallelism={**par, "zero_stage": 1}))
    assert fsdp.metrics.strategy.startswith("megatron 1f1b + fsdp")
    tasks, tl = fsdp.program.tasks, fsdp.timeline
    for st in range(2):
        compute = [t for t in tasks if t.rank == st and t.stream == "compute" and t.kind != "optimizer"]
        (gather,) = [t for t in tasks if t.rank == st and t.kind == "all_gather" and t.group == "dp"]
        (reduce,) = [t for t in tasks if t.rank == st and t.kind == "reduce_scatter" and t.group == "dp"]
        assert tl.end[gather.id] <= min(tl.start[t.id] for t in compute) + 1e-12
        assert tl.start[reduce.id] >= max(tl.end[t.id] for t in compute) - 1e-12
        stage_weights = fsdp.program.ranks[st].memory.params  # 16-bit weights, whole
        assert gather.bytes == pytest.approx(stage_weights)
        assert reduce.bytes == pytest.approx(stage_weights)  # bf16 gradients
    f, z = fsdp.metrics, zero1.metrics
    assert f.comm["bytes_per_gpu"] == pytest.approx(z.comm["bytes_per_gpu"], rel=1e-12)
    assert [r.memory for r in fsdp.program.ranks] == [r.memory for r in zero1.program.ranks]
    with pytest.raises(ScenarioError, match="reshard_after_forward: false"):
        simulate(make(**kw, parallelism={**par, "fsdp": {}}))
    with pytest.raises(ScenarioError, match="hybrid_shard_size"):
        simulate(
            make(**kw, parallelism={**par, "fsdp": {"reshard_after_forward": False, "hybrid_shard_size": 2}})
        )


def test_fsdp_reducing_in_fp32_moves_and_accumulates_4_bytes_per_gradient():
    """torchtitan's MixedPrecisionPolicy reduces in fp32 (the pytorch-2024 profile, or fsdp.reduce_in_fp32):
    beside the pipeline every micro-batch's backward runs without gradient sync, so the stage keeps its
    gradients unsharded in fp32 (_fsdp_param.py to_accumulated_grad_if_needed): 4 bytes per parameter against
    the 16-bit weights' 2, and the reduce-scatter after the last backward moves them in fp32. Without a
    pipeline, each block's reduce-scatter moves 4 bytes per parameter."""
    par = {"tensor_parallel": 4, "pipeline_parallel": 2, "data_parallel": 2}
    kw = {
        "model": MODEL,
        "cluster": {"num_nodes": 2},
        "training": {"global_batch_size": 8, "micro_batch_size": 1},
    }
    fsdp = {"reshard_after_forward": False}
    bf16 = simulate(make(**kw, parallelism={**par, "fsdp": {**fsdp, "reduce_in_fp32": False}}))
    fp32 = simulate(make(**kw, parallelism={**par, "fsdp": {**fsdp, "reduce_in_fp32": True}}))
    torchtitan = simulate(make(**kw, parallelism={**par, "fsdp": fsdp}, framework="pytorch-2024"))
    for st in range(2):
        weights = bf16.program.ranks[st].memory.params  # the stage's 16-bit weights, whole
        for r in (fp32, torchtitan):
            mem = r.program.ranks[st].memory
            assert mem.params == pytest.approx(weights)
            assert mem.grads == pytest.approx(2 * weights)  # 4 bytes against 2
            assert mem.optimizer == pytest.approx(bf16.program.ranks[st].memory.optimizer)
            (reduce,) = [t for t in r.program.tasks if t.rank == st and t.kind == "reduce_scatter"]
            assert reduce.bytes == pytest.approx(2 * weights)
        # FSDP2 (torchtitan's fully_shard) copies the fp32 gradients into the reduce-scatter input first: a read
        # and a write; the profile-less run (fsdp_copies off) reduces straight from them
        by_id = {t.id: t for t in torchtitan.program.tasks}
        (reduce,) = [t for t in torchtitan.program.tasks if t.rank == st and t.kind == "reduce_scatter"]
        (copy_in,) = [by_id[d] for d in reduce.deps]
        assert copy_in.name.endswith("grad copy-in") and copy_in.stream == reduce.stream
        assert sum(op.bytes for op in copy_in.ops) == pytest.approx(2 * reduce.bytes)
        assert not [t for t in fp32.program.tasks if t.name.endswith("copy-in")]
        assert bf16.program.ranks[st].memory.grads == pytest.approx(weights)
    # FSDP without a pipeline: one reduce-scatter per block and microbatch, 4 bytes per parameter in fp32
    flat = {**kw, "training": {"global_batch_size": 16, "micro_batch_size": 1}}
    r16 = simulate(make(**flat, parallelism={"data_parallel": 16, "fsdp": {"reduce_in_fp32": False}}))
    r32 = simulate(make(**flat, parallelism={"data_parallel": 16, "fsdp": {"reduce_in_fp32": True}}))
    layer = r16.workload.layer.params
    for r, per_param in ((r16, 2), (r32, 4)):
        sizes = [t.bytes for t in r.program.tasks if t.kind == "reduce_scatter" and "layer" in t.name]
        assert len(sizes) == MODEL["num_layers"]  # one per block (one microbatch)
        assert sizes == pytest.approx([per_param * layer] * len(sizes))


def test_pipedream_2bw_has_no_bubble_in_steady_state_and_keeps_two_weight_versions():
    """No flush: one iteration is m (t_F + t_B) + the optimizer step, against (m + p - 1) (t_F + t_B) + step for
    1F1B, on the same equal stages with free communication; the second weight version is held as a buffer."""
    p, m = 4, 8
    one, bw = pipeline(p, m, "1f1b"), pipeline(p, m, "pipedream-2bw")
    step = one.metrics.breakdown["optimizer_s"]
    per_microbatch = (one.metrics.iteration_time_s - step) / (m + p - 1)
    assert bw.metrics.bubble_fraction == pytest.approx(0.0, abs=1e-12)
    assert bw.metrics.iteration_time_s == pytest.approx(m * per_microbatch + step, rel=1e-9)
    stage = bw.program.ranks[0].memory
    assert stage.buffers == pytest.approx(stage.params)  # 16-bit weights, one more copy
    assert [r.memory.activations for r in bw.program.ranks] == pytest.approx(
        [r.memory.activations for r in one.program.ranks]
    )


def test_deepspeed_train_schedule_instructions_by_hand():
    """deepspeed/runtime/pipe/schedule.py TrainSchedule, 2 stages, 3 microbatches: stage 0 sends an activation
    one step after computing it, after receiving the previous gradient; stage 1 sends each gradient one step
    after its backward, before receiving the next activation."""
    from simulator.strategy.schedules.deepspeed_train import commands

    def plain(stage):
        return " ".join(f"{c.kind}{c.microbatch}" for c in commands(2, 3, stage) if c.kind != "load")

    assert plain(0) == "F0 send_act0 F1 recv_grad0 send_act1 B0 F2 recv_grad1 send_act2 B1 recv_grad2 B2"
    assert plain(1) == "recv_act0 F0 B0 send_grad0 recv_act1 F1 B1 send_grad1 recv_act2 F2 B2 send_grad2"


def test_deepspeed_pipeline_transfers_block_both_stages():
    """Two stages, m microbatches, forward f and backward b per stage, each transfer T: DeepSpeed's blocking
    send / receive pairs put every transfer on the critical path, (m + 1)(f + b) + 2 m T until stage 0's last
    backward ends (Megatron's 1F1B sends each activation as part of the step that made it)."""
    m = 4
    r = pipeline(2, m, "deepspeed", ideal=False)
    tl, tasks = r.timeline, r.program.tasks

    def length(pred):
        durations = {round(tl.end[t.id] - tl.start[t.id], 12) for t in tasks if pred(t)}
        assert len(durations) == 1
        return durations.pop()

    f = length(lambda t: t.kind == "forward")
    b = length(lambda t: t.kind == "backward")
    transfer = length(lambda t: t.kind == "send_recv")
    assert transfer > 0
    last_b = max(tl.end[t.id] for t in tasks if t.kind == "backward" and t.rank == 0)
    assert last_b == pytest.approx((m + 1) * (f + b) + 2 * m * transfer, rel=1e-9)


@pytest.mark.parametrize("p,m", [(4, 4), (4, 8), (8, 8), (8, 16)])
def test_deepspeed_pipeline_transfers_on_deeper_pipelines(p, m):
    """Past two stages a middle stage meets both neighbours: every forward step starts with its gradient send
    and activation receive, every backward step with its gradient receive and activation send, and the stages
    stay in 1F1B's rhythm (f + b per microbatch). Stage 0's last backward ends at
    (m + p - 1)(f + b) + (4m + 2p - 8) T: found by replaying TrainSchedule's blocking pairs independently
    (each send and its receive start when both stages reach them and end T later) for p = 3..8, any f, b, T."""
    r = pipeline(p, m, "deepspeed", ideal=False)
    tl, tasks = r.timeline, r.program.tasks

    def length(kind):
        durations = {round(tl.end[t.id] - tl.start[t.id], 12) for t in tasks if t.kind == kind}
        assert len(durations) == 1
        return durations.pop()

    f, b, transfer = length("forward"), length("backward"), length("send_recv")
    assert transfer > 0
    last_b = max(tl.end[t.id] for t in tasks if t.kind == "backward" and t.rank == 0)
    assert last_b == pytest.approx((m + p - 1) * (f + b) + (4 * m + 2 * p - 8) * transfer, rel=1e-9)


def test_uneven_end_stages_with_interleaving_split_each_stage_over_its_chunks():
    """Llama 3 405B's layout in small: 14 layers on 4 stages x 2 chunks with 3 layers on the end stages: the
    middle stages hold 4 (2 per chunk), the first stage's first chunk and the last stage's last chunk one layer
    fewer (1 + 2 and 2 + 1), every layer once; the interleaved schedule runs it."""
    from simulator.strategy.pipeline.partition import chunk_units

    s = make(
        model={**MODEL, "num_layers": 14},
        cluster={"gpus_per_node": 4},
        training={"global_batch_size": 8, "micro_batch_size": 1},
        parallelism={
            "pipeline_parallel": 4,
            "pipeline_schedule": "interleaved-1f1b",
            "virtual_pipeline_stages": 2,
            "first_pipeline_stage_layers": 3,
            "last_pipeline_stage_layers": 3,
        },
    )
    chunks = chunk_units(build_workload(s), 4, 2)
    layers = {k: [u.name for u in us if u.is_layer] for k, us in chunks.items()}
    assert [len(layers[(st, c)]) for c in range(2) for st in range(4)] == [1, 2, 2, 2, 2, 2, 2, 1]
    order = [n for c in range(2) for st in range(4) for n in layers[(st, c)]]
    assert order == [f"layer {i}" for i in range(14)]
    assert stage_labels(simulate(s)) == uneven_labels(3, 4, 3, 4)
    # one chunk may hold the embedding alone (Megatron's --account-for-embedding-in-pipeline-split) ...
    alone = s.model_copy(
        update={
            "parallelism": s.parallelism.model_copy(
                update={"first_pipeline_stage_layers": 1, "last_pipeline_stage_layers": 5}
            )
        }
    )
    first = chunk_units(build_workload(alone), 4, 2)[(0, 0)]
    assert [u.name for u in first] == ["embedding"] and stage_labels(simulate(alone))[0].endswith("embedding")
    # ... but two chunks without a layer are refused
    bad = make(
        model={**MODEL, "num_layers": 20},
        cluster={"gpus_per_node": 4},
        training={"global_batch_size": 8, "micro_batch_size": 1},
        parallelism={
            "pipeline_parallel": 4,
            "pipeline_schedule": "interleaved-1f1b",
            "virtual_pipeline_stages": 4,
            "first_pipeline_stage_layers": 2,
            "last_pipeline_stage_layers": 2,
        },
    )
    with pytest.raises(ScenarioError, match="more than one of the stage's virtual_pipeline_stages"):
        simulate(bad)


def deepspeed_pipe(zero_stage=0, precision="bf16", **zero_cfg):
    """DeepSpeed's pipeline engine: 2 stages x 4 data-parallel ranks, 4 microbatches, an untied model."""
    return simulate(
        make(
            model={**MODEL, "tied_embeddings": False},
            training={"global_batch_size": 16, "micro_batch_size": 1, "precision": precision},
            parallelism={
                "pipeline_parallel": 2,
                "data_parallel": 4,
                "pipeline_schedule": "deepspeed",
                "zero_stage": zero_stage,
                "zero": zero_cfg,
            },
        )
    )


def test_deepspeed_bf16_optimizer_all_reduces_fp32_gradients_and_gathers_bf16_weights():
    """bf16 without ZeRO runs BF16_Optimizer (engine.py _do_optimizer_sanity_check, v0.16.5): each stage
    all-reduces its fp32 gradients, 4 bytes x 2(n-1)/n per parameter on a ring of n = 4, steps its 1/n and
    all-gathers the bf16 weights, 2 bytes x (n-1)/n; every backward adds the bf16 gradients into the fp32 copy
    (18 bytes per parameter). Memory: bf16 weights 2 + gradients 2 + 4 (fp32) whole, optimizer 12/n."""
    r = deepspeed_pipe()
    n, params = 4, [sum(u.params for u in units) for units in stage_units(r)]
    by = r.metrics.comm_by_collective
    mean = sum(params) / len(params)  # the metrics average over the two stages' ranks
    assert by["all_reduce:dp"]["bytes_sent_per_gpu"] == pytest.approx(mean * 4 * 2 * (n - 1) / n, rel=1e-9)
    assert by["all_gather:dp"]["bytes_sent_per_gpu"] == pytest.approx(mean * 2 * (n - 1) / n, rel=1e-9)
    updates = [op for t in r.program.tasks for op in t.ops if op.name == "BF16_Optimizer update_hp_grads"]
    assert len(updates) == 2 * 4  # every backward of both stages
    assert {op.bytes for op in updates} == {p * 18 for p in params}
    assert not any(op.name.startswith("gradient accumulation") for t in r.program.tasks for op in t.ops)
    for rank, p in zip(r.program.ranks, params, strict=True):
        assert rank.memory.grads == pytest.approx(p * 6)
        assert rank.memory.optimizer == pytest.approx(p * 12 / n)
    # grad_accum_dtype bf16 keeps the plain engine: one bf16 all-reduce, every rank steps every weight
    plain = deepspeed_pipe(grad_accum_dtype="bf16").metrics.comm_by_collective
    assert plain["all_reduce:dp"]["bytes_sent_per_gpu"] == pytest.approx(mean * 2 * 2 * (n - 1) / n, rel=1e-9)
    assert "all_gather:dp" not in plain


def test_deepspeed_pipeline_zero1_reduces_gradients_as_the_release_does():
    """ReduceGrads with ZeRO-1 runs stage_1_and_2.py reduce_gradients: from v0.12.4 each bucket is all-reduced
    (2(n-1)/n of the gradients), before one reduce per owning rank ((n-1)/n of them in all): twice the bytes."""
    new = deepspeed_pipe(1, "fp16").metrics.comm_by_collective
    old = deepspeed_pipe(1, "fp16", deepspeed_version="0.12.3").metrics.comm_by_collective
    assert new["all_reduce:dp"]["bytes_sent_per_gpu"] == pytest.approx(
        2 * old["reduce:dp"]["bytes_sent_per_gpu"], rel=1e-9
    )
    assert old["reduce:dp"]["count"] == 4 * new["all_reduce:dp"]["count"]  # one reduce per rank of 4
    assert new["all_gather:dp"] == pytest.approx(old["all_gather:dp"])


def stage_units(result):
    from simulator.strategy.pipeline.partition import chunk_units

    s, w = result.scenario, result.workload
    chunks = chunk_units(w, s.parallelism.pipeline_parallel, 1)
    return [chunks[(st, 0)] for st in range(s.parallelism.pipeline_parallel)]


def test_interleaved_bubble_at_pp8_v12_m16_is_p_minus_1_over_v_m_with_free_communication():
    """Issue 31's Nemotron-style layout (PP 8, 12 virtual stages, 16 micro-batches): with free communication and
    equal stages the bubble is (p-1)/(v m) = 3.6% (as the simulator measures it, (p-1)/(v m + p-1)) within 0.5
    points."""
    p, v, m = 8, 12, 16
    model = {**MODEL, "num_layers": p * v}
    s = make(
        model=model,
        cluster={"gpus_per_node": p},
        training={"global_batch_size": m, "micro_batch_size": 1},
        parallelism={
            "pipeline_parallel": p,
            "pipeline_schedule": "interleaved-1f1b",
            "virtual_pipeline_stages": v,
        },
    )
    w = build_workload(s)
    empty = Block("none", (), (), (), 0)
    w = replace(w, embedding=replace(empty, name="embedding"), head=replace(empty, name="head"))
    bubble = simulate(s, cluster=ideal_network_cluster(s), workload=w).metrics.bubble_fraction
    assert abs(bubble - (p - 1) / (v * m)) < 0.005
    assert bubble == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-9)


def overlapped(overlap: bool, **par):
    """PP 4 with 2 virtual stages on one DGX A100 (sends over NVLink), 8 micro-batches, DP 2 with the
    distributed optimizer and overlapped gradient reduce and parameter gather."""
    return make(
        model=MODEL,
        cluster={"gpus_per_node": 8},
        training={"global_batch_size": 16, "micro_batch_size": 1},
        parallelism={
            "pipeline_parallel": 4,
            "pipeline_schedule": "interleaved-1f1b",
            "virtual_pipeline_stages": 2,
            "data_parallel": 2,
            "zero_stage": 1,
            "overlap_p2p_comm": overlap,
            "ddp": {"overlap_grad_reduce": True, "overlap_param_gather": True},
            **par,
        },
        framework="megatron-core-2024",
    )


def test_overlapped_p2p_leaves_the_senders_compute_and_exposes_only_what_a_receiver_waits_for():
    """Megatron-Core --overlap-p2p-communication: sends run on their own stream, so no step blocks in a send (and
    no host sync at each p2p); what remains exposed is the time a receiving step waits for the transfer after the
    sender's compute, here about 60% of the blocking sends' (NVLink, PP 4 x 2 chunks, 8 micro-batches)."""
    blocking_r = simulate(overlapped(False), periodic=False)
    async_r = simulate(overlapped(True), periodic=False)
    blocking = blocking_r.metrics.comm_by_collective["send_recv:pp"]
    async_ = async_r.metrics.comm_by_collective["send_recv:pp"]
    assert blocking["exposed_s"] == pytest.approx(blocking["time_s"], rel=1e-9)  # all inside the steps
    assert async_["time_s"] == pytest.approx(blocking["time_s"], rel=1e-6)  # the same transfers
    assert async_["exposed_s"] < 0.7 * blocking["exposed_s"]
    inside = [
        p
        for t in async_r.program.tasks
        if t.stream == "compute"
        for p in async_r.timeline.parts.get(t.id, ())
    ]
    assert not [p for p in inside if p.kind == "send_recv"]  # no compute step carries a send
    assert async_r.metrics.iteration_time_s < blocking_r.metrics.iteration_time_s - blocking["time_s"] / 2


def test_chunk_reduce_scatters_follow_the_order_chunks_finish_and_each_chunk_gathers_its_own_params():
    """Interleaved: chunk 1 finishes its backwards before chunk 0, so its gradient reduce-scatter starts before
    chunk 0's last backward ends; each chunk's first forward waits for its own parameter all-gather only."""
    r = simulate(overlapped(True), periodic=False)
    tl, tasks = r.timeline, [t for t in r.program.tasks if t.rank == 0]
    rs = {t.name: t for t in tasks if t.kind == "reduce_scatter"}
    last_b = {
        c: max(tl.end[t.id] for t in tasks if t.kind == "backward" and t.name.endswith(f".{c}"))
        for c in (0, 1)
    }
    assert tl.start[rs["chunk 1 grad reduce-scatter"].id] >= last_b[1]
    assert tl.start[rs["chunk 1 grad reduce-scatter"].id] < last_b[0]
    gathers = {t.name: t.id for t in tasks if t.kind == "all_gather"}
    assert set(gathers) == {"chunk 0 param all-gather", "chunk 1 param all-gather"}
    first_f1 = min(
        (t for t in tasks if t.kind == "forward" and t.name.endswith(".1")), key=lambda t: tl.start[t.id]
    )
    assert gathers["chunk 1 param all-gather"] in first_f1.deps
    assert gathers["chunk 0 param all-gather"] not in first_f1.deps


@pytest.mark.parametrize("release,whole", [("0.5.3", True), ("0.5.4", False), ("0.16.4", False)])
def test_deepspeed_pipeline_sends_gradients_whole_before_0_5_4(release, whole):
    """engine.py partitions the activation it sends over the tensor-parallel group (is_pipe_partitioned: 1/t
    per rank); the gradient sent back only from v0.5.4 (is_grad_partitioned = False in v0.5.0-v0.5.3): before,
    every rank sends the whole tensor, t times the bytes. 2 stages, TP 2, micro-batch 1: 1 x seq x hidden x 2
    bytes, halved."""
    r = simulate(
        make(
            model={**MODEL, "tied_embeddings": False},
            training={"global_batch_size": 4, "micro_batch_size": 1, "precision": "fp16"},
            parallelism={
                "pipeline_parallel": 2,
                "tensor_parallel": 2,
                "data_parallel": 1,
                "pipeline_schedule": "deepspeed",
                "zero": {"deepspeed_version": release},
            },
            cluster={"gpus_per_node": 4},
        )
    )
    sends = [(t.name, op.bytes) for t in r.program.tasks for op in t.ops if op.name == "pipeline send"]
    act = MODEL["seq_length"] * MODEL["hidden_size"] * 2 / 2
    assert {b for n, b in sends if n.startswith("activation")} == {act}
    assert {b for n, b in sends if n.startswith("gradient")} == {act * 2 if whole else act}
    assert len(sends) == 2 * 4  # each of 4 micro-batches: one activation forward, one gradient back


@pytest.mark.parametrize("periodic", [True, False])
def test_interleaved_needs_a_multiple_of_pp_micro_batches_with_or_without_the_periodic_replay(periodic):
    """Issue 63: 1,002 micro-batches on PP 4 is refused whether the replay is exact or periodic (the periodic one
    samples a few counts that are multiples of 4; the check must see the real count)."""
    s = make(
        model={**GPT_SMALL, "num_layers": 16},
        training={"global_batch_size": 2004, "micro_batch_size": 1},
        parallelism={
            "pipeline_parallel": 4,
            "data_parallel": 2,
            "pipeline_schedule": "interleaved-1f1b",
            "virtual_pipeline_stages": 2,
        },
    )
    with pytest.raises(ScenarioError, match=r"= 1002, to be a multiple of pipeline_parallel \(4\)"):
        simulate(s, periodic=periodic)


def test_virtual_stages_without_a_schedule_run_interleaved_as_megatron_infers():
    """Megatron's get_forward_backward_func picks the interleaved schedule whenever virtual stages are set; a
    schedule named beside them is the user's, and 1F1B with virtual stages is refused naming both."""
    layout = {"pipeline_parallel": 4, "data_parallel": 2, "virtual_pipeline_stages": 2}
    model, training = {**GPT_SMALL, "num_layers": 16}, {"global_batch_size": 16}
    s = make(model=model, training=training, parallelism=layout)
    assert s.parallelism.pipeline_schedule == "interleaved-1f1b"
    explicit = make(model=model, training=training, parallelism={**layout, "pipeline_schedule": "1f1b"})
    with pytest.raises(
        ScenarioError, match=r"virtual_pipeline_stages \(2\) needs pipeline_schedule: interleaved"
    ):
        simulate(explicit)


def test_interleaved_without_virtual_stages_is_refused_not_run_as_1f1b():
    """Issue 62: it ran as plain 1F1B without a word."""
    s = make(
        model={**GPT_SMALL, "num_layers": 16},
        training={"global_batch_size": 16},
        parallelism={"pipeline_parallel": 4, "data_parallel": 2, "pipeline_schedule": "interleaved-1f1b"},
    )
    with pytest.raises(ScenarioError, match="interleaved-1f1b needs virtual_pipeline_stages >= 2"):
        simulate(s)
