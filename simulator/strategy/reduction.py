"""How each framework reduces gradients over data parallelism: PyTorch DDP's bucketing (and the framework's
defaults for it), DeepSpeed ZeRO-1/2's per-release bucket reduction, DeepSpeed's optimizer wrappers in its
pipeline engine (BF16_Optimizer), and Megatron-Core's bucket size. Each function cites the source it replays."""

from __future__ import annotations

import math

from simulator.scenario.schema import ONEBIT_OPTIMIZERS, Scenario
from simulator.strategy.groups import EXPERT_GROUP, expert_grad_group_size, grad_group, grad_group_size
from simulator.strategy.state_bytes import grad_bytes
from simulator.workload.transformer import Workload


def ddp_settings(s: Scenario, w: Workload) -> tuple[bool, float | None]:
    """(overlap gradient reduction with backward, bucket bytes or None for one bucket): the scenario's
    ``parallelism.ddp`` where it says, else the framework's way (PyTorch DDP: 25 MB buckets under backward;
    Megatron-LM's local DDP: the whole gradient buffer after backward, megatron/model/distributed.py)."""
    cfg, fw = s.parallelism.ddp, w.framework.ddp
    overlap = cfg.overlap_grad_reduce if cfg.overlap_grad_reduce is not None else fw.overlap_grad_reduce
    cap_mb = cfg.bucket_cap_mb if cfg.bucket_cap_mb is not None else fw.bucket_cap_mb
    return overlap, (cap_mb * 2**20 if cap_mb is not None else None)


def bucket_copy(s: Scenario, w: Workload, overlap: bool | None = None) -> bool:
    """Does the DDP keep its reduction buckets as a second copy of the gradients? PyTorch DDP's default does: its
    Reducer allocates bucket storage for every gradient at construction and copies each gradient in as it is
    ready (torch/csrc/distributed/c10d/reducer.cpp; gradient_as_bucket_view=True makes the gradients views into
    it, pytorch/pytorch#41954: "peak memory dropped ~1GB" for a 1 GB model). Megatron-Core's grad buffer is the
    buckets. Only where buckets reduce during backward: a single all-reduce after backward is Megatron's local
    DDP, priced on its own (strategy/ddp.py); and not under DeepSpeed's 1-bit optimizers, whose engine reduces
    through flattened buckets of its own (engine.py ``buffered_allreduce_fallback``) that live only while they
    are sent. ``overlap``: the reduction beside backward or not, where the caller decides it (a plan's layout)."""
    if s.training.optimizer in ONEBIT_OPTIMIZERS:
        return False
    configured, cap = ddp_settings(s, w)
    overlap = configured if overlap is None else overlap
    view = s.parallelism.ddp.gradient_as_bucket_view
    view = w.framework.ddp.gradient_as_bucket_view if view is None else view
    return overlap and cap is not None and not view


def buckets(sizes: list[tuple[int, float]], cap: float) -> list[tuple[list[int], float]]:
    """Group consecutive (unit index, bytes) into buckets of at least ``cap`` bytes, as gradients become ready.
    A unit larger than the cap forms its own bucket (PyTorch DDP and DeepSpeed never split a tensor)."""
    out: list[tuple[list[int], float]] = []
    cur: list[int] = []
    total = 0.0
    for idx, nbytes in sizes:
        cur.append(idx)
        total += nbytes
        if total >= cap:
            out.append((cur, total))
            cur, total = [], 0.0
    if cur:
        out.append((cur, total))
    return out


def version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def gradient_reduction(cfg, dp: int, implementation: str = "deepspeed") -> tuple[str, int]:
    """How DeepSpeed ZeRO-1/2 reduces one gradient bucket over ``dp`` ranks: (collective, calls, each of 1/calls
    of the bucket). deepspeed/runtime/zero/stage_1_and_2.py, ``average_tensor``: without ``reduce_scatter`` the
    bucket is all-reduced; from v0.12.4 ``use_multi_rank_bucket_allreduce`` (default true) all-reduces the whole
    bucket and each rank keeps its slice (``allreduce_and_scatter``): twice a reduce-scatter's wire bytes;
    before, one ``dist.reduce`` to each rank that owns a slice of the bucket. Megatron-Core's distributed
    optimizer reduce-scatters its gradient buckets (``implementation="megatron"``)."""
    if implementation == "megatron":
        return "reduce_scatter", 1
    if not cfg.reduce_scatter:
        return "all_reduce", 1
    multi = cfg.use_multi_rank_bucket_allreduce
    if multi is None:
        multi = version(cfg.deepspeed_version) >= (0, 12, 4)
    return ("all_reduce", 1) if multi else ("reduce", dp)


# deepspeed/runtime/engine.py MEMORY_OPT_ALLREDUCE_SIZE (v0.16.5): the elements per buffer of the engine's own
# gradient all-reduce (buffered_allreduce_fallback), which the pipeline engine's ReduceGrads uses without ZeRO
ALLREDUCE_BUFFER_ELEMENTS = 5e8


# BF16_Optimizer.update_hp_grads after every backward (bf16_optimizer.py, v0.16.5): per parameter tensor
# lp.grad.to(fp32) (read 2 bytes, write 4) and hp_grad.add_ (read 4 + 4, write 4)
HP_GRAD_UPDATE_BYTES_PER_PARAM = 18


def bf16_optimizer(s: Scenario) -> bool:
    """Whether DeepSpeed wraps the optimizer in BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py, from
    v0.6.2): bf16 training whose gradients accumulate in fp32, i.e. without ZeRO (``get_data_types``: fp32 is
    the default there) or ZeRO-1 with ``grad_accum_dtype: fp32`` and no offload (engine.py
    ``_do_optimizer_sanity_check``, v0.16.5). It keeps an fp32 copy of every gradient, all-reduces it in fp32,
    steps the rank's 1/N of the fp32 weights and all-gathers the bf16 weights: its own ZeRO-1 (BLOOM's recipe
    ran it as ``ZERO_STAGE=0``: "bf16 must use z0! it implements its own zero stage 1 equivalent")."""
    par, cfg = s.parallelism, s.parallelism.zero
    if s.training.dtype != "bf16" or version(cfg.deepspeed_version) < (0, 6, 2):
        return False
    accum = cfg.grad_accum_dtype or ("fp32" if par.zero_stage == 0 else "bf16")
    if accum != "fp32":
        return False
    return par.zero_stage == 0 or (par.zero_stage == 1 and cfg.offload_optimizer.device == "none")


def pipeline_grad_reduction(s: Scenario, params: float) -> list[tuple[str, float]]:
    """(collective, bytes) of each call with which DeepSpeed's PipelineEngine reduces one stage's gradients over
    data parallelism after the last microbatch (pipe/engine.py ``_exec_reduce_grads``, v0.16.5): ZeRO-1 reduces
    ``reduce_bucket_size`` buckets as stage_1_and_2.py does (``reduce_gradients(pipeline_parallel=True)``, the
    release's ``gradient_reduction``); BF16_Optimizer all-reduces its fp32 gradients and the plain engine the
    16-bit ones, in ``MEMORY_OPT_ALLREDUCE_SIZE`` buffers (``buffered_allreduce_fallback``)."""
    par, cfg = s.parallelism, s.parallelism.zero
    dp = grad_group_size(s)
    if dp == 1:
        return []
    bf16 = bf16_optimizer(s)
    if par.zero_stage == 1 and not bf16:
        gb = grad_bytes(s)
        kind, calls = gradient_reduction(cfg, dp)
        out = []
        for n in _split(params, cfg.reduce_bucket_size):
            out += [(kind, n * gb / calls)] * calls
        return out
    gb = 4 if bf16 else grad_bytes(s)
    return [("all_reduce", n * gb) for n in _split(params, ALLREDUCE_BUFFER_ELEMENTS)]


def _split(elements: float, per_buffer: float) -> list[float]:
    """``elements`` in buffers of ``per_buffer`` (the last one partly filled)."""
    full = int(elements // per_buffer)
    rest = elements - full * per_buffer
    return [per_buffer] * full + ([rest] if rest > 0 else [])


def megatron_bucket_elements(s: Scenario, w: Workload) -> float:
    """Parameters per gradient (and parameter all-gather) bucket of Megatron-Core's DDP: with
    overlap_grad_reduce max(40M, 1M x DP) ("make buckets larger to ensure that chunks used in NCCL ring-reduce
    implementations are large enough to remain bandwidth-bound", megatron/training/training.py get_model,
    core_r0.8), without it one bucket; ``ddp.bucket_cap_mb`` in the scenario overrides."""
    overlap, _ = ddp_settings(s, w)
    if s.parallelism.ddp.bucket_cap_mb is not None:
        return s.parallelism.ddp.bucket_cap_mb * 2**20 / grad_bytes(s, w.framework)
    return max(4e7, 1e6 * grad_group_size(s)) if overlap else math.inf


def gradient_sets(s: Scenario, us: list, per_param: float) -> list[tuple[str, str, list[tuple[int, float]]]]:
    """(what, group, [(unit index, bytes)] in backward order) of each set of gradients reduced together: the dense
    parameters over data parallelism, and in a mixture-of-experts model the routed experts' over expert data
    parallelism (Megatron-Core's separate expert gradient buffers, DeepSpeed's expert param groups). A set whose
    group has one rank needs no reduction and is left out."""
    out = []
    if grad_group_size(s) > 1:
        out.append(("grad", grad_group(s), [(u.index, u.params * per_param) for u in reversed(us)]))
    experts = [(u.index, u.expert_params * per_param) for u in reversed(us) if u.expert_params]
    if experts and expert_grad_group_size(s) > 1:
        out.append(("expert grad", EXPERT_GROUP, experts))
    return out
