"""Pipeline stages are alike: a stage's collectives load its links as another stage's do, moved, where the
placement makes them translates of each other by whole leaf switches. :class:`CollectiveModel` asks here before
it computes a stage's link loads (at 131,072 GPUs each data-parallel pattern is 16,384 hops)."""

from __future__ import annotations

from dataclasses import replace


def translated(cm, op: str, group: str, size_bytes: float, stage: int):
    """Stage ``stage``'s phases as another stage's of the collective model ``cm``, moved: exact when stage ``stage``'s groups are that
    stage's shifted by whole leaf switches and every node holds one stage (the usual placement: pipeline
    stages outermost), so its links are loaded alike; the link classes then carry the stage set shifted
    by the difference. Stage 0 is tried first, then every stage already computed (at 131,072 GPUs a stage
    is 2,048 nodes, not a whole number of 20-node leaves, but stage 6 is stage 1 moved by 512 of them).
    ``None`` where no stage fits (the caller computes the groups' loads)."""
    gpn, per_leaf = cm.cluster.gpus_per_node, cm.cluster.spec.fabric.nodes_per_leaf
    if any(len(n) != 1 for n in cm.links.node_stages):
        return None
    mine = cm._stage_groups(group, stage)
    if not mine:
        return None
    first = min(min(g) for g in mine)
    last = max(x for n in cm.links.node_stages for x in n)
    for from_stage in range(last + 1):
        if from_stage == stage or from_stage and (op, group, size_bytes, from_stage) not in cm._phases:
            continue  # stage 0 is computed on demand, another only where it already was
        base = cm._stage_groups(group, from_stage)
        if not base or len(base) != len(mine):
            continue
        shift = first - min(min(g) for g in base)
        if shift % gpn or (shift // gpn) % per_leaf:
            continue
        if sorted(tuple(r + shift for r in g) for g in base) != sorted(mine):
            continue
        out = moved(cm, op, group, size_bytes, from_stage, stage - from_stage)
        if out is not None:
            return out
    return None


def moved(cm, op: str, group: str, size_bytes: float, from_stage: int, by: int):
    """``from_stage``'s phases with every link class's stage set moved ``by`` stages (``None`` past the
    first or the last stage)."""
    last = max(x for n in cm.links.node_stages for x in n)
    phases = cm.phases(op, group, size_bytes, from_stage)
    out = []
    for ph in phases:
        demand = {}
        for (stages, *rest), sec in ph.demand_s.items():
            if any(not 0 <= x + by <= last for x in stages):
                return None
            demand[(frozenset(x + by for x in stages), *rest)] = sec
        out.append(replace(ph, demand_s=demand))
    return tuple(out), cm._sources[(op, group, size_bytes, from_stage)]
