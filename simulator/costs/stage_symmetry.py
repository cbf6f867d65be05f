"""Pipeline stages are alike: a stage's collectives load its links as another stage's do, moved, where the
placement makes them translates of each other by whole leaf switches. :class:`CollectiveModel` asks here before
it computes a stage's link loads (at 131,072 GPUs each data-parallel pattern is 16,384 hops)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np


def same_groups(a: np.ndarray, b: np.ndarray, shift: int = 0) -> bool:
    """Whether two [groups x ranks] arrays hold the same groups once ``shift`` is added to ``a``'s ranks, each
    the same ranks in the same order, in any order of the groups. Compared a few thousand groups at a time:
    at 131,072 GPUs a stage's pipeline groups are 1 MiB, and sorted copies of both at once were 3 MiB more."""
    if a.shape != b.shape:
        return False
    if a.size == 0:
        return True
    oa, ob = np.argsort(a[:, 0], kind="stable"), np.argsort(b[:, 0], kind="stable")
    if not (np.diff(a[oa, 0]) > 0).all():  # groups of one kind are disjoint; where not, sort by every rank
        oa, ob = np.lexsort(a.T[::-1]), np.lexsort(b.T[::-1])
    rows = max(1, 4096 // a.shape[1])
    return all(
        np.array_equal(a[oa[lo : lo + rows]] + shift, b[ob[lo : lo + rows]]) for lo in range(0, len(a), rows)
    )


def translated(cm, op: str, group: str, size_bytes: float, stage: int):
    """Stage ``stage``'s phases as another stage's of the collective model ``cm``, moved: exact when stage ``stage``'s groups are that
    stage's shifted by whole leaf switches and every node holds one stage (the usual placement: pipeline
    stages outermost), so its links are loaded alike; the link classes then carry the stage set shifted
    by the difference. Stage 0 is tried first, then every stage already computed (at 131,072 GPUs a stage
    is 2,048 nodes, not a whole number of 20-node leaves, but stage 6 is stage 1 moved by 512 of them).
    ``None`` where no stage fits (the caller computes the groups' loads)."""
    gpn, per_leaf = cm.cluster.gpus_per_node, cm.cluster.spec.fabric.nodes_per_leaf
    if not cm.links.one_stage_per_node:
        return None
    mine = cm._stage_groups(group, stage)
    if not len(mine):
        return None
    first = int(np.asarray(mine).min())
    for from_stage in range(cm.links.last_stage + 1):
        if from_stage == stage or from_stage and (op, group, size_bytes, from_stage) not in cm._phases:
            continue  # stage 0 is computed on demand, another only where it already was
        base = cm._stage_groups(group, from_stage)
        if not len(base) or len(base) != len(mine):
            continue
        shift = first - int(np.asarray(base).min())
        if shift % gpn or (shift // gpn) % per_leaf:
            continue
        if not same_groups(np.asarray(base), np.asarray(mine), shift):
            continue
        if shift == 0:  # the very same groups (each spans the stages: pipeline groups): the same phases
            key = (op, group, size_bytes, from_stage)
            return cm.phases(*key), cm._sources[key]
        out = moved(cm, op, group, size_bytes, from_stage, stage - from_stage)
        if out is not None:
            return out
    return None


def moved(cm, op: str, group: str, size_bytes: float, from_stage: int, by: int):
    """``from_stage``'s phases with every link class's stage set moved ``by`` stages (``None`` past the
    first or the last stage)."""
    last = cm.links.last_stage
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
