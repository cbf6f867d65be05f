"""Megatron-Core's token dispatchers (megatron/core/transformer/moe/token_dispatcher.py, core_v0.13.0): how the
tokens of one rank reach the experts that take them and come back, as the collectives, host syncs and
memory-bound permutations each runs. ``alltoall`` (``MoEAlltoAllTokenDispatcher``), ``allgather``
(``MoEAllGatherTokenDispatcher``) and ``deepep`` (``MoEFlexTokenDispatcher`` on deepseek-ai/DeepEP). Each returns
(dispatch forward, combine forward, dispatch backward, combine backward) ops; ``moe.py`` puts the experts between."""

from __future__ import annotations

from dataclasses import replace

from simulator.frameworks import Framework
from simulator.scenario.schema import Scenario
from simulator.workload.block import present
from simulator.workload.expert_load import ExpertLoad, destinations, distinct_groups
from simulator.workload.ops import Op, collective_op, gemm, memory_op, sync_op
from simulator.workload.shape import LayerShape

PROB_BYTES = 4  # routing probabilities in fp32 (--moe-router-dtype fp32, as the published MoE recipes set it)
INDEX_BYTES = 8  # token counts per expert: int64


def alltoall(
    s: Scenario, sh: LayerShape, fw: Framework, load: ExpertLoad, T: float, a2a_rows: float, rows: float
):
    """(dispatch, combine) forward ops and their backward ops of ``MoEAlltoAllTokenDispatcher``."""
    p, moe = s.parallelism, s.model.moe
    e, h, k = sh.e, sh.h, moe.top_k
    ep, etp = p.expert_parallel, p.etp
    local = moe.num_experts // ep
    tokens_bytes, probs_bytes = a2a_rows * h * e, a2a_rows * PROB_BYTES
    dispatch: list[Op | None] = []
    if ep * etp > 1:
        group = "etp+ep" if etp > 1 else "ep"
        dispatch.append(
            collective_op(
                "token counts all-gather", "all_gather", group, moe.num_experts * INDEX_BYTES * ep * etp
            )
        )
    permute = memory_op(
        "permute tokens", e * T * h + e * T * k * h + T * k * PROB_BYTES, "elementwise", round(T * k), h
    )
    unpermute = memory_op(
        "unpermute tokens (k-way sum)", e * T * k * h + e * T * h, "elementwise", round(T * k), h
    )
    dispatch.append(permute)
    padded = moe.pad_to_capacity and moe.capacity_factor is not None
    if ep * etp > 1 and not padded:  # the host sizes the all-to-all from the counts (token_dispatcher.py)
        dispatch.append(sync_op("host waits for the token counts", fw.host.sync_s))
    a2a = ep > 1
    dispatch += [
        collective_op("ep all-to-all (dispatch tokens)", "all_to_all", "ep", tokens_bytes) if a2a else None,
        collective_op("ep all-to-all (dispatch probabilities)", "all_to_all", "ep", probs_bytes)
        if a2a
        else None,
    ]
    gathered = rows * h * e
    if etp > 1:
        dispatch += [
            collective_op("etp all-gather (tokens)", "all_gather", "etp", gathered),
            collective_op("etp all-gather (probabilities)", "all_gather", "etp", rows * PROB_BYTES),
        ]
    sort = (
        memory_op("sort tokens by local expert", 2 * gathered, "elementwise", round(rows), h)
        if local > 1
        else None
    )
    dispatch.append(sort)
    combine = present(
        memory_op("unsort tokens", 2 * gathered, "elementwise", round(rows), h) if local > 1 else None,
        collective_op("etp reduce-scatter (tokens)", "reduce_scatter", "etp", rows * h * PROB_BYTES)
        if etp > 1
        else None,
        collective_op("ep all-to-all (combine tokens)", "all_to_all", "ep", tokens_bytes) if a2a else None,
        unpermute,
    )
    combine_bwd = present(
        memory_op(
            "unpermute backward", e * T * h + e * T * k * h, "elementwise", round(T * k), h, "backward"
        ),
        collective_op("ep all-to-all (combine gradients)", "all_to_all", "ep", tokens_bytes) if a2a else None,
        collective_op("etp all-gather (gradients)", "all_gather", "etp", rows * h * PROB_BYTES)
        if etp > 1
        else None,
        memory_op("unsort backward", 2 * gathered, "elementwise", round(rows), h, "backward")
        if local > 1
        else None,
    )
    dispatch_bwd = present(
        memory_op("sort backward", 2 * gathered, "elementwise", round(rows), h, "backward")
        if local > 1
        else None,
        collective_op("etp reduce-scatter (gradients)", "reduce_scatter", "etp", gathered)
        if etp > 1
        else None,
        collective_op(
            "etp reduce-scatter (probability gradients)", "reduce_scatter", "etp", rows * PROB_BYTES
        )
        if etp > 1
        else None,
        collective_op("ep all-to-all (dispatch gradients)", "all_to_all", "ep", tokens_bytes)
        if a2a
        else None,
        collective_op("ep all-to-all (probability gradients)", "all_to_all", "ep", probs_bytes)
        if a2a
        else None,
        memory_op("permute backward", e * T * k * h + e * T * h, "elementwise", round(T * k), h, "backward"),
    )
    return present(*dispatch), combine, dispatch_bwd, combine_bwd


def allgather(s: Scenario, sh: LayerShape, fw: Framework, T: float, rows: float):
    """(dispatch, combine) forward ops and their backward ops of ``MoEAllGatherTokenDispatcher``: every token of
    the ETP x EP group gathered, this rank's experts' rows picked, the outputs reduce-scattered back."""
    p, moe = s.parallelism, s.model.moe
    e, h, experts = sh.e, sh.h, moe.num_experts
    size = p.expert_parallel * p.etp
    M = T * size  # rows of the whole group
    group = "etp+ep" if p.etp > 1 and p.expert_parallel > 1 else ("ep" if p.expert_parallel > 1 else "etp")
    gather = size > 1
    dispatch = present(
        collective_op("all-gather routing map", "all_gather", group, M * experts) if gather else None,
        collective_op("all-gather probabilities", "all_gather", group, M * experts * PROB_BYTES)
        if gather
        else None,
        collective_op("all-gather tokens", "all_gather", group, M * h * e) if gather else None,
        sync_op("host waits for the token counts (.cpu())", fw.host.sync_s) if gather else None,
        memory_op("permute local experts' tokens", e * M * h + e * rows * h, "elementwise", round(rows), h),
    )
    combine = present(
        memory_op("unpermute to every token", e * rows * h + e * M * h, "elementwise", round(M), h),
        collective_op("reduce-scatter outputs", "reduce_scatter", group, M * h * PROB_BYTES)
        if gather
        else None,
    )
    combine_bwd = present(
        collective_op("all-gather output gradients", "all_gather", group, M * h * PROB_BYTES)
        if gather
        else None,
        memory_op("unpermute backward", e * rows * h + e * M * h, "elementwise", round(M), h, "backward"),
    )
    dispatch_bwd = present(
        memory_op("permute backward", e * M * h + e * rows * h, "elementwise", round(rows), h, "backward"),
        collective_op("reduce-scatter token gradients", "reduce_scatter", group, M * h * e)
        if gather
        else None,
        collective_op(
            "reduce-scatter probability gradients", "reduce_scatter", group, M * experts * PROB_BYTES
        )
        if gather
        else None,
    )
    return dispatch, combine, dispatch_bwd, combine_bwd


# DeepEP's FP8 dispatch: one fp32 scale per 128 elements (deepseek-ai/DeepEP, per-token 1x128 block scaling)
FP8_BLOCK = 128
FP8_SCALE_BYTES = 4


def deepep(
    s: Scenario, sh: LayerShape, fw: Framework, load: ExpertLoad, T: float, rows: float, gpus_per_node
):
    """(dispatch, combine) forward ops and their backward ops of Megatron-Core's flex dispatcher on DeepEP
    (``MoEFlexTokenDispatcher``, core_v0.13.0; deepseek-ai/DeepEP): one group over ETP x EP; a token goes once to
    each rank that holds one of its experts (``is_token_in_rank``), and across nodes once to each node over RDMA
    (to the GPU of the same local index), which forwards it over NVLink in the same kernel; the host waits for
    the received counts; the tokens are then permuted into expert order. Combine is the reverse.

    HybridEP (``dispatcher: hybridep``, Megatron-LM d98e8a64 token_dispatcher.py ``_HybridEPManager``,
    fused_a2a.py ``HybridEPDispatch``): the same traffic, but it takes the routing map as it is (no indices to
    multihot) and waits on the host for the received counts only where they are not known beforehand (dropless:
    ``num_permuted_tokens`` None, "will cause a CPU sync"; drop-and-pad computes them on the CPU)."""
    p, moe = s.parallelism, s.model.moe
    e, h = sh.e, sh.h
    size = p.expert_parallel * p.etp
    experts_seen = moe.num_experts * p.etp  # every token goes to all ETP ranks of an expert (expanded map)
    k = moe.top_k * p.etp
    group = "etp+ep" if p.etp > 1 else "ep"
    per_node = min(gpus_per_node or size, size)
    nodes = max(size // per_node, 1)
    # destination ranks per token (node-limited routing narrows them: expert_load.destinations)
    ranks = (
        destinations(moe, size) if p.etp == 1 else distinct_groups(experts_seen, k, size)
    ) * load.received
    ops_f: list[Op] = []
    ops_b: list[Op] = []
    if size > 1 and nodes > 1:
        by_node = (
            destinations(moe, nodes) if p.etp == 1 else distinct_groups(experts_seen, k, nodes)
        ) * load.received
        across = collective_op(
            "deepep rdma (dispatch)", "all_to_all", f"{group}%{per_node}", T * h * e * by_node
        )
        inside = replace(
            collective_op(
                "deepep nvlink forward (dispatch)", "all_to_all", f"{group}/{per_node}", T * h * e * ranks
            ),
            overlaps="alongside",
        )
        ops_f, ops_b = (
            [across, inside],
            [replace(across, direction="backward"), replace(inside, direction="backward")],
        )
    elif size > 1:
        a2a = collective_op("deepep nvlink (dispatch)", "all_to_all", group, T * h * e * ranks)
        ops_f, ops_b = [a2a], [replace(a2a, direction="backward")]
    gathered = rows * h * e
    # the routing map of the received tokens (token_dispatcher.py _DeepepManager._indices_to_multihot, Megatron-LM
    # 1e057005 through main of 2025-12): boolean-mask indexing, about 18 kernels and three host syncs
    # (indices[mask], repeat_interleave without output_size, probs[mask]); backward the index_put's about 11
    # kernels and a sync on the mask (nonzero). With --enable-experimental and --moe-permute-fusion one Triton
    # kernel each way (fusions/fused_indices_converter.py), no sync.
    fused = p.moe.fused_multihot
    hybrid = p.moe.dispatcher == "hybridep"
    multihot_bytes = rows * (INDEX_BYTES + PROB_BYTES + 1)
    multihot_f: tuple[Op, ...] = ()
    multihot_b: tuple[Op, ...] = ()
    if size > 1 and not hybrid:
        wait = sync_op("host waits on a boolean mask (indices to multihot)", fw.host.sync_s)
        multihot_f = (
            replace(memory_op("indices to multihot", multihot_bytes), launches=1 if fused else 18),
            *([] if fused else [wait] * 3),
        )
        multihot_b = (
            replace(
                memory_op("indices to multihot backward", multihot_bytes, direction="backward"),
                launches=1 if fused else 11,
            ),
            *([] if fused else [wait]),
        )
    # DeepEP's FP8 dispatch (DeepSeek-V3's training): what moves toward the experts (tokens forward, the
    # combine's output gradients backward) in FP8 with a 4-byte scale per 128 elements; combines in BF16
    scale = (1 + FP8_SCALE_BYTES / FP8_BLOCK) / e if p.moe.fp8_dispatch else 1.0
    toward_f = [replace(o, bytes=o.bytes * scale) for o in ops_f]
    toward_b = [replace(o, bytes=o.bytes * scale) for o in ops_b]
    dispatch = present(
        *toward_f,
        sync_op("host waits for the received token counts", fw.host.sync_s)
        if size > 1 and not (hybrid and moe.pad_to_capacity)
        else None,
        *multihot_f,
        memory_op("permute received tokens", e * T * ranks * h + gathered, "elementwise", round(rows), h),
    )
    combine = present(
        memory_op(
            "unpermute to received tokens", gathered + e * T * ranks * h, "elementwise", round(rows), h
        ),
        *(replace(o, name=o.name.replace("dispatch", "combine")) for o in ops_f),
        memory_op("combine weighted sum", e * T * ranks * h + e * T * h, "elementwise", round(T), h),
    )
    combine_bwd = present(
        memory_op("combine backward", e * T * ranks * h + e * T * h, "elementwise", round(T), h, "backward"),
        *(replace(o, name=o.name.replace("dispatch", "combine gradients")) for o in toward_b),
        memory_op(
            "unpermute backward", gathered + e * T * ranks * h, "elementwise", round(rows), h, "backward"
        ),
    )
    dispatch_bwd = present(
        memory_op(
            "permute backward", gathered + e * T * ranks * h, "elementwise", round(rows), h, "backward"
        ),
        *multihot_b,
        *(replace(o, name=o.name.replace("dispatch", "dispatch gradients")) for o in ops_b),
    )
    return dispatch, combine, dispatch_bwd, combine_bwd


def deepspeed_einsum(s: Scenario, sh: LayerShape, T: float, cap: int):
    """(dispatch, combine) forward ops and their backward ops of DeepSpeed-MoE's ``MOELayer`` (deepspeed/moe/
    sharded_moe.py, v0.16): the gate builds dense ``[S, E, C]`` tensors, the dispatch mask and the fp32 combine
    weights (top1gating / top2gating: one-hot masks, cumsum locations, capacity ``C``); ``einsum("sec,sm->ecm")``
    packs every expert's ``C`` slots (a GEMM of ``E C`` x ``M`` over the ``S`` tokens, zeros where a slot is
    empty); an all-to-all of the whole ``[E, C, M]`` over EP; after the experts the same all-to-all back and
    ``einsum("sec,ecm->sm")`` (a GEMM of ``S`` x ``M`` over ``E C``). Backward: the combine einsum's two gradients
    (the expert output's and the gate's), the all-to-alls, the dispatch einsum's input gradient."""
    moe = s.model.moe
    e, h = sh.e, sh.h
    E = moe.num_experts
    slots = E * cap  # E x C rows of the dispatched tensor
    rows = round(T)
    masks = memory_op(
        "gate masks (one-hot, locations, [S, E, C] dispatch mask and combine weights)",
        T * slots * (1 + PROB_BYTES) + T * E * (2 * PROB_BYTES + INDEX_BYTES),
        "",
    )

    def einsum(name: str, m: int, n: int, k: int, direction: str = "forward") -> Op:
        # padding arithmetic, not the model's: no model FLOPs
        return replace(gemm(name, m, n, k, direction=direction), model_flops=0.0)

    a2a = slots * h * e
    dispatch = (
        masks,
        einsum("dispatch einsum sec,sm->ecm", slots, h, rows),
        collective_op("ep all-to-all (dispatch [E, C, M])", "all_to_all", "ep", a2a),
    )
    combine = (
        collective_op("ep all-to-all (combine [E, C, M])", "all_to_all", "ep", a2a),
        einsum("combine einsum sec,ecm->sm", rows, h, slots),
    )
    combine_bwd = (
        einsum("combine einsum backward (expert output)", slots, h, rows, "backward"),
        einsum("combine einsum backward (combine weights)", rows, slots, h, "backward"),
        replace(
            collective_op("ep all-to-all (combine gradients)", "all_to_all", "ep", a2a), direction="backward"
        ),
    )
    dispatch_bwd = (
        replace(
            collective_op("ep all-to-all (dispatch gradients)", "all_to_all", "ep", a2a), direction="backward"
        ),
        einsum("dispatch einsum backward (input)", rows, h, slots, "backward"),
        memory_op("gate backward ([S, E] probabilities)", T * E * 2 * PROB_BYTES, "", direction="backward"),
    )
    return dispatch, combine, dispatch_bwd, combine_bwd


def overlapping(op: Op, side: str) -> Op:
    return replace(op, overlaps=side) if op.kind == "collective" else op
