"""The layouts a plan searches: every way to lay a model out on N GPUs that divides (tensor, context, pipeline
and data parallel sizes, virtual stages, micro-batch size, weight / gradient sharding (DDP, ZeRO-1/2/3, FSDP and
HSDP with shard groups of whole nodes), activation recompute; for a mixture-of-experts model expert parallel and
expert tensor parallel sizes too; DeepSeek's DualPipe and DualPipeV beside Megatron's pipeline schedules)."""

from __future__ import annotations

from simulator.scenario.schema import Scenario, path_stages
from simulator.study.layout import HSDP_NODES, RECOMPUTE, SHARDINGS, Layout

MAX_MICRO_BATCH = 16  # micro-batches searched by default: every one up to this dividing a rank's batch


def divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, min(limit or n, n) + 1) if n % d == 0]


def candidates(
    base: Scenario, gpus: int, gpn: int, options: dict | None = None, batch: int | None = None
) -> list[Layout]:
    """Every layout that divides: TP within a node and dividing heads / query groups / FFN, PP dividing the
    layers, CP (FlashAttention only) leaving at least 2,048 tokens per rank, micro-batches up to
    MAX_MICRO_BATCH dividing a data-parallel rank's batch, interleaving by every number of virtual stages that
    divides a stage's layers, only where the microbatches are a multiple of PP, ZeRO-2/3, FSDP and HSDP only without PP
    (HSDP without CP, its shard groups whole nodes: ``hsdp_shards``); for
    a mixture-of-experts model EP dividing the experts and ETP (1 or TP) with ETP x EP dividing TP x CP x DP,
    sharding by DDP or ZeRO-1/2 (what the MoE frameworks run)."""
    o = options or {}
    m, batch = base.model, batch or base.training.global_batch_size
    tps = [
        t
        for t in divisors(gpn)
        if m.num_attention_heads % t == 0 and m.query_groups % t == 0 and m.ffn_size % t == 0
    ]
    cps = [1] + (
        [c for c in (2, 4, 8, 16) if m.seq_length // c >= 2048 and m.seq_length % (2 * c) == 0]
        if m.attention == "flash"
        else []
    )
    pps = [p for p in range(1, min(m.num_layers, o.get("max_pp", 64)) + 1) if stage_split(m.num_layers, p)]
    mbss = o.get("micro_batch_sizes")  # default: every micro-batch up to 16 dividing a rank's batch (below)
    moe = m.moe
    shardings = o.get("shardings", SHARDINGS if moe is None else ("ddp", "zero1", "zero2"))
    # selective recompute re-runs the attention scores that FlashAttention never stores: the same as none, unless
    # the base names Megatron-Core's other recompute modules
    plain = m.attention == "flash" and base.training.recompute.modules == ("core_attn",)
    recomputes = o.get("recompute", tuple(r for r in RECOMPUTE if not (r == "selective" and plain)))
    out = []
    for tp in o.get("tp", tps):
        for cp in o.get("cp", cps):
            for pp in o.get("pp", pps):
                if gpus % (tp * cp * pp):
                    continue
                dp = gpus // (tp * cp * pp)
                local = batch // dp if batch % dp == 0 else 0  # a data-parallel rank's samples
                split = stage_split(m.num_layers, pp)
                if split is None:
                    continue
                first, middle, last = split
                ends = (first, last) if m.num_layers % pp else (0, 0)
                for mbs in mbss or divisors(local, o.get("max_micro_batch", MAX_MICRO_BATCH)):
                    if not local or local % mbs:
                        continue
                    gas = batch // (mbs * dp)
                    vs = [1] + [
                        v
                        for v in o.get("virtual", range(2, m.num_layers // pp + 1))
                        if pp > 1 and middle % v == 0 and min(first, last) >= v - 1 and gas % pp == 0
                    ]
                    # DeepSeek's DualPipe / DualPipeV where their stages split the layers (dual_plans)
                    plans = [(v, "", ends) for v in vs] + dual_plans(m.num_layers, pp, gas, o)
                    for v, schedule, cut in plans:
                        for sh in shardings:
                            if pp > 1 and sh not in ("ddp", "zero1"):
                                continue
                            if dp == 1 and sh != "ddp":
                                continue
                            shards = (0,)  # HSDP: its shard-group sizes, none with context parallelism
                            if sh == "hsdp":
                                shards = hsdp_shards(tp * cp, dp, gpn) if cp == 1 else ()
                                if not shards:
                                    continue
                            flips = switch_sets(tp, dp, sh, moe is not None) if o.get("switches") else NONE
                            for ep, etp in _expert_layouts(moe, tp, cp, dp, o):
                                for rc in recomputes:
                                    offloads = (
                                        offload_counts(m, pp, sh, rc) if o.get("switches") else OFFLOADS
                                    )
                                    head = (tp, pp, cp, dp, v, mbs, sh, rc, ep, etp)
                                    for shard in shards:
                                        for flip in flips:
                                            for n in offloads:
                                                out.append(Layout(*head, shard, *cut, schedule, *flip, n))
    return out


NONE = ((None, None, None, None),)  # no switch searched: each the base's (``carried``)
OFFLOADS = (None,)  # activation offloading not searched: the base's


def offload_counts(m, pp: int, sharding: str, recompute: str) -> tuple[int, ...]:
    """Layers whose activations a plan with ``switches`` offloads: none, or every layer but the last (Calculon's
    ``activations_offload`` on and off; Megatron-Core offloads the first N < layers), where the simulation runs it
    (no PP, no full recompute, DDP or ZeRO-1/2: scenario/schema.py)."""
    plain = sharding.removesuffix("-offload") in ("ddp", "zero1", "zero2")
    if pp > 1 or recompute == "full" or m.num_layers < 2 or not plain:
        return (0,)
    return (0, m.num_layers - 1)


def switch_sets(tp: int, dp: int, sharding: str, moe: bool) -> list[tuple]:
    """(sp, tp_overlap, grad_overlap, param_overlap) a plan with ``switches`` tries for a layout: sequence
    parallelism off, on, and on with TP overlap where TP > 1 (an MoE model's Megatron-Core layers need it on);
    the gradient reduction beside backward or after it where DP > 1; the distributed optimizer's weight gather
    beside the next forward or not (ZeRO-1). Calculon's ``tensor_par_comm_type`` (ar / rs_ag), ``tensor_par_overlap``
    and ``data_par_overlap`` (calculon/llm/optimal_execution.py at caa4b11) as this simulator's scenario states
    them."""
    tps = [(None, None)]
    if tp > 1:
        tps = ([] if moe else [(False, False)]) + [(True, False), (True, True)]
    grads = (True, False) if dp > 1 and sharding in ("ddp", "zero1") else (None,)
    params = (True, False) if dp > 1 and sharding == "zero1" else (None,)
    return [(sp, o, g, q) for sp, o in tps for g in grads for q in params]


def dual_plans(num_layers: int, pp: int, gas: int, o: dict) -> list[tuple[int, str, tuple[int, int]]]:
    """(virtual stages, schedule, (first, last)) of DeepSeek's schedules where their stages split the layers
    (``stage_split`` over PP stages for DualPipe, 2 PP for DualPipeV) and the micro-batches fill them (at least
    2 PP; DualPipe an even count over an even PP: strategy/pipeline/partition.py)."""
    out = []
    for name in o.get("schedules", ("dualpipe", "dualpipev")):
        stages = path_stages(name, pp, 2)
        split = stage_split(num_layers, stages)
        if pp < 2 or gas < 2 * pp or split is None or (name == "dualpipe" and (pp % 2 or gas % 2)):
            continue
        out.append((2, name, (0, 0) if num_layers % stages == 0 else (split[0], split[2])))
    return out


def stage_split(num_layers: int, pp: int) -> tuple[int, int, int] | None:
    """(first, middle, last) stage layers of ``pp`` stages: alike where PP divides the layers; else each middle
    stage ceil(L / PP) and the rest on the two end stages, the last (with the output layer and loss) the lighter,
    each with at least one layer and at most a middle stage's (DeepSeek-V3's 61 layers on 16 stages: 3, 4, 2);
    None where no such split exists."""
    if num_layers % pp == 0:
        return (num_layers // pp,) * 3
    if pp < 2:
        return None
    middle = -(-num_layers // pp) if pp > 2 else 0
    rest = num_layers - (pp - 2) * middle
    last = rest // 2
    first = rest - last
    if last < 1 or (pp > 2 and first > middle):
        return None
    return first, middle, last


def hsdp_shards(inner: int, dp: int, gpn: int) -> tuple[int, ...]:
    """HSDP shard-group sizes (data-parallel ranks) whose groups fill 1, 2, 4 or 8 whole nodes, leaving at least two
    replicas (``inner``: the TP x CP ranks of one data-parallel rank)."""
    out = []
    for nodes in HSDP_NODES:
        ranks = nodes * gpn
        if ranks % inner:
            continue
        shard = ranks // inner
        if 1 < shard < dp and dp % shard == 0:
            out.append(shard)
    return tuple(out)


def _expert_layouts(moe, tp: int, cp: int, dp: int, o: dict) -> list[tuple[int, int]]:
    """(EP, ETP) pairs a layout's ranks can fold the experts over (Megatron-Core: ETP x EP divides TP x CP x DP)."""
    if moe is None:
        return [(1, 1)]
    ranks = tp * cp * dp
    eps = o.get("ep", divisors(moe.num_experts))
    etps = o.get("etp", sorted({1, tp}))
    return [(ep, etp) for ep in eps for etp in etps if ranks % (ep * etp) == 0]


def why_none(
    base: Scenario, gpus: int, gpn: int, options: dict | None = None, batch: int | None = None
) -> str:
    """Which dimension left ``candidates`` empty: the first of TP, PP, TP x CP x PP against the GPUs, the batch
    against the data-parallel sizes, the micro-batches, and the expert layouts that no choice passes."""
    o = options or {}
    m, batch = base.model, batch or base.training.global_batch_size
    tps = [
        t
        for t in o.get("tp", divisors(gpn))
        if t <= gpn and not (m.num_attention_heads % t or m.ffn_size % t)
    ]
    tps = [t for t in tps if m.query_groups % t == 0]
    if not tps:
        return (
            f"no tensor-parallel size ({', '.join(map(str, o.get('tp', divisors(gpn))))}) fits a {gpn}-GPU node and "
            f"divides the {m.num_attention_heads} heads, {m.query_groups} query groups and FFN width {m.ffn_size}"
        )
    pps = [
        p
        for p in o.get("pp", range(1, min(m.num_layers, o.get("max_pp", 64)) + 1))
        if stage_split(m.num_layers, p)
    ]
    if not pps:
        return (
            f"no pipeline size ({', '.join(map(str, o.get('pp', ())))}) splits the {m.num_layers} layers (evenly, "
            "or with the first and last stages holding the rest)"
        )
    cps = o.get("cp", [1])
    shapes = [(t, c, p) for t in tps for c in cps for p in pps if gpus % (t * c * p) == 0]
    if not shapes:
        return f"no TP ({tps}) x CP ({cps}) x PP ({pps}) divides the {gpus} GPUs"
    dps = sorted({gpus // (t * c * p) for t, c, p in shapes})
    if all(batch % dp for dp in dps):
        return f"the global batch ({batch}) divides by none of the data-parallel sizes these leave ({dps})"
    mbss = o.get("micro_batch_sizes")
    if mbss and all(batch % dp or (batch // dp) % mbs for dp in dps for mbs in mbss):
        return f"no micro-batch size ({', '.join(map(str, mbss))}) divides a data-parallel rank's batch"
    if m.moe is not None and not any(
        _expert_layouts(m.moe, t, c, gpus // (t * c * p), o) for t, c, p in shapes
    ):
        return (
            f"no expert-parallel size ({', '.join(map(str, o.get('ep', ())))}) folds the {m.moe.num_experts} "
            "experts over these layouts"
        )
    return "every combination is refused by the shardings, recompute or HSDP groups given"
