"""DeepSpeed ZeRO stages 1, 2 and 3 (Rajbhandari et al. SC20), with DeepSpeed's knobs and defaults.

* Stage 1 partitions optimizer states: gradients are reduced in ``reduce_bucket_size`` buckets at the
  gradient-accumulation boundary as the DeepSpeed release does it (``gradient_reduction``: from v0.12.4 one
  all-reduce per bucket, before one reduce per owning rank), each rank steps its 1/N, and updated weights are
  all-gathered in ``allgather_bucket_size`` buckets.
* Stage 2 also partitions gradients, so every microbatch reduces its gradients (DeepSpeed's
  ``stage_1_and_2.py`` reduces in the backward hooks).
* Stage 3 partitions weights too: DeepSpeed's coordinator is replayed module by module
  (``zero3_fetch.py``: fetches, prefetches, releases by reuse distance, gradient buckets), and
  ``sharded.py`` turns its calls into tasks. With every parameter released after use, 3 Psi = 1.5 x DDP.
``overlap_comm`` (default off for stages 1-2, on for 3) decides whether backward waits for each reduction.
docs/deepspeed.md describes what is replayed and which DeepSpeed JSON keys change it.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.hardware.cluster import Cluster
from simulator.program import Program, RankClass
from simulator.scenario.schema import Scenario
from simulator.strategy import zeropp
from simulator.strategy.groups import (
    EXPERT_GROUP,
    expert_grad_group_size,
    grad_group,
    grad_group_size,
    rank_label,
    ranks_per_stage,
)
from simulator.strategy.memory import memory_breakdown
from simulator.strategy.offload import (
    add_grad_copy,
    add_host_step,
    add_param_copy,
    offloaded_memory,
    optimizer_device,
    param_device,
)
from simulator.strategy.reduction import buckets, gradient_reduction, gradient_sets, megatron_bucket_elements
from simulator.strategy.sharded import ShardingPlan, add_sharded_iteration
from simulator.strategy.state_bytes import gather_bytes, grad_bytes, weight_bytes
from simulator.strategy.steps import (
    add_backward,
    add_combined,
    add_forward,
    add_optimizer,
    microbatch_order,
    microbatch_sync,
    with_setup,
)
from simulator.strategy.units import Unit, parameter_tensors, units
from simulator.strategy.zero3_fetch import schedule_for
from simulator.strategy.zero3_replay import add_fetched_iteration
from simulator.workload.transformer import Workload


def build(s: Scenario, w: Workload, cluster: Cluster) -> Program:
    stage = s.parallelism.zero_stage
    p = Program(f"zero-{stage}")
    us = units(w)
    cfg = s.parallelism.zero
    dp = grad_group_size(s)
    overlap = overlap_comm(cfg, stage)
    wb, gb = weight_bytes(s), grad_bytes(s, w.framework)
    persistent_params = 0
    if stage == 3:
        fetch = fetch_schedule(s, w)
        zpp = zeropp.plan_fields(s, dp, cluster)
        plan = ShardingPlan(
            gather_group=grad_group(s),
            replicate_group=None,
            shard_size=dp,
            prefetch_depth=1,
            kept_after_forward=frozenset(),
            reduce_every_microbatch=True,
            overlap_reduce=overlap,
            weight_bytes=wb,
            grad_bytes=gb,
            offload_optimizer=optimizer_device(s),
            offload_param=param_device(s),
            fetch=fetch,
            **zpp,
        )
        (add_fetched_iteration if plan.fetch is not None else add_sharded_iteration)(p, s, w, us, plan)
        buffers = zero_buffers(cfg, stage, gb, wb, fetch.peak_live)  # with the coordinator's peak gathered
        persistent_params = fetch.persistent
        if cfg.zero_hpz_partition_size > 1:
            # hpZ's secondary copy: the weights sharded over the hpZ group only
            buffers += w.params_per_rank * wb / cfg.zero_hpz_partition_size
    else:
        _stage_1_2(p, s, w, us, overlap)
        buffers = zero_buffers(cfg, stage, gb, wb)
    # persistent parameters keep a full copy of their weights on every rank
    mem = memory_breakdown(s, w, cluster, dp, stage, buffers, persistent_params)
    mem = replace(mem, step=step_temporaries(s, w.params_per_rank, dp, stage))
    mem = offloaded_memory(s, mem, w.params_per_rank, dp, stage, cluster)
    p.ranks.append(RankClass(rank_label(s), ranks_per_stage(s), mem))
    return p


def overlap_comm(cfg, stage: int) -> bool:
    """DeepSpeed's ``overlap_comm``: the config's, else on at stage 3 only (v0.16.4 config defaults)."""
    return cfg.overlap_comm if cfg.overlap_comm is not None else stage == 3


def zero_buffers(cfg, stage: int, grad_bytes: int, weight_bytes: int, live_params: float = 0.0) -> float:
    """The buffers a ZeRO stage allocates. Stage 3 (v0.16.4 stage3.py): the flat ipg bucket of
    ``reduce_bucket_size`` elements (allocated at start with contiguous_gradients, whatever the model's size) and
    the ``live_params`` the coordinator holds gathered at its peak. Stages 1-2 (stage_1_and_2.py backward()): the
    ipg bucket, two with ``overlap_comm``; the updated weights are all-gathered in place into the flat 16-bit
    groups (no buffer of their own)."""
    if stage == 3:
        return ipg_buffer(cfg, grad_bytes) + live_params * weight_bytes
    return ipg_buffer(cfg, grad_bytes) * (2 if overlap_comm(cfg, stage) else 1)


def ipg_buffer(cfg, grad_bytes: int) -> float:
    """DeepSpeed's contiguous gradient bucket: ``reduce_bucket_size`` elements of the gradient type, whatever
    the model's size (stage_1_and_2.py ``backward``, stage3.py ``__ipg_bucket_flat_buffer``)."""
    return cfg.reduce_bucket_size * grad_bytes if cfg.contiguous_gradients else 0.0


def step_temporaries(s: Scenario, params: float, dp: int, stage: int) -> float:
    """The fp32 gradient of the rank's optimizer partition, made at the step (stage_1_and_2.py ``step``:
    ``get_flat_partition(..., dtype=fp32)``; stage3.py ``_prepare_fp32_grad_for_sub_group``, one
    ``sub_group_size`` at a time). On the host with ZeRO-Offload."""
    cfg = s.parallelism.zero
    if stage == 0 or cfg.offload_optimizer.device != "none":
        return 0.0
    part = params / dp
    return 4.0 * (min(part, cfg.sub_group_size) if stage == 3 else part)


def fetch_schedule(s: Scenario, w: Workload):
    """DeepSpeed's ZeRO-3 calls for one microbatch of this scenario (simulator/strategy/zero3_fetch.py)."""
    return schedule_for(*fetch_key(s, w))


def fetch_key(s: Scenario, w: Workload) -> tuple[tuple, tuple]:
    """The model's shape on one tensor-parallel rank and DeepSpeed's ZeRO-3 settings, as
    :func:`simulator.strategy.zero3_fetch.schedule_for` takes them (hashable: replays are cached on them)."""
    m, t, cfg = s.model, s.parallelism.tensor_parallel, s.parallelism.zero
    key = (
        ("layers", w.num_layers),
        ("hidden", m.hidden_size),
        ("heads", m.num_attention_heads // t),
        ("kv_heads", max(m.query_groups // t, 1)),
        ("head_dim", m.head_dim),
        ("ffn", m.ffn_size // t),
        ("vocab", m.vocab_size // t),
        ("seq", m.seq_length),
        ("swiglu", m.gated),
        ("bias", m.add_bias_linear),
        ("layernorm", m.normalization == "layernorm"),
        ("learned_positions", m.position_embedding == "learned"),
        ("tied", m.tied_embeddings),
        ("fused", w.framework.modules == "megatron"),
        ("recompute", s.training.activation_recompute == "full"),
    )
    knobs = (
        ("prefetch_bucket", cfg.stage3_prefetch_bucket_size),
        ("max_live", cfg.stage3_max_live_parameters),
        ("max_reuse", cfg.stage3_max_reuse_distance),
        ("persistence_threshold", cfg.stage3_param_persistence_threshold),
        ("model_persistence_threshold", cfg.stage3_model_persistence_threshold),
        ("reduce_bucket", cfg.reduce_bucket_size),
    )
    return key, knobs


def _stage_1_2(p: Program, s: Scenario, w: Workload, us: list[Unit], overlap: bool) -> None:
    """One iteration; with ZeRO-Offload's delayed parameter update three, measured in steady state."""
    if not s.parallelism.zero.offload_optimizer.delayed_param_update:
        _iteration_1_2(p, s, w, us, overlap)
        return
    # DPU: iteration k computes with the weights of iteration k-2's step, so the CPU step and the upload of
    # one iteration run under the next one's forward and backward (gathers on their own stream)
    ends: list[tuple[int, int]] = []
    for it in range(3):
        ready = ends[it - 2][1] if it >= 2 else None
        ends.append(_iteration_1_2(p, s, w, us, overlap, ready, "comm.dp.ag"))
    p.window = (ends[1][0], ends[2][0])


def _iteration_1_2(
    p: Program,
    s: Scenario,
    w: Workload,
    us: list[Unit],
    overlap: bool,
    ready: int | None = None,
    gather_stream: str = "comm.dp",
) -> tuple[int, int]:
    """Tasks of one iteration; returns (its last backward, the task after which updated weights are on every
    GPU). ``ready``: a task the first forward waits for."""
    stage, cfg, gas = s.parallelism.zero_stage, s.parallelism.zero, s.gradient_accumulation_steps
    dp = grad_group_size(s)
    gb, wb = grad_bytes(s, w.framework), weight_bytes(s)
    offload = optimizer_device(s) is not None
    reductions: list[int] = []
    reduce_elements, gather_elements = cfg.reduce_bucket_size, cfg.allgather_bucket_size
    if w.framework.zero == "megatron":
        reduce_elements = gather_elements = megatron_bucket_elements(s, w)
    # dense parameters over data parallelism; a mixture-of-experts model's routed experts over expert data
    # parallelism (DeepSpeed's expert param groups, Megatron-Core's expert distributed optimizer)
    sets = gradient_sets(s, us, 1.0)
    sizes = {g: (dp if g == grad_group(s) else expert_grad_group_size(s)) for _, g, _ in sets}
    gathers = []
    for _, group, params in sets:  # FP8 parameter gathering moves the FP8 layers' weights quantized
        moved = gather_bytes(s, w, experts=group != grad_group(s))
        gathers += [
            (group, b)
            for b in buckets([(i, n * moved) for i, n in reversed(params)], gather_elements * moved)
        ]
    # Megatron-Core --overlap-param-gather: the previous step's updated weights are all-gathered under this
    # iteration's forward (steady state), each unit's first forward waiting only for its own bucket
    ahead: dict[int, list[int]] = {}
    if s.parallelism.ddp.overlap_param_gather:
        for group, (idx, nbytes) in gathers:
            gid = p.add(
                0,
                "comm.dp",
                "all_gather",
                "forward",
                f"{_what(s, group)}param all-gather (units {idx[0]}..{idx[-1]})",
                (),
                group=group,
                bytes=nbytes,
            )
            for i in idx:
                ahead.setdefault(i, []).append(gid)
    bwd = -1
    setup: dict = {}
    for kind, mb, mb_b in microbatch_order(s):
        if kind == "FB":  # combined 1F1B (ZeRO-1 / the distributed optimizer: only the last backward reduces)
            add_combined(p, s, us, mb, mb_b, with_setup(w, us[0].block.forward, setup))
            continue
        if kind == "F":
            for i, u in enumerate(us):
                first = ready if mb == 0 and i == 0 else None
                ops = with_setup(w, u.block.forward, setup) if i == 0 else None
                deps = (*(ahead.get(u.index, ()) if mb == 0 else ()), first)
                add_forward(p, u, mb, deps, ops=ops, sync=i == 0 and microbatch_sync(w))
            continue
        reduce = (dp > 1 or offload) and (stage == 2 or mb == gas - 1)
        if offload and reduce and not sets:  # ZeRO-Offload on one rank: the gradients still go to the host
            sets_now = [("grad", grad_group(s), [(u.index, u.params) for u in reversed(us)])]
        else:
            sets_now = sets if reduce else []
        closes: dict[int, list] = {}
        for _, group, params in sets_now:
            for b in buckets([(i, n * gb) for i, n in params], reduce_elements * gb):
                closes.setdefault(b[0][-1], []).append((group, b))
        blocking = None
        for u in reversed(us):
            bwd = add_backward(p, s, u, mb, (blocking,))
            blocking = None
            for group, (idx, nbytes) in closes.get(u.index, ()):
                name = f"(units {idx[-1]}..{idx[0]})"
                rid = bwd
                n = sizes.get(group, dp)
                if n > 1:
                    kind, calls = gradient_reduction(cfg, n, w.framework.zero)
                    for _ in range(calls):  # one reduce per owning rank (DeepSpeed < 0.12.4), in turn
                        rid = p.add(
                            0,
                            "comm.dp",
                            kind,
                            "backward",
                            f"{_what(s, group)}grad {kind.replace('_', '-')} {name}",
                            (rid,),
                            group=group,
                            bytes=nbytes / calls,
                        )
                    blocking = None if overlap else rid
                # ZeRO-Offload: the rank's reduced partition goes to host memory (accumulated there)
                reductions.append(add_grad_copy(p, name, rid, nbytes / dp) if offload else rid)
    params = w.params_per_rank / dp + w.expert_params_per_rank / expert_grad_group_size(s)
    if offload:
        step = add_host_step(p, s, w.params_per_rank / dp, reductions)
        opt = add_param_copy(p, "updated weights to GPU", w.params_per_rank / dp * wb, (step,), "optimizer")
    else:
        tensors = parameter_tensors(s, w.num_layers, True, True)
        opt = add_optimizer(p, s, params, reductions, w=w, tensors=tensors)
    last = opt
    if not ahead:
        for group, (idx, nbytes) in gathers:
            last = p.add(
                0,
                gather_stream,
                "all_gather",
                "optimizer",
                f"{_what(s, group)}param all-gather (units {idx[0]}..{idx[-1]})",
                (opt,),
                group=group,
                bytes=nbytes,
            )
    return bwd, last


def _what(s: Scenario, group: str) -> str:
    """How a task names the parameters it moves: "" for the dense ones, "expert " for the routed experts'."""
    return "expert " if group == EXPERT_GROUP else ""


def screen_buffer_bytes(s: Scenario, framework, kind: str, pp: int, params: float) -> float:
    """``zero_buffers`` for a layout's ``kind`` of sharding, before the coordinator is replayed (the planner's
    screen): at stage 3 at most ``stage3_max_live_parameters`` of the rank's ``params`` gathered. None for DDP, FSDP
    and a pipeline's ZeRO-1 (strategy/pipeline keeps no bucket of its own)."""
    if kind not in ("zero1", "zero2", "zero3") or pp > 1:
        return 0.0
    cfg, stage = s.parallelism.zero, int(kind[-1])
    live = min(cfg.stage3_max_live_parameters, params) if stage == 3 else 0.0
    return zero_buffers(cfg, stage, grad_bytes(s, framework), weight_bytes(s), live)
