"""Rail symmetry of a communication pattern: groups that visit the same nodes in the same order, one rank per node
and each on one local GPU throughout (a data-parallel or pipeline group when tensor parallelism fills the node),
load the same links of every node but each through its own GPU's path and NIC rail. Their hops are made for one
group of each such family, and the per-node sums keep one column (the family's shared sums) instead of one per GPU;
the GPUs' paths and rails are multiplied in when the sums are read (``costs/traffic.py``, ``LinkLoads``).

At 131,072 GPUs (GPT-3 175B, TP 8, PP 8) a stage's data-parallel ring or tree over 2,048 nodes held 2,048 x 8 x 2
per-GPU sums at once (256 KiB, the heap's peak) and made the hops of eight groups; as one family it holds 2,048 x 2
and makes one group's hops.
"""

from __future__ import annotations

import numpy as np

from simulator.costs.node_sums import Sums
from simulator.hardware.placement import Groups

# Ranks checked at a time (their node and local-GPU arrays: 16 bytes a rank)
RAIL_CHUNK = 1 << 12
# A family's hops summed at a time (about 150 bytes of temporaries a hop): GPT-3 175B's patterns at 16,384 GPUs
# come in chunks this small already, so the heap's peak stays where it is up to 131,072 GPUs
RAIL_HOPS = 1 << 11


def rail_families(groups, gpn: int) -> tuple[Groups, tuple[int, ...]] | None:
    """(one group of each family, the local GPUs of each family's groups) where ``groups`` are families of m
    consecutive groups whose ranks are on the same nodes in the same order, one rank per node, each group on one
    local GPU, every family on the same m local GPUs; else None (the pattern is summed per GPU)."""
    if not isinstance(groups, Groups) or len(groups) == 0 or groups.size < 2:
        return None
    a, size = groups.array, groups.size
    first = a[0] // gpn
    m = 1
    while m < min(len(a), gpn + 1) and np.array_equal(a[m] // gpn, first):
        m += 1
    locals_ = np.sort(a[:m, 0] % gpn)
    if len(a) % m or (m > 1 and (locals_[1:] == locals_[:-1]).any()):
        return None
    fam_rows = max(1, RAIL_CHUNK // (size * m)) * m  # whole families at a time
    cols = max(1, RAIL_CHUNK // fam_rows)  # and their ranks a few thousand at a time
    for lo in range(0, len(a), fam_rows):
        rows = a[lo : lo + fam_rows]
        local0 = rows[:, :1] % gpn
        if m > 1 and not (np.sort(local0.reshape(-1, m), axis=1) == locals_).all():
            return None
        for c in range(0, size, cols):
            node, local = np.divmod(rows[:, c : c + cols], gpn)
            if not (local == local0).all():  # each group on one local GPU
                return None
            blocks = node.reshape(-1, m, node.shape[1])
            if not (blocks == blocks[:, :1]).all():  # a family's groups on the same nodes, in the same order
                return None
        on = np.sort(rows[::m] // gpn, axis=1)  # one rank per node (a family's first group, whole)
        if not (on[:, 1:] != on[:, :-1]).all():
            return None
    return Groups(a[::m], (groups.key, "rails", m)), tuple(locals_.tolist())


def rail_chunks(kind: str, groups: Groups, gpn: int):
    """(chunks, the nodes each may touch, how many): ``kind``'s hops of the families' groups, RAIL_HOPS at a
    time, a few groups or part of one (a 2,048-node tree is 8,188 hops), each chunk's nodes those of its whole
    groups (a node's single column of sums stays open until its group is done: 16 bytes a node)."""
    n = groups.size
    per_position = 4 if kind == "tree" else 1
    if n * per_position <= RAIL_HOPS:
        per = RAIL_HOPS // (n * per_position)
        spans = [(lo, lo + per, 0, n) for lo in range(0, len(groups), per)]
    else:
        step = RAIL_HOPS // per_position
        spans = [(lo, lo + 1, p, p + step) for lo in range(len(groups)) for p in range(0, n, step)]
    a = groups.array
    nodes = (a[lo:hi] // gpn for lo, hi, _, _ in spans)
    return (rail_hops(kind, a[lo:hi], p0, p1) for lo, hi, p0, p1 in spans), nodes, len(spans)


def rail_hops(kind: str, rows: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The hops of positions ``lo`` to ``hi`` - 1 of groups with one rank per node (``rows``: [group x rank]),
    as ``costs/hops.py`` makes them for such groups (its rings and trees over the sorted ranks with one channel,
    no chains inside nodes; pipeline neighbours in the group's order), in another order: their shares are 1 and
    1/2, whose sums are exact in any order."""
    n = rows.shape[1]
    if kind == "pairs":
        i = np.arange(lo, min(hi, n - 1))
        return rows[:, i].ravel(), rows[:, i + 1].ravel(), np.ones(len(rows) * len(i))
    g = np.sort(rows, axis=1)
    if kind == "ring":
        i = np.arange(lo, min(hi, n))
        return g[:, i].ravel(), g[:, (i + 1) % n].ravel(), np.ones(len(rows) * len(i))
    i = np.arange(max(lo, 1), min(hi, n))  # tree: two mirrored binary trees, each with half the data
    src, dst = [], []
    for order in (g, g[:, ::-1]):
        parent, child = order[:, (i - 1) // 2].ravel(), order[:, i].ravel()
        src += [child, parent]
        dst += [parent, child]
    src_a = np.concatenate(src)
    return src_a, np.concatenate(dst), np.full(len(src_a), 0.5)


def add_rail_hops(links, sums: Sums, src: np.ndarray, dst: np.ndarray, share: np.ndarray) -> None:
    """``LinkLoads._add`` for the hops of families' representatives (``sums.rails``: the families' local GPUs):
    every hop crosses nodes (one rank per node); a node's one column of sums stands for each of those GPUs, and
    each GPU's hops go through its own NIC, so the leaf sums take the hops once per GPU, on its rail."""
    cl = links.cluster
    gpn = cl.gpus_per_node
    na, nb = src // gpn, dst // gpn
    share = share.astype(float, copy=False)
    sums.open(np.concatenate((na, nb)))
    np.add.at(sums.out[:, 0], sums.row[na], share)
    np.add.at(sums.into[:, 0], sums.row[nb], share)
    sums.across = True
    npl, rail = cl.spec.fabric.nodes_per_leaf, cl.spec.fabric.rail_optimized
    leaves, rails = links._leaf_grid
    # each GPU's leaf: its node's group of leaves, plus its NIC's rail where the fabric is rail-optimized
    base_a, base_b = (na // npl) * rails, (nb // npl) * rails
    star, qps = cl.spine is not None, cl.spec.fabric.qps_per_connection
    for g in sums.rails:
        nic = cl.nearest_nic[g] if rail else 0
        sums.add_fabric(base_a + nic, base_b + nic, share, leaves, star, qps)
