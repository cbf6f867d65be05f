"""Mixture-of-experts training: the MoE layer's kernels and collectives, expert parallelism folded over the
attention's ranks, the busiest rank under imbalance and capacity, memory, and the all-to-all on the graph
against published nccl-tests."""

import dataclasses
import math
from pathlib import Path

import pytest
import yaml
from conftest import SMALL_MOE

from simulator import load_scenario, simulate
from simulator.costs.collectives import CollectiveModel, ring_bytes_per_rank
from simulator.errors import ScenarioError
from simulator.hardware.cluster import Cluster
from simulator.hardware.placement import Placement
from simulator.hardware.topology import load_topology
from simulator.scenario.moe_config import ExpertLoadConfig, MoeConfig
from simulator.workload.expert_load import expert_load, expert_shares
from simulator.workload.params import mlp_params
from simulator.workload.transformer import build_workload

VALIDATION = Path(__file__).parents[1] / "simulator" / "validation"


def scenario(model=None, nodes=1, framework="ideal", training=None, gpus=8, **par):
    return load_scenario(
        {
            "model": model or SMALL_MOE,
            "cluster": {"topology": "dgx-h100", "num_nodes": nodes, "gpus_per_node": gpus},
            "framework": framework,
            "kernels": "none",
            "training": {"global_batch_size": 2 * gpus * nodes, "micro_batch_size": 2, **(training or {})},
            "parallelism": par,
        }
    )


def op(block_ops, name):
    return next(o for o in block_ops if o.name == name)


def test_dispatch_all_to_all_moves_tokens_x_top_k_x_hidden_bytes_and_each_rank_sends_ep_minus_1_over_ep():
    s = scenario(expert_parallel=8)
    w = build_workload(s)
    layer = w.layers[0]
    a2a = op(layer.forward, "ep all-to-all (dispatch tokens)")
    tokens, k, h, e = 2 * 2048, 2, 1024, 2  # micro-batch x sequence on one rank, top-k, hidden, bf16
    assert a2a.bytes == tokens * k * h * e
    assert ring_bytes_per_rank("all_to_all", 8, a2a.bytes) == tokens * k * h * e * 7 / 8
    # and the run reports that per GPU: 4 token all-to-alls per layer and micro-batch (dispatch and combine,
    # forward and backward), each sending (EP - 1) / EP of its buffer
    m = simulate(s).metrics
    sent = m.comm_by_collective["all_to_all:ep"]["bytes_sent_per_gpu"]
    probs = tokens * k * 4  # the routing probabilities go along (fp32), forward and backward
    per_layer = 4 * tokens * k * h * e + 2 * probs
    micro = s.gradient_accumulation_steps  # 16 sequences / (2 per micro-batch x 8 data-parallel ranks) = 1
    assert sent == pytest.approx(micro * 2 * per_layer * 7 / 8, rel=1e-12)  # 2 layers


def test_one_expert_top_1_is_the_dense_mlp_plus_the_routing_kernels():
    """EP = 1, one expert, top-1: the experts' GEMMs are exactly the dense MLP's; the MoE layer adds only the
    router and the token permutation, so the iteration time is the dense model's plus those kernels' time (on one
    GPU: nothing to overlap them with; the activation's reading of the routing probability and the router's
    optimizer step are the 0.1% left)."""
    one = {**SMALL_MOE, "moe": {"num_experts": 1, "top_k": 1, "aux_loss": "none"}}
    dense = {k: v for k, v in SMALL_MOE.items() if k != "moe"}
    moe_run, dense_run = simulate(scenario(one, gpus=1)), simulate(scenario(dense, gpus=1))
    moe_layer, dense_layer = moe_run.workload.layers[0], dense_run.workload.layers[0]
    gemms = sorted((o.m, o.n, o.k) for o in moe_layer.forward if o.kind == "gemm" and o.name != "router")
    assert gemms == sorted((o.m, o.n, o.k) for o in dense_layer.forward if o.kind == "gemm")
    dense_names = {o.name for o in (*dense_layer.forward, *dense_layer.backward)}
    shared_fwd = {"mlp up projection": "experts fc1", "mlp down projection": "experts fc2"}
    extra = [
        o
        for o in (*moe_layer.forward, *moe_layer.backward)
        if o.name not in dense_names
        and not o.name.startswith("experts")  # the experts' kernels match the dense MLP's one for one
    ]
    assert {o.name for o in extra} >= {"router", "permute tokens", "unpermute tokens (k-way sum)"}
    compute = moe_run.compute
    extra_s = sum(compute.op_cost(o)[0] for o in extra)
    same = [(moe, dense) for dense, moe in shared_fwd.items()]
    for moe_name, dense_name in same:
        assert compute.op_cost(op(moe_layer.forward, moe_name))[0] == pytest.approx(
            dense_run.compute.op_cost(op(dense_layer.forward, dense_name))[0], rel=1e-12
        )
    micro, layers = moe_run.scenario.gradient_accumulation_steps, 2
    assert moe_run.metrics.iteration_time_s - dense_run.metrics.iteration_time_s == pytest.approx(
        micro * layers * extra_s, rel=1e-3
    )
    # memory: the router's weights (and their states), the routing tensors and the permuted copy of the tokens
    assert moe_run.metrics.memory_gib["params"] > dense_run.metrics.memory_gib["params"]


def test_dropless_with_uniform_load_equals_capacity_factor_1():
    base = scenario(expert_parallel=8).model.moe
    dropless = expert_load(base, 4096, 8, 1)
    capped = expert_load(base.model_copy(update={"capacity_factor": 1.0}), 4096, 8, 1)
    assert dropless == capped and capped.dropped == 0.0
    a = simulate(scenario(expert_parallel=8)).metrics
    b = simulate(
        scenario({**SMALL_MOE, "moe": {**SMALL_MOE["moe"], "capacity_factor": 1.0}}, expert_parallel=8)
    ).metrics
    assert a.iteration_time_s == b.iteration_time_s and b.moe["tokens_dropped_fraction"] == 0.0


def test_expert_parameter_memory_divides_by_ep_x_etp():
    def experts(ep, etp, tp):
        s = scenario(
            tensor_parallel=tp, sequence_parallel=tp > 1, expert_parallel=ep, expert_tensor_parallel=etp
        )
        return build_workload(s).expert_params_per_rank

    whole = experts(1, 1, 1)
    assert whole == 2 * 8 * mlp_params(scenario().model, 2816)  # two layers of 8 experts
    for ep, etp, tp in ((2, 1, 1), (8, 1, 1), (4, 2, 2), (2, 4, 4), (1, 8, 8)):
        assert experts(ep, etp, tp) * ep * etp == whole, (ep, etp)


def test_expert_groups_fold_over_the_attention_ranks():
    """Megatron-Core's example: 64 GPUs, TP 2, CP 2, DP 16, EP 8: an EP group is 8 consecutive ranks spanning
    TP, CP and two DP replicas; EDP = 64 / 8 = 8, strided by 8."""
    p = Placement(tp=2, cp=2, dp=16, ep=8, etp=1)
    assert p.groups("ep")[0] == tuple(range(8)) and p.edp == 8
    assert p.groups("edp")[1] == tuple(range(1, 64, 8))
    pp = Placement(tp=2, dp=4, pp=2, ep=4, etp=2)
    assert pp.groups("etp")[0] == (0, 1) and pp.groups("ep")[0] == (0, 2, 4, 6)
    assert pp.groups("ep")[-1] == (9, 11, 13, 15)  # the second stage's ranks


def test_capacity_drops_what_exceeds_c_x_the_mean_and_no_rank_computes_more():
    hot = MoeConfig(num_experts=8, top_k=2, load=ExpertLoadConfig(imbalance=3.0))
    free = expert_load(hot, 1024, 8, 1)
    assert free.imbalance == pytest.approx(3.0) and free.dropped == 0.0
    capped = expert_load(hot.model_copy(update={"capacity_factor": 1.25}), 1024, 8, 1)
    mean = 1024 * 2 / 8 * 8  # rows per expert from all 8 sources
    assert max(capped.rows) <= 1.25 * mean + 8  # ceil per source
    # the hot expert keeps 1.25 / 3 of its 3x share: (3 - 1.25) / 8 of the copies are dropped
    assert capped.dropped == pytest.approx((3 - math.ceil(1.25 * 256) / 256) / 8, rel=1e-9)


def test_skewed_load_is_seeded_and_sums_to_one():
    cfg = ExpertLoadConfig(skew=1.0, seed=3)
    a, b = expert_shares(cfg, 64), expert_shares(cfg, 64)
    assert a == b and sum(a) == pytest.approx(1.0) and max(a) / min(a) == pytest.approx(64.0)
    other = expert_shares(ExpertLoadConfig(skew=1.0, seed=4), 64)
    assert other != a and sorted(other) == pytest.approx(sorted(a), rel=1e-12)


def test_the_busiest_rank_sets_the_pace():
    even = simulate(scenario(expert_parallel=8)).metrics
    skewed_model = {**SMALL_MOE, "moe": {**SMALL_MOE["moe"], "load": {"imbalance": 2.0}}}
    skewed = simulate(scenario(skewed_model, expert_parallel=8)).metrics
    assert skewed.moe["busiest_rank_load"] == pytest.approx(2.0)
    assert skewed.iteration_time_s > even.iteration_time_s


ALLTOALL = {
    c["id"]: c
    for c in yaml.safe_load((VALIDATION / "nccl_tests.yaml").read_text())["curves"]
    if c["op"] == "all_to_all"
}


@pytest.mark.parametrize("curve", sorted(ALLTOALL))
def test_all_to_all_on_the_graph_is_within_15_percent_of_published_nccl_tests(curve):
    c = ALLTOALL[curve]
    cm = CollectiveModel(Cluster(load_topology(c["topology"]), c["nodes"]), Placement(dp=c["ranks"]))
    for size, us in c["times_us"].items():
        assert cm.standalone_time_s("all_to_all", "dp", size) * 1e6 == pytest.approx(us, rel=0.15), size


def test_expert_all_to_all_stays_on_nvlink_inside_a_node_and_crosses_nics_beyond():
    sixteen = {**SMALL_MOE, "moe": {"num_experts": 16, "top_k": 2}}
    inside = simulate(scenario(sixteen, expert_parallel=8, nodes=2)).metrics.comm_by_collective[
        "all_to_all:ep"
    ]
    assert inside["bytes_cross_node_per_gpu"] == 0.0
    across = simulate(scenario(sixteen, expert_parallel=16, nodes=2)).metrics.comm_by_collective[
        "all_to_all:ep"
    ]
    assert across["bytes_cross_node_per_gpu"] == pytest.approx(
        across["bytes_sent_per_gpu"] * 8 / 15, rel=1e-9
    )


@pytest.mark.parametrize(
    "model, par, text",
    [
        (
            {**SMALL_MOE, "moe": {"num_experts": 8, "top_k": 9}},
            {},
            "model.moe.top_k (9) exceeds num_experts (8)",
        ),
        (SMALL_MOE, {"expert_parallel": 3}, "expert_parallel (3) does not divide model.moe.num_experts (8)"),
        (
            SMALL_MOE,
            {"expert_parallel": 8, "expert_tensor_parallel": 2},
            "= 16 does not divide tensor_parallel (1)",
        ),
        ({**SMALL_MOE, "moe": {"num_experts": 8, "capacity_factor": 0}}, {}, "capacity_factor"),
        (SMALL_MOE, {"tensor_parallel": 2}, "need sequence_parallel: true"),
        (
            {k: v for k, v in SMALL_MOE.items() if k != "moe"},
            {"expert_parallel": 2},
            "need a mixture-of-experts",
        ),
        (SMALL_MOE, {"fsdp": {}}, "not modelled with model.moe"),
        (SMALL_MOE, {"moe": {"overlap_a2a": True}}, "overlap_a2a needs expert_parallel > 1"),
        (
            SMALL_MOE,
            {"expert_parallel": 2, "moe": {"overlap_a2a": True, "dispatcher": "allgather"}},
            "not allgather",
        ),
        (
            SMALL_MOE,
            {"expert_parallel": 2, "zero_stage": 2, "moe": {"overlap_a2a": True}},
            "use zero_stage 0 or 1",
        ),
        (
            SMALL_MOE,
            {"expert_parallel": 2, "pipeline_parallel": 2, "moe": {"overlap_a2a": True}},
            "virtual_pipeline_stages >= 2",
        ),
    ],
)
def test_bad_moe_input_is_one_line_naming_the_field(model, par, text):
    with pytest.raises(ScenarioError) as e:
        scenario(model, **par)
    assert text in str(e.value) and "\n" not in str(e.value)


def test_moe_metrics_and_active_flops():
    r = simulate(scenario(expert_parallel=8))
    w = r.workload
    # model FLOPs count the top-k experts a token uses, not all of them: 3 x forward
    layer = w.layers[0]
    routed = sum(o.model_flops for o in layer.forward if o.name.startswith("experts") and o.kind == "gemm")
    tokens = 2 * 2048
    assert routed == pytest.approx(2 * tokens * 2 * (2 * 2816 * 1024 + 2816 * 1024), rel=1e-12)
    assert r.metrics.moe["tokens_dropped_fraction"] == 0.0 and r.metrics.moe["expert_comm_s"] > 0
    assert dataclasses.asdict(w.expert_load)["imbalance"] == 1.0


def test_megatron_flop_count_reproduces_nemos_deepseek_v3_figure():
    """NVIDIA's DGX Cloud DeepSeek-V3 benchmark: 163.7 TFLOP/s per GPU at 52.04 s per step on 1,024 H100 (NeMo's
    count, which Megatron-LM's since 2025-03 equals): MLA, 3 dense + 58 MoE layers of 8 + 1 experts, one MTP layer."""
    from simulator.metrics.flops import megatron_flops

    s = load_scenario(Path(__file__).parents[1] / "scenarios" / "moe" / "deepseek-v3-ep64-1024xh100.yaml")
    assert megatron_flops(s) / 52.04 / 1024 / 1e12 == pytest.approx(163.7, abs=0.05)


def test_deepep_sends_a_token_once_per_destination_rank_and_across_nodes_once_per_node():
    from simulator.workload.expert_load import distinct_groups

    # 8 experts on 8 ranks, top-2: every token goes to 2 distinct ranks
    assert distinct_groups(8, 2, 8) == pytest.approx(2.0)
    # 128 experts over 32 ranks on 4 nodes, top-8 (Qwen3-235B, EP 32): 7.2 ranks and 3.6 nodes, not 8 copies
    assert distinct_groups(128, 8, 32) == pytest.approx(32 * (1 - math.comb(124, 8) / math.comb(128, 8)))
    assert 3.5 < distinct_groups(128, 8, 4) < 3.7
    sixteen = {**SMALL_MOE, "moe": {"num_experts": 16, "top_k": 4}}
    s = scenario(sixteen, nodes=2, expert_parallel=16, moe={"dispatcher": "deepep"})
    layer = build_workload(s, gpus_per_node=8).layers[0]
    rdma = op(layer.forward, "deepep rdma (dispatch)")
    nvlink = op(layer.forward, "deepep nvlink forward (dispatch)")
    tokens, h, e = 2 * 2048, 1024, 2
    assert rdma.group == "ep%8" and rdma.bytes == pytest.approx(tokens * h * e * distinct_groups(16, 4, 2))
    assert nvlink.group == "ep/8" and nvlink.overlaps == "alongside"
    assert nvlink.bytes == pytest.approx(tokens * h * e * distinct_groups(16, 4, 16))
    # the RDMA leg carries fewer bytes than the all-to-all dispatcher's top-k copies
    assert rdma.bytes < tokens * 4 * h * e


@pytest.mark.parametrize(
    "name", ["mixtral-8x7b", "qwen2-57b-a14b", "qwen3-30b-a3b", "deepseek-v2-lite", "olmoe-1b-7b"]
)
def test_hugging_face_moe_configs_run(name):
    hf = Path(__file__).parent / "data" / "hf"
    s = load_scenario(
        {
            "model": {"hf_config": str(hf / f"{name}.json"), "seq_length": 2048},
            "cluster": {"topology": "dgx-h100", "num_nodes": 2},
            "training": {"global_batch_size": 32, "micro_batch_size": 1},
            "parallelism": {
                "expert_parallel": 8,
                "tensor_parallel": 2,
                "sequence_parallel": True,
                "zero_stage": 1,
            },
        }
    )
    m = simulate(s).metrics
    assert m.iteration_time_s > 0 and m.moe["expert_comm_s"] > 0 and 0 < m.mfu < 1


# -- grouped GEMM: each expert its own problem ------------------------------------------------------------------
def test_grouped_experts_are_one_grouped_gemm_of_local_experts_x_mean_rows_with_the_same_flops():
    s = scenario(expert_parallel=4)  # 8 experts over EP 4: 2 local experts
    layer = build_workload(s).layers[0]
    fc1 = op(layer.forward, "experts fc1")
    tokens, k, h = 2 * 2048, 2, 1024
    rows = tokens * k  # uniform load: this rank's 2 experts compute every copy the EP group routes to them
    assert (fc1.kernel, fc1.batch, fc1.m) == ("grouped_gemm", 2, rows // 2)
    assert fc1.flops == 2.0 * rows * fc1.n * h  # as many FLOPs as one GEMM of every row
    dgrad, wgrad = op(layer.backward, "experts fc1 dgrad"), op(layer.backward, "experts fc1 wgrad")
    assert (dgrad.kernel, wgrad.kernel, wgrad.batch) == ("grouped_gemm", "grouped_gemm", 2)
    assert (wgrad.m, wgrad.n, wgrad.k) == (h, fc1.n, rows // 2)  # each expert's wgrad reduces its own rows
    # one local expert is a plain GEMM
    one = op(build_workload(scenario(expert_parallel=8)).layers[0].forward, "experts fc1")
    assert (one.kernel, one.batch) == ("gemm", 1)


def test_few_rows_per_expert_leave_tiles_part_empty_and_many_rows_cost_what_one_gemm_costs():
    from simulator.costs.compute import ComputeModel
    from simulator.hardware.gpus import get_gpu
    from simulator.workload.ops import gemm

    model = ComputeModel(get_gpu("h200-sxm-141gb"), "bf16")
    # 16 experts x 128 rows, Qwen3-30B's fc1 (2048 -> 1536): 16 x ceil(128/128) x ceil(1536/256) = 96 tiles of
    # 128x256 fill 96 of 132 SMs in one wave; one GEMM of 2,048 rows takes 16 x 6 tiles too but could use
    # 128x128 tiles: 192 tiles, 2 waves of 132 -> 192/264 of the SMs busy (0.93 tile efficiency)
    few = model.op_time_s(gemm("g", 128, 1536, 2048, 16, grouped=True))
    one = model.op_time_s(gemm("g", 16 * 128, 1536, 2048))
    assert few >= one
    # 7 rows per expert: every expert's weights are still read whole (16 x 1536 x 2048 x 2 bytes from HBM), so
    # a row costs over 10x what it costs at 128 rows
    tiny = model.op_time_s(gemm("g", 7, 1536, 2048, 16, grouped=True))
    assert tiny > 16 * 1536 * 2048 * 2 / get_gpu("h200-sxm-141gb").hbm_bytes_per_s
    assert tiny / 7 > 10 * few / 128
    # 8,192 rows per expert: within 3% of one GEMM of all rows
    many = model.op_time_s(gemm("g", 8192, 1536, 2048, 16, grouped=True))
    assert many == pytest.approx(model.op_time_s(gemm("g", 16 * 8192, 1536, 2048)), rel=0.03)


def test_the_h200_table_holds_the_measured_grouped_gemms_and_a_lookup_returns_them():
    from functools import partial

    from simulator.costs.compute import ComputeModel, shape_roofline_s
    from simulator.hardware.gpus import get_gpu
    from simulator.tables.lookup import MEASURED, KernelLookup
    from simulator.tables.select import resolve_table
    from simulator.workload.ops import gemm

    table = resolve_table("h200-sxm-141gb-pt211", "h200-sxm-141gb")
    rows = {(r.op, r.m, r.n, r.k, r.batch): r.median_us for r in table.kernels}
    # Qwen3-30B EP 8 fc1: 16 experts x 128 rows grouped vs the same 2,048 rows as one GEMM (measured 2.1x)
    grouped, single = rows[("grouped_gemm", 128, 1536, 2048, 16)], rows[("gemm", 2048, 1536, 2048, 1)]
    assert 1.7 < grouped / single < 2.6
    # at 8,192 rows per expert the two are within 15%
    assert rows[("grouped_gemm", 8192, 1536, 2048, 16)] / rows[("gemm", 16 * 8192, 1536, 2048, 1)] < 1.15
    gpu = get_gpu("h200-sxm-141gb")
    model = ComputeModel(gpu, "bf16", kernels=KernelLookup(table.kernels, partial(shape_roofline_s, gpu)))
    cost, source = model.op_cost(gemm("g", 128, 1536, 2048, 16, grouped=True))
    assert source == MEASURED and cost == pytest.approx(grouped * 1e-6 + gpu.kernel_launch_s, rel=1e-9)


def test_deepspeed_dispatch_is_two_dense_einsums_around_a_capacity_padded_all_to_all():
    """deepspeed/moe/sharded_moe.py MOELayer: einsum("sec,sm->ecm"), all-to-all of [E, C, M], experts, all-to-all
    back, einsum("sec,ecm->sm"); every capacity slot computed."""
    model = {**SMALL_MOE, "moe": {**SMALL_MOE["moe"], "capacity_factor": 1.25}}
    s = scenario(model, expert_parallel=4, moe={"dispatcher": "deepspeed"})
    layer = build_workload(s).layers[0]
    tokens, h, e, experts, k = 2 * 2048, 1024, 2, 8, 2
    cap = math.ceil(1.25 * tokens * k / experts)  # DeepSpeed's _capacity: ceil(c S k / E)
    dispatch = op(layer.forward, "dispatch einsum sec,sm->ecm")
    assert (dispatch.m, dispatch.n, dispatch.k) == (experts * cap, h, tokens) and dispatch.model_flops == 0
    combine = op(layer.forward, "combine einsum sec,ecm->sm")
    assert (combine.m, combine.n, combine.k) == (tokens, h, experts * cap)
    a2a = op(layer.forward, "ep all-to-all (dispatch [E, C, M])")
    assert a2a.bytes == experts * cap * h * e  # the whole padded tensor, not the routed copies
    fc1 = op(layer.forward, "experts fc1")
    assert fc1.batch * fc1.m == 2 * cap * 4  # 2 local experts x capacity from each of the 4 EP ranks
    with pytest.raises(ScenarioError, match="set model.moe.capacity_factor"):
        scenario(SMALL_MOE, expert_parallel=4, moe={"dispatcher": "deepspeed"})
    with pytest.raises(ScenarioError, match="not deepspeed"):
        scenario(
            model,
            expert_parallel=4,
            pipeline_parallel=2,
            moe={"dispatcher": "deepspeed", "overlap_a2a": True},
        )


def test_megatron_moe_host_work_as_its_source_launches_it():
    """Megatron-LM 1e057005 (TE 2.4): the router's unfused top-k / softmax / scatters 12 kernels and its aux loss 7
    (backward 13, the gating's gradients 3 + 3), fused (--moe-router-fusion) 1 and 4 (backward 7); DeepEP's
    indices-to-multihot 18 kernels and three host syncs after the received-count wait (backward 11 and one),
    fused (--enable-experimental with --moe-permute-fusion) one kernel and none; Transformer Engine's grouped
    GEMM one cuBLAS launch per local expert at the profile's library_kernel_s (4 experts per rank here)."""
    from simulator.frameworks import get_framework

    fw = get_framework("megatron-core-2024")

    def layer(**moe):
        s = scenario(framework="megatron-core-2024", expert_parallel=2, moe={"dispatcher": "deepep", **moe})
        return build_workload(s, fw, 8).layers[0]

    def launches(ops, name):
        return op(ops, name).launches

    plain, fused = layer(), layer(router_fusion=True, fused_multihot=True)
    for blk, route, aux, route_bwd, multihot, multihot_bwd in (
        (plain, 12, 7, 13, 18, 11),
        (fused, 1, 4, 7, 1, 1),
    ):
        assert launches(blk.forward, "router") == 3
        assert launches(blk.forward, "router top-k, softmax and scatter") == route
        assert launches(blk.forward, "aux-loss scores (second softmax, top-k)") == aux
        assert launches(blk.backward, "router top-k, softmax and scatter backward") == route_bwd
        assert launches(blk.backward, "router dgrad") == launches(blk.backward, "router wgrad") == 3
        assert launches(blk.forward, "indices to multihot") == multihot
        assert launches(blk.backward, "indices to multihot backward") == multihot_bwd
    syncs = [
        sum(o.kind == "sync" for o in ops)
        for ops in (plain.forward, plain.backward, fused.forward, fused.backward)
    ]
    assert syncs == [4, 1, 1, 0]
    local = 8 // 2  # SMALL_MOE's 8 experts over EP 2
    cublas = [o for o in plain.forward if o.kind == "host"]
    assert [o.host_s for o in cublas] == pytest.approx([local * fw.host.library_kernel_s] * 2)
    back = [o.host_s for o in plain.backward if o.kind == "host"]
    assert back == pytest.approx([2 * local * fw.host.library_kernel_s] * 2)
    # without Transformer Engine's modules (the ideal profile) or with one local expert, no per-expert launches
    ideal = build_workload(scenario(expert_parallel=2, moe={"dispatcher": "deepep"})).layers[0]
    assert not [o for o in ideal.forward if o.kind == "host"]


def test_library_launch_cost_is_the_measured_median():
    """megatron-core-2024's library_kernel_s is the median host time of Transformer Engine's per-expert cuBLASLt
    call sequence measured on an H100 host (benchmarks/gemm_launch.py, docs/measurements/h100-gemm-launch.json:
    four expert shapes, two runs), and every sample lies within 30% of it."""
    import json
    import statistics

    from simulator.frameworks import get_framework

    stored = Path(__file__).resolve().parents[1] / "docs" / "measurements" / "h100-gemm-launch.json"
    if not stored.exists():
        pytest.skip("docs/ not in this checkout")
    runs = json.loads(stored.read_text())["runs"]
    te_us = [r["te_us"] for run in runs for r in run if "te_us" in r]
    assert len(te_us) == 8
    fw = get_framework("megatron-core-2024")
    assert fw.host.library_kernel_s * 1e6 == pytest.approx(statistics.median(te_us), abs=0.05)
    assert all(abs(t / statistics.median(te_us) - 1) < 0.3 for t in te_us)


@pytest.mark.parametrize(
    "placement",
    [
        Placement(tp=2, cp=2, dp=16, ep=8, etp=1),
        Placement(tp=2, dp=4, pp=2, ep=4, etp=2),
        Placement(tp=8, dp=16, pp=4, dp_shard=4),
        Placement(tp=4, cp=2, dp=8, pp=2, order="tp-dp-cp-pp"),
    ],
)
def test_group_sizes_from_the_axes_are_the_built_groups_sizes(placement):
    """group_size reads a group's size off the axes (building every group is O(GPUs): 0.07 s of a 131,072-GPU
    run): the size of the first built group for every kind, combined, sub-divided and expert."""
    kinds = [
        "tp",
        "cp",
        "pp",
        "dp",
        "dp_shard",
        "dp_replicate",
        "dp+cp",
        "tp+cp",
        "embedding",
        "dp/2",
        "dp%2",
    ]
    kinds += ["ep", "etp", "edp", "ep+etp", "etp+ep+edp"]
    for kind in kinds:
        assert placement.group_size(kind) == len(placement.groups(kind)[0]), kind
    with pytest.raises(ValueError, match="unknown group kind"):
        placement.group_size("xp")


def _moe(**fields):
    return {**SMALL_MOE, "moe": {**SMALL_MOE["moe"], **fields}}


@pytest.mark.parametrize(
    ("model", "par", "text"),
    [
        # issue 63: each a ZeroDivisionError or a silent floor before
        (_moe(ffn_hidden_size=2), {"expert_tensor_parallel": 4, "tensor_parallel": 4, "sequence_parallel": True},
         "model.moe.ffn_hidden_size (2, one routed expert's MLP) is not divisible by expert_tensor_parallel (4)"),
        (_moe(ffn_hidden_size=1030), {"expert_tensor_parallel": 4, "tensor_parallel": 4, "sequence_parallel": True},
         "is not divisible by expert_tensor_parallel (4)"),
        (_moe(shared_expert_ffn_hidden_size=1030), {"tensor_parallel": 4, "sequence_parallel": True},
         "model.moe.shared_expert_ffn_hidden_size (1030) is not divisible by tensor_parallel (4)"),
        (_moe(layer_freq=3), {}, "model.moe makes no layer a mixture of experts"),
        (_moe(num_experts=8, top_k=4, num_groups=4, group_topk=1),
         {}, "group_topk x num_experts / num_groups = 1 x 8 / 4 = 2 experts to a token, fewer than top_k (4)"),
        (_moe(num_experts=8, top_k=2, load={"imbalance": 5}), {}, "exceeds num_experts / top_k = 8 / 2 = 4"),
    ],
)  # fmt: skip
def test_expert_shapes_and_routing_megatron_refuses_are_refused_naming_the_field(model, par, text):
    with pytest.raises(ScenarioError) as e:
        scenario(model, **par)
    assert text in str(e.value) and "\n" not in str(e.value)


def test_deepep_is_refused_on_a_gpu_it_does_not_run_on():
    with pytest.raises(
        ScenarioError, match="dispatcher deepep: DeepEP's kernels run on NVIDIA SM80 and SM90"
    ):
        load_scenario(
            {
                "model": SMALL_MOE,
                "cluster": {"topology": "dgx2-v100", "num_nodes": 1, "gpus_per_node": 8},
                "training": {"global_batch_size": 16, "micro_batch_size": 2, "precision": "fp16"},
                "parallelism": {"expert_parallel": 2, "moe": {"dispatcher": "deepep"}},
            }
        )


def test_no_expert_receives_more_than_every_token_once_under_any_skew():
    """Zipf skew 8 over 64 experts would give the first 98% of the copies; at top-4 it gets at most a quarter (each
    token once) and the rest is spread in proportion: the busiest rank computes at most tokens x experts per rank."""
    shares = expert_shares(ExpertLoadConfig(skew=8.0, seed=1), 64, top_k=4)
    assert sum(shares) == pytest.approx(1.0)
    assert max(shares) == pytest.approx(0.25)
    moe = MoeConfig(num_experts=64, top_k=4, load=ExpertLoadConfig(skew=8.0))
    load = expert_load(moe, tokens=1000, ep=8, etp=1)
    assert max(load.rows) <= 1000 * 8 * (1 + 1e-9)  # one expert: every token of the 8 source ranks once


def test_deepep_across_nodes_reports_its_expert_parallel_communication():
    """Issue 61: DeepEP's RDMA and NVLink legs run on sub-groups (ep%8, ep/8) the metric did not count: it read
    0.000 s while the all-to-all was exposed."""
    model = {**SMALL_MOE, "moe": {"num_experts": 16, "top_k": 2}}
    m = simulate(scenario(model, nodes=2, expert_parallel=16, moe={"dispatcher": "deepep"})).metrics
    legs = {k: v for k, v in m.comm_by_collective.items() if k.startswith("all_to_all:ep")}
    assert set(legs) == {"all_to_all:ep%8", "all_to_all:ep/8"}
    assert (
        m.moe["expert_comm_s"] == pytest.approx(sum(v["time_s"] for v in legs.values()))
        and m.moe["expert_comm_s"] > 0
    )
    assert m.moe["expert_comm_exposed_s"] == pytest.approx(sum(v["exposed_s"] for v in legs.values()))


def test_node_limited_routing_narrows_the_nodes_a_token_reaches():
    """Issue 61: DeepSeek-V3 (256 experts, top-8, 8 groups, group_topk 4) on 8 nodes: a token picks 4 groups (one
    per node) and about 8 / 4 = 2 experts in each, so it reaches 4 nodes, where uniform routing over all 256 gives
    8 (1 - C(224, 8) / C(256, 8)) = 5.29; DeepEP's RDMA bytes fall with it."""
    from simulator.workload.expert_load import destinations, distinct_groups

    dsv3 = MoeConfig(num_experts=256, top_k=8, num_groups=8, group_topk=4, score_function="sigmoid")
    assert distinct_groups(256, 8, 8) == pytest.approx(8 * (1 - math.comb(224, 8) / math.comb(256, 8)))
    assert distinct_groups(256, 8, 8) == pytest.approx(5.29, abs=0.01)
    assert destinations(dsv3, 8) == pytest.approx(4.0)
    # 16 nodes: each group spans 2 of them, 2 experts per chosen group over its 2 nodes
    assert destinations(dsv3, 16) == pytest.approx(4 * distinct_groups(32, 2, 2))
    # 4 nodes: 2 groups per node, 4 of 8 groups chosen uniformly over the nodes
    assert destinations(dsv3, 4) == pytest.approx(distinct_groups(8, 4, 4))
    plain = MoeConfig(num_experts=256, top_k=8)
    assert destinations(plain, 8) == distinct_groups(256, 8, 8)


def test_deepep_fp8_dispatch_sends_a_byte_and_a_block_scale_per_element_and_combines_in_bf16():
    """Issue 61: DeepSeek-V3's DeepEP dispatch in FP8 (1 byte an element plus a 4-byte scale per 128), its combine in
    BF16; backward, the combine's output gradients go toward the experts in FP8, the dispatch's gradients back in
    BF16. Needs the deepep dispatcher and precision fp8."""
    sixteen = {**SMALL_MOE, "moe": {"num_experts": 16, "top_k": 4}}

    def layer(fp8_dispatch: bool):
        moe = {"dispatcher": "deepep", "fp8_dispatch": fp8_dispatch}
        s = scenario(sixteen, nodes=2, expert_parallel=16, moe=moe, training={"precision": "fp8"})
        return build_workload(s, gpus_per_node=8).layers[0]

    plain, fp8 = layer(False), layer(True)
    ratio = (1 + 4 / 128) / 2
    for ops, name in (
        (plain.forward, "deepep rdma (dispatch)"),
        (plain.backward, "deepep rdma (combine gradients)"),
    ):
        ops8 = fp8.forward if ops is plain.forward else fp8.backward
        assert op(ops8, name).bytes == pytest.approx(op(ops, name).bytes * ratio)
    for ops, name in (
        (plain.forward, "deepep rdma (combine)"),
        (plain.backward, "deepep rdma (dispatch gradients)"),
    ):
        ops8 = fp8.forward if ops is plain.forward else fp8.backward
        assert op(ops8, name).bytes == op(ops, name).bytes
    with pytest.raises(ScenarioError, match="fp8_dispatch is DeepEP's FP8 dispatch"):
        scenario(
            sixteen, nodes=2, expert_parallel=16, moe={"fp8_dispatch": True}, training={"precision": "fp8"}
        )
