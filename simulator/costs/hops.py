"""The hops of each communication pattern: NCCL's rings (one per NIC rail) and double binary trees, pipeline
neighbours, and an all-to-all's pairs, as (source GPU, destination GPU, share of the per-step chunk) arrays over
every group at once. ``costs/traffic.py`` puts them on the links.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from simulator.hardware.placement import Groups

# An all-to-all's n(n-1) pairs are n-1 rotations (rank i -> rank i+s mod n), each a permutation. Up to this many
# ranks every rotation is taken; beyond it (1-bit Adam's momentum all-to-all over a 16,384-GPU data-parallel
# group has 2.7e8 pairs) the rotations that can stay on a node are taken and this many others, evenly spaced,
# stand for the rest.
ALL_PAIRS_EXACT = 256
SAMPLED_ROTATIONS = 16


def by_size(groups) -> list[tuple[int, np.ndarray]]:
    """(ranks per group, a [groups x ranks] array) for each group size among ``groups``: one entry for a
    placement's :class:`~simulator.hardware.placement.Groups` (already one array), a loop for tuples."""
    if isinstance(groups, Groups):
        return [(groups.size, groups.array)]
    same: dict[int, list] = defaultdict(list)
    for grp in groups:
        same[len(grp)].append(grp)
    return [(n, np.asarray(gs, dtype=np.int64)) for n, gs in same.items()]


def all_pairs(groups, gpus_per_node: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src GPUs, dst GPUs, shares) of an all-to-all over every group: each rank sends one unit (its chunk for
    that peer) to each of the n-1 others.

    A group of more than ALL_PAIRS_EXACT ranks keeps the rotations |s| < c exactly (c: the most ranks of the
    group on one node, the only rotations with pairs inside a node when the group fills nodes in order) and
    SAMPLED_ROTATIONS of the others, each weighted by the rotations it stands for. Every rank then still sends
    n-1 units, n-c of them off its node, and receives as many: NVLink, GPU-to-NIC and NIC loads are the exact
    ones; only how the cross-node units spread over leaf-switch pairs is sampled."""
    src, dst, share = [], [], []
    for n, g in by_size(groups):
        if n < 2:
            continue
        rotations: list[tuple[int, float]]
        if n <= ALL_PAIRS_EXACT:
            rotations = [(s, 1.0) for s in range(1, n)]
        else:
            c = int(np.unique(g[0] // gpus_per_node, return_counts=True)[1].max())
            middle = n - 2 * c + 1  # rotations c .. n-c: every pair crosses nodes
            k = min(SAMPLED_ROTATIONS, middle)
            picked = [c + (j * middle + middle // 2) // k for j in range(k)]
            rotations = [(s, 1.0) for s in range(1, c)] + [(n - s, 1.0) for s in range(1, c)]
            rotations += [(s, middle / k) for s in picked]
        for s, w in rotations:
            src.append(g.ravel())
            dst.append(np.roll(g, -s, axis=1).ravel())
            share.append(np.full(g.size, w))
    if not src:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(src), np.concatenate(dst), np.concatenate(share)


def hops(kind: str, groups, gpus_per_node: int, nics: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src GPUs, dst GPUs, shares of the per-step chunk) of every hop of every group of a collective whose
    communication pattern is ``kind``: ``ring`` (NCCL's rings, one per NIC rail), ``tree`` (NCCL's double binary
    tree across nodes, chains inside them), ``pairs`` (pipeline neighbours), ``all_pairs`` (all-to-all, see
    all_pairs). Groups of one shape (as many ranks on each of as many nodes) are laid out together with numpy:
    at 131,072 GPUs a data-parallel ring is 131,072 hops, built without a Python loop over them."""
    if kind == "all_pairs":
        return all_pairs(groups, gpus_per_node)
    if kind not in ("pairs", "ring", "tree"):
        raise ValueError(kind)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for n, g in by_size(groups):
        if kind == "pairs":  # rank i -> rank i+1 of the group, in the group's order (pipeline neighbours)
            if n > 1:
                parts.append((g[:, :-1].ravel(), g[:, 1:].ravel(), np.ones(g[:, 1:].size)))
            continue
        g = np.sort(g, axis=1)
        node = g // gpus_per_node
        count = 1 + (np.diff(node, axis=1) != 0).sum(axis=1)  # nodes each group spans
        # the distinct counts (np.unique of a plain array imports numpy.ma, 6 ms, on first use)
        for nodes in np.flatnonzero(np.bincount(count)).tolist():
            rows = g[count == nodes]
            k = n // nodes
            segs = rows.reshape(len(rows), nodes, k) if nodes * k == n else None
            if segs is not None:  # as many ranks on every node: [group, node, rank on the node]
                seg_nodes = segs // gpus_per_node
                even = (seg_nodes[:, :, 0] == seg_nodes[:, :, -1]).all(axis=1)
                if even.any():
                    parts.append((_ring if kind == "ring" else _tree)(segs[even], nodes, k, nics))
                rows = rows[~even]
            parts += [_loop_hops(kind, r.tolist(), gpus_per_node, nics) for r in rows]
    parts = [p for p in parts if len(p[0])]
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    return tuple(np.concatenate(x) for x in zip(*parts, strict=True))  # type: ignore[return-value]


def _ring(segs: np.ndarray, nodes: int, k: int, nics: int):
    """NCCL runs one ring per NIC rail. Ring c enters and leaves every node on the same rail: it crosses even
    nodes from GPU off to GPU off-1 and odd nodes back from off-1 to off."""
    channels = min(k, nics) if nodes > 1 else 1
    src, dst = [], []
    for c in range(channels):
        rot = np.roll(segs, -(c * k // channels), axis=2)
        rot[:, 1::2] = rot[:, 1::2, ::-1]
        order = rot.reshape(len(segs), nodes * k)
        src.append(order.ravel())
        dst.append(np.roll(order, -1, axis=1).ravel())
    src_a, dst_a = np.concatenate(src), np.concatenate(dst)
    return src_a, dst_a, np.full(src_a.size, 1 / channels)


def _tree(segs: np.ndarray, nodes: int, k: int, nics: int):
    """NCCL's trees: a chain inside each node (reduced up, broadcast down), two mirrored binary trees over the
    chains' first ranks, each with half the data; one per NIC rail."""
    channels = min(k, nics)
    src, dst, share = [], [], []
    for c in range(channels):
        chains = np.roll(segs, -(c * k // channels), axis=2)
        a, b = chains[:, :, :-1].ravel(), chains[:, :, 1:].ravel()
        src += [b, a]
        dst += [a, b]
        share += [np.full(2 * a.size, 1 / channels)]
        leaders = chains[:, :, 0]
        for order in (leaders, leaders[:, ::-1]):
            i = np.arange(1, nodes)
            parent, child = order[:, (i - 1) // 2].ravel(), order[:, i].ravel()
            src += [child, parent]
            dst += [parent, child]
            share += [np.full(2 * child.size, 0.5 / channels)]
    return np.concatenate(src), np.concatenate(dst), np.concatenate(share)


def _loop_hops(kind: str, ranks: list[int], gpus_per_node: int, nics: int):
    """The hops of one group whose nodes hold different numbers of its ranks, one node at a time."""
    by_node: dict[int, list[int]] = defaultdict(list)
    for g in ranks:
        by_node[g // gpus_per_node].append(g)
    segs = list(by_node.values())
    out: list[tuple[int, int, float]] = []
    k = len(segs[0])
    if kind == "ring":
        channels = min(k, nics) if len(segs) > 1 else 1
        for c in range(channels):
            off = c * k // channels
            order = []
            for j, seg in enumerate(segs):
                rot = seg[off:] + seg[:off]
                order += rot if j % 2 == 0 else rot[::-1]
            out += [(order[i], order[(i + 1) % len(order)], 1 / channels) for i in range(len(order))]
    else:
        channels = min(k, nics)
        for c in range(channels):
            off = c * k // channels
            chains = [seg[off:] + seg[:off] for seg in segs]
            for ch in chains:
                for a, b in zip(ch[:-1], ch[1:], strict=False):
                    out += [(b, a, 1 / channels), (a, b, 1 / channels)]
            leaders = [ch[0] for ch in chains]
            for t in range(2):
                order = leaders if t == 0 else leaders[::-1]
                for i in range(1, len(order)):
                    parent, child = order[(i - 1) // 2], order[i]
                    out += [(child, parent, 0.5 / channels), (parent, child, 0.5 / channels)]
    if not out:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    src, dst, share = zip(*out, strict=True)
    return np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(share, float)
