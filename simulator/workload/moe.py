"""A mixture-of-experts MLP as Megatron-Core runs it, for one micro-batch on one rank (core_v0.13.0,
megatron/core/transformer/moe/: router.py, token_dispatcher.py, experts.py, shared_experts.py; docs/moe.md).

The rank holds ``T`` tokens at the MoE input (``b s / (TP CP)``: sequence parallelism is required with TP).
Router: one GEMM ``[T, h] x [h, E]``, then top-k, softmax / sigmoid and scatters over ``[T, E]`` (and the aux
loss's second pass). ``alltoall`` dispatcher (``MoEAlltoAllTokenDispatcher``): an all-gather of the token counts
over ETP x EP, the host waits for them (``_maybe_dtoh_and_synchronize`` before the EP all-to-all), the tokens
are permuted into ``T k`` rows, all-to-all over EP (tokens and their probabilities), all-gathered over ETP,
sorted by local expert, run through the experts (fc1, the probability-weighted activation, fc2), and the
reverse: sorted back, reduce-scattered over ETP, all-to-all over EP, unpermuted (a k-way gather-sum).
``allgather`` dispatcher (``MoEAllGatherTokenDispatcher``): every token all-gathered over ETP x EP, the local
experts' rows picked, the outputs reduce-scattered back. The shared expert (``SharedExpertMLP``) is a dense MLP
on the attention's tensor-parallel group, run after the dispatch (or beside it with ``shared_expert_overlap``).
The busiest expert-parallel rank (``expert_load.py``) is the one simulated: its experts' rows, its all-to-all.

Host work (what the host thread issues: ``launches`` per op, costs/dispatch.py), read from Megatron-LM 1e057005
(2025-05-24) with Transformer Engine 2.4: the router's gating is two casts and an fp32 GEMM (router.py); its
top-k / softmax / scatters are 12 PyTorch kernels (moe_utils.py topk_softmax_with_capacity), the aux loss's scores,
loss and tracker 7 (switch_load_balancing_loss_func, router.py); backward 13 for those and 6 for the gating's
gradients and casts. With ``parallelism.moe.router_fusion`` (--moe-router-fusion, core_v0.14.0) the three become
Transformer Engine fused kernels, one each way. The grouped expert GEMMs launch one cuBLAS GEMM per local expert
from C++ (Transformer Engine GroupedLinear -> nvte_multi_stream_cublas_gemm, 4 side streams): the framework's
``library_kernel_s`` each, beside the module call.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.frameworks import Framework
from simulator.scenario.schema import FLEX_DISPATCHERS, Scenario
from simulator.workload import elementwise, fused_grouped_mlp
from simulator.workload.block import Part, present
from simulator.workload.dispatchers import (
    INDEX_BYTES,
    PROB_BYTES,
    allgather,
    alltoall,
    deepep,
    deepspeed_einsum,
    overlapping,
)
from simulator.workload.expert_load import ExpertLoad, capacity, expert_load
from simulator.workload.graph_modules import dispatch_modules, tagged
from simulator.workload.ops import (
    Op,
    collective_op,
    gemm,
    gemm_backward,
    host_op,
    linear,
    memory_op,
    routed_share,
    sync_op,
)
from simulator.workload.params import mlp_params, router_params
from simulator.workload.shape import LayerShape, activation


def moe_load(s: Scenario, sh: LayerShape) -> ExpertLoad:
    """The busiest rank's rows; DeepSpeed-MoE's einsum dispatch always fills every capacity slot (padded)."""
    p, moe = s.parallelism, s.model.moe
    if p.moe.dispatcher == "deepspeed":
        moe = moe.model_copy(update={"pad_to_capacity": True})
    return expert_load(moe, sh.rows, p.expert_parallel, p.etp)


def moe_part(s: Scenario, sh: LayerShape, fw: Framework, tp, gpus_per_node: int | None = None) -> Part:
    """The MoE MLP's ops (router, dispatch, experts, combine, shared expert) and its parameters per rank: dense
    (router, shared expert) and expert (this rank's routed experts)."""
    m, p = s.model, s.parallelism
    moe = m.moe
    gather_in, scatter_out, grad_in, grad_out, regather = tp
    e, h, t = sh.e, sh.h, sh.t
    ep, etp = p.expert_parallel, p.etp
    experts, k = moe.num_experts, moe.top_k
    local = experts // ep
    T = sh.rows  # tokens at the MoE input on this rank (the sequence-parallel shard)
    load = moe_load(s, sh)
    f = m.expert_ffn_size
    gated = m.gated
    f_up = (2 if gated else 1) * f // etp
    f_rank = f // etp

    # -- router -------------------------------------------------------------------------------------------------
    # Megatron-Core's router and modules (DeepSpeed-MoE's einsum dispatcher has its own gate)
    megatron = p.moe.dispatcher != "deepspeed"
    fused = p.moe.router_fusion
    router = gemm("router", T, experts, h)
    if megatron:  # the input and the weight cast to fp32 (--moe-router-dtype fp32), then the GEMM
        router = replace(router, launches=3)
    route = memory_op(
        "router top-k, softmax and scatter",
        T * experts * (PROB_BYTES + PROB_BYTES + 2),
        "softmax",
        T,
        experts,
    )
    route_bwd = memory_op(
        "router top-k, softmax and scatter backward",
        T * experts * (2 * PROB_BYTES + e),
        "softmax",
        T,
        experts,
        "backward",
    )
    if megatron:  # kernels per call, unfused or TE-fused (see the module docstring)
        route = replace(route, launches=1 if fused else 12)
        route_bwd = replace(route_bwd, launches=7 if fused else 13)
    aux: list[Op | None] = []
    if moe.aux_loss != "none":
        model_group = (
            "tp+cp" if t > 1 and p.context_parallel > 1 else ("cp" if p.context_parallel > 1 else "tp")
        )
        size = t * p.context_parallel
        if moe.aux_loss == "seq_aux_loss" and size > 1:  # the scores of the whole sequence (router.py, 0.13)
            aux.append(
                collective_op(
                    "seq aux-loss scores all-gather",
                    "all_gather",
                    model_group,
                    T * experts * PROB_BYTES * size,
                )
            )
        scores = memory_op(
            "aux-loss scores (second softmax, top-k)",
            T * experts * (3 * PROB_BYTES + 1),
            "softmax",
            T,
            experts,
        )
        aux.append(replace(scores, launches=4 if fused else 7) if megatron else scores)
        if size > 1:
            aux.append(
                collective_op(
                    "aux-loss token counts all-reduce", "all_reduce", model_group, experts * INDEX_BYTES
                )
            )

    # -- dispatch ----------------------------------------------------------------------------------------------
    sent = (
        T * k * (1.0 - load.dropped)
    )  # rows this rank sends (the busiest rank receives ``received`` x T k ETP)
    rows = load.total_rows  # rows the busiest rank's experts compute (after the ETP gather)
    recv = rows / etp  # rows it receives over the EP all-to-all
    a2a_rows = max(sent, recv)  # an all-to-all lasts as long as its busiest rank's send or receive
    if p.moe.dispatcher == "alltoall":
        dispatch, combine, dispatch_bwd, combine_bwd = alltoall(s, sh, fw, load, T, a2a_rows, rows)
    elif p.moe.dispatcher == "deepspeed":
        dispatch, combine, dispatch_bwd, combine_bwd = deepspeed_einsum(s, sh, T, capacity(moe, T))
    elif p.moe.dispatcher in FLEX_DISPATCHERS:
        dispatch, combine, dispatch_bwd, combine_bwd = deepep(s, sh, fw, load, T, rows, gpus_per_node)
    else:
        dispatch, combine, dispatch_bwd, combine_bwd = allgather(s, sh, fw, T, rows)

    # -- experts -----------------------------------------------------------------------------------------------
    fwd_experts: list[Op] = []
    bwd_experts: list[Op] = []
    acts: list[Op] = []
    groups = (
        []  # Transformer Engine's fused grouped MLP instead (below)
        if p.moe.fused_grouped_mlp
        else [(sum(load.rows), sum(load.real_rows))]
        if p.moe.grouped_gemm
        else list(zip(load.rows, load.real_rows, strict=True))
    )
    # A grouped GEMM (Megatron-Core GroupedMLP / TEGroupedMLP, torch._grouped_mm) is one kernel over every local
    # expert's rows, but each expert is its own problem: its rows fill output tiles of their own, so few rows per
    # expert leave tiles part-empty and short wgrad reductions (K = its rows). Costed as ``local`` problems of
    # the mean rows each (kernel grouped_gemm), not as one GEMM of all rows: measured on an H200 with
    # torch._grouped_mm, 128 rows per expert take 1.8-2.3x one GEMM of the same FLOPs, 512 rows 1.1-1.4x,
    # 2,048 and more 1.02-1.1x (benchmarks/moe_grouped_gemm.py, docs/moe.md).
    local_experts = len(load.rows)
    te_experts = megatron and fw.modules == "megatron"  # Megatron-Core's TEGroupedMLP / SequentialMLP
    if p.moe.fused_grouped_mlp:  # resolve.py checks where it runs
        fwd_experts, bwd = fused_grouped_mlp.experts(
            "experts",
            sum(load.rows),
            sum(load.real_rows),
            local_experts,
            f_up,
            f_rank,
            h,
            s.training.fp8.recipe,
            m.add_bias_linear,
            p.moe.dispatcher == "alltoall",
            fw.host.sync_s,
        )
        fwd_experts, bwd_experts = list(fwd_experts), list(bwd)
    for i, (n, real) in enumerate(groups):
        n_int = max(round(n), 1)
        name = "experts" if p.moe.grouped_gemm else f"expert {i}"
        share = real / n if n else 0.0
        if p.moe.grouped_gemm and local_experts > 1:
            per = max(round(n / local_experts), 1)
            fc1 = gemm(f"{name} fc1", per, f_up, h, local_experts, linear=True, grouped=True)
            fc2 = gemm(f"{name} fc2", per, h, f_rank, local_experts, linear=True, grouped=True)
            fc1, fc2 = routed_share(fc1, share), routed_share(fc2, share)
        else:
            fc1 = routed_share(linear(f"{name} fc1", n_int, f_up, h), share)
            fc2 = routed_share(linear(f"{name} fc2", n_int, h, f_rank), share)
        act, act_bwd = activation(
            m, f"{name} {m.activation} (probability-weighted)", e, n_int, f_rank, n * PROB_BYTES
        )
        # Megatron-Core's TEGroupedMLP around the fused activation (elementwise.py): the eager clamp, the GLU
        # offset copied to the GPU on every call (quick-geglu), the fc2 bias added per expert
        clamp = elementwise.glu_clamp(e, n_int, f_rank) if te_experts and m.activation_clamp else (None, None)
        offset = (
            sync_op(OFFSET_SYNC, fw.host.sync_s) if te_experts and m.activation == "quick-geglu" else None
        )
        grouped_bias = te_experts and p.moe.grouped_gemm and m.add_bias_linear
        bias = elementwise.expert_bias(e, n_int, h, local_experts) if grouped_bias else None
        bias_fwd, bias_bwd = bias or (None, None)
        # Transformer Engine's grouped GEMM: one cuBLAS GEMM per local expert, launched from C++
        per_expert = (
            local_experts * fw.host.library_kernel_s
            if p.moe.grouped_gemm and local_experts > 1 and te_experts
            else 0.0
        )

        fwd_experts += present(
            _cublas_loop(f"{name} fc1", per_expert),
            fc1,
            clamp[0],
            offset,
            act,
            _cublas_loop(f"{name} fc2", per_expert),
            fc2,
            bias_fwd,
        )
        acts += present(clamp[0], offset, act)  # what moe_act recompute re-runs (bias_act_func)
        bwd_experts = [
            *present(bias_bwd, _cublas_loop(f"{name} fc2 dgrad and wgrad", 2 * per_expert, "backward")),
            *gemm_backward(fc2),
            act_bwd,
            *present(clamp[1]),
            *present(_cublas_loop(f"{name} fc1 dgrad and wgrad", 2 * per_expert, "backward")),
            *gemm_backward(fc1),
            *bwd_experts,
        ]

    # -- shared expert -----------------------------------------------------------------------------------------
    shared_fwd: tuple[Op, ...] = ()
    shared_bwd: tuple[Op, ...] = ()
    shared_params = 0
    if moe.shared_expert_ffn_hidden_size:
        fs = moe.shared_expert_ffn_hidden_size
        fs_up = (2 if gated else 1) * fs // t
        tokens = sh.tokens  # the sequence-parallel shard gathered over TP, as a dense MLP's input
        up = linear("shared expert fc1", tokens, fs_up, h)
        down = linear("shared expert fc2", tokens, h, fs // t)
        act, act_bwd = activation(m, f"shared expert {m.activation}", e, tokens, fs // t)
        gate = gemm("shared expert gate", tokens, 1, h) if moe.shared_expert_gate else None
        shared_fwd = present(
            gather_in("shared expert input"), up, act, down, gate, scatter_out("shared expert output")
        )
        shared_bwd = present(
            grad_out("shared expert output gradient"),
            *gemm_backward(down),
            act_bwd,
            regather("shared expert input"),
            *gemm_backward(up),
            *(gemm_backward(gate) if gate else ()),
            grad_in("shared expert input gradient"),
        )
        shared_params = mlp_params(m, fs) // t + (h if moe.shared_expert_gate else 0)

    if p.moe.shared_expert_overlap and shared_fwd and p.moe.dispatcher != "allgather":
        # the shared expert runs on its own stream beside the dispatch: the all-to-alls hide behind its GEMMs
        dispatch = tuple(overlapping(op, "next") for op in dispatch)
        combine_bwd = tuple(overlapping(op, "next") for op in combine_bwd)
    # each kernel's module, as Megatron-Core's CUDA graph scopes name them (workload/graph_modules.py)
    # (the shared expert in the router's module where it is not overlapped with the dispatch: --cuda-graph-modules)
    shared_module = "moe" if p.moe.shared_expert_overlap else "moe_router"
    shared_fwd, shared_bwd = tagged(shared_fwd, shared_module), tagged(shared_bwd, shared_module)
    routing = tagged(present(router, route, *aux), "moe_router")
    forward = (*routing, *dispatch_modules(present(*dispatch)))
    forward += tagged(present(*shared_fwd, *fwd_experts, *combine), "moe")
    router_bwd = gemm_backward(router)
    if megatron:  # each gradient GEMM with its cast back to bf16; the weight's also its main_grad add
        router_bwd = (replace(router_bwd[0], launches=3), replace(router_bwd[1], launches=3))
    backward = tagged(present(*combine_bwd, *bwd_experts, *shared_bwd, *dispatch_bwd), "moe")
    backward += tagged(present(route_bwd, *router_bwd), "moe_router")
    expert_params = local * mlp_params(m, f) // etp
    return Part(
        forward,
        backward,
        router_params(m) + shared_params,
        expert_params,
        tagged(tuple(acts), "moe"),
        shared_fwd,
    )


# fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl (Megatron-LM d7288711): torch.tensor(linear_offset,
# device=...) on every call, a pageable host-to-device copy that PyTorch follows with cudaStreamSynchronize
OFFSET_SYNC = "host sync: the GLU's linear offset copied to the GPU (torch.tensor)"


def _cublas_loop(what: str, seconds: float, direction: str = "forward") -> Op | None:
    """The host seconds of Transformer Engine's grouped GEMM launching one cuBLAS GEMM per local expert from C++
    (none where it does not)."""
    return host_op(f"{what}: a cuBLAS GEMM per local expert", seconds, direction) if seconds else None
