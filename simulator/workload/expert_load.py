"""How many tokens each expert computes, and which expert-parallel rank is busiest.

Every rank routes its ``T`` tokens to ``top_k`` experts each. Expert ``e`` receives a share ``p_e`` of the routed
copies (``model.moe.load``: uniform; a measured ratio of the busiest expert to the mean; or a Zipf skew with
the experts in a seeded random order), from every rank of its expert-tensor x expert-parallel group. With a
capacity factor ``c`` an expert keeps at most ``ceil(c T k / E)`` copies from each source rank (Megatron-Core
``moe_utils.get_capacity``, core_v0.13.0; DeepSpeed ``sharded_moe._capacity``), the rest are dropped, and with
``pad_to_capacity`` it computes exactly that many rows. Rank ``r`` holds experts ``[r E/EP, (r+1) E/EP)``
(Megatron's ``local_expert_indices``); the busiest rank sets the pace of every all-to-all and of the layer.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from simulator.scenario.moe_config import ExpertLoadConfig, MoeConfig


@dataclass(frozen=True)
class ExpertLoad:
    rows: tuple[float, ...]  # rows each local expert of the busiest rank computes (after the ETP gather)
    real_rows: tuple[float, ...]  # of which routed tokens (the rest is capacity padding)
    received: (
        float  # rows the busiest rank receives over the all-to-all, over a balanced rank's (>= 1 mostly)
    )
    dropped: float  # fraction of the routed token copies the capacity drops
    imbalance: float  # the busiest rank's rows over the mean rank's

    @property
    def total_rows(self) -> float:
        return sum(self.rows)


def at_most_once(shares: list[float], top_k: int) -> list[float]:
    """The shares with none above 1 / top_k (an expert receives each token at most once: at most ``tokens`` of the
    ``tokens x top_k`` routed copies), the excess spread over the others in proportion to their shares (the
    router's top-k picks the next experts instead)."""
    cap = 1.0 / top_k
    out = list(shares)
    while True:
        over = [i for i, s in enumerate(out) if s > cap * (1 + 1e-12)]
        if not over:
            return out
        excess = sum(out[i] - cap for i in over)
        for i in over:
            out[i] = cap
        free = [i for i, s in enumerate(out) if s < cap * (1 - 1e-12)]
        room = sum(out[i] for i in free)
        if not free or room <= 0:
            return out
        for i in free:
            out[i] += excess * out[i] / room


def expert_shares(load: ExpertLoadConfig, experts: int, top_k: int = 1) -> list[float]:
    """Fraction of the routed token copies each expert receives (sums to 1), none above 1 / ``top_k``."""
    if load.skew is not None:
        weights = [1.0 / (i + 1) ** load.skew for i in range(experts)]
        random.Random(load.seed).shuffle(weights)
        total = sum(weights)
        return at_most_once([w / total for w in weights], top_k)
    elif load.imbalance > 1.0:
        hot = min(load.imbalance, float(experts))  # one expert at ``imbalance`` x the mean, the others equal
        weights = [hot] + [(experts - hot) / max(experts - 1, 1)] * (experts - 1)
    else:
        weights = [1.0] * experts
    total = sum(weights)
    return [w / total for w in weights]


def capacity(moe: MoeConfig, tokens: float) -> int | None:
    """Copies one expert takes from one source rank: ``ceil(c x tokens x top_k / experts)``; None = dropless."""
    if moe.capacity_factor is None:
        return None
    return math.ceil(moe.capacity_factor * tokens * moe.top_k / moe.num_experts)


def expert_load(moe: MoeConfig, tokens: float, ep: int, etp: int) -> ExpertLoad:
    """The busiest expert-parallel rank of a layer whose ranks each route ``tokens`` tokens."""
    e, k = moe.num_experts, moe.top_k
    per_source = [tokens * k * p for p in expert_shares(moe.load, e, k)]  # copies from one source rank
    cap = capacity(moe, tokens)
    kept = per_source if cap is None else [min(c, cap) for c in per_source]
    computed = [cap] * e if moe.pad_to_capacity and cap is not None else kept
    dropped = 1.0 - sum(kept) / (tokens * k) if tokens else 0.0
    sources = ep * etp  # an expert gathers rows from every rank of its ETP x EP group
    local = e // ep
    by_rank = [range(r * local, (r + 1) * local) for r in range(ep)]
    busiest = max(by_rank, key=lambda experts: sum(computed[i] for i in experts))
    rows = tuple(computed[i] * sources for i in busiest)
    mean = sum(computed) * sources / ep
    balanced = tokens * k * etp
    return ExpertLoad(
        rows=rows,
        real_rows=tuple(kept[i] * sources for i in busiest),
        received=sum(rows) / balanced if balanced else 0.0,
        dropped=max(dropped, 0.0),
        imbalance=sum(rows) / mean if mean else 1.0,
    )


def distinct_groups(experts: int, top_k: int, groups: int) -> float:
    """Expected number of distinct groups (ranks, nodes) a token's ``top_k`` experts fall in, the experts split
    evenly over ``groups`` and chosen uniformly without replacement: ``groups (1 - C(E - E/groups, k) / C(E, k))``
    (what DeepEP sends a token to: once per destination rank, across nodes once per node)."""
    if groups <= 1:
        return 1.0
    per = experts // groups
    miss = math.comb(experts - per, top_k) / math.comb(experts, top_k) if experts - per >= top_k else 0.0
    return groups * (1.0 - miss)


def destinations(moe: MoeConfig, groups: int) -> float:
    """Expected distinct ``groups`` (expert-parallel ranks, or nodes) one token's top-k experts fall in, the experts
    laid out contiguously over them (Megatron's ``local_expert_indices``). With group-limited routing (DeepSeek's
    node-limited routing: ``num_groups``, ``group_topk``) a token first picks ``group_topk`` of ``num_groups``
    contiguous expert groups, each scored by its best ``top_k / group_topk`` experts, then its top-k among them
    (Megatron-Core ``moe_utils.group_limited_topk``, core_v0.13.0): each chosen group takes about ``top_k /
    group_topk`` of the token's experts. Groups that span several destinations spread their share uniformly over
    them; destinations that hold several groups receive the chosen ones uniformly. Without it: uniform over all
    experts (``distinct_groups``)."""
    e, k = moe.num_experts, moe.top_k
    g, gk = moe.num_groups, moe.group_topk
    if g is None or gk is None or groups <= 1:
        return distinct_groups(e, k, groups)
    if groups % g == 0:  # each group spans groups / g destinations
        return min(gk * distinct_groups(e // g, max(k // gk, 1), groups // g), distinct_groups(e, k, groups))
    if g % groups == 0:  # each destination holds g / groups groups
        return min(distinct_groups(g, gk, groups), distinct_groups(e, k, groups))
    return distinct_groups(e, k, groups)
