"""Where a collective's bytes go: the hops of each communication pattern (NCCL's rings and trees, pipeline
neighbours, all-to-all) and the load they put on every link of the cluster graph, summed per link class.

A link class is (pipeline stages on the link's nodes, from, to): nodes that host the same pipeline stages are
interchangeable, so their links of one name form a class whose load is its busiest link's
(``simulator/costs/collectives.py`` turns a class's seconds per byte into a phase's demand).
"""

from __future__ import annotations

from collections import defaultdict
from functools import cached_property

import numpy as np

from simulator.costs.ecmp import slowdown as ecmp_slowdown
from simulator.hardware.cluster import Cluster
from simulator.hardware.placement import Groups, Placement

LinkClass = tuple[frozenset, str, str]  # (pipeline stages on the link's nodes, from, to)


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


class LinkLoads:
    """Per link class, the seconds per byte the hops of a pattern put on the busiest link of the class."""

    def __init__(self, cluster: Cluster, placement: Placement):
        self.cluster = cluster
        gpn = cluster.gpus_per_node
        self._fabric_stages: dict = {}
        self._leaf_cache: dict[tuple[int, int], tuple[list[frozenset], np.ndarray]] = {}
        # nodes that host the same pipeline stages are interchangeable; others are not (their links carry
        # other stages' traffic at other times), so link classes carry the set of stages of their nodes
        stage = np.asarray(placement.coordinates("pp"))
        if stage.size == cluster.num_nodes * gpn:  # every GPU placed: one row per node
            per_node = stage.reshape(-1, gpn)
            if (per_node.min(axis=1) == per_node.max(axis=1)).all():  # one stage per node (the usual)
                sets = [frozenset((x,)) for x in range(int(stage.max()) + 1)]
                self.node_stages = [sets[x] for x in per_node[:, 0].tolist()]
            else:
                rows, which = np.unique(np.sort(per_node, axis=1), axis=0, return_inverse=True)
                sets = [frozenset(r.tolist()) for r in rows]
                self.node_stages = [sets[i] for i in which.ravel().tolist()]
        else:  # fewer ranks than GPUs (part of a node)
            self.node_stages = [
                frozenset(stage[k * gpn : (k + 1) * gpn].tolist()) for k in range(cluster.num_nodes)
            ]

    @cached_property
    def one_stage_per_node(self) -> bool:
        """Whether every node's GPUs run one pipeline stage (stage_symmetry's condition)."""
        return all(len(n) == 1 for n in set(self.node_stages))

    @cached_property
    def last_stage(self) -> int:
        return max(x for n in set(self.node_stages) for x in n)

    def stages_of(self, link) -> frozenset:
        if link[0] >= 0:
            return self.node_stages[link[0]]
        if link not in self._fabric_stages:
            nodes = self.cluster.link_nodes(link)
            self._fabric_stages[link] = frozenset().union(*(self.node_stages[n] for n in nodes))
        return self._fabric_stages[link]

    def loads(self, hops: tuple[np.ndarray, np.ndarray, np.ndarray]) -> dict[LinkClass, float]:
        """Per link class, the busiest link's seconds per unit of data sent on every hop of ``hops``.

        Equivalent to adding ``share`` to every link of ``cluster.route(src, dst)`` for every hop, but counted
        per piece of the route with numpy (10^5 hops at 16,384 GPUs): a hop inside a node loads the node-local
        path between its two GPUs; a hop across nodes loads its source GPU's path to its nearest NIC, that
        NIC's uplink, the switch path between the two leaves, the destination's NIC downlink and the path to
        its GPU. Loads are summed per node (one array per node-local link name), then the busiest node of each
        set of pipeline stages gives the class."""
        cl = self.cluster
        src, dst, share = hops  # three arrays (``hops``)
        if len(src) == 0:
            return {}
        gpn, nics = cl.gpus_per_node, cl.spec.node.nics
        na, la = np.divmod(src.astype(np.int64), gpn)
        nb, lb = np.divmod(dst.astype(np.int64), gpn)
        share = share.astype(float)
        # per-node sums run over the nodes the hops touch only (one pipeline stage's are an eighth of them)
        mask = np.zeros(cl.num_nodes, dtype=bool)
        mask[na] = True
        mask[nb] = True
        touched = np.flatnonzero(mask)
        nn = len(touched)
        index = np.cumsum(mask) - 1  # a touched node's row
        ra, rb = index[na], index[nb]
        local: dict[tuple[str, str], np.ndarray] = {}  # node-local link -> units per touched node

        def add(links, nodes, weights) -> None:
            w = np.bincount(nodes, weights, minlength=nn)
            for uv in links:
                local[uv] = local[uv] + w if uv in local else w

        inside = na == nb
        if inside.any():
            pair = la * gpn + lb
            for p in np.flatnonzero(np.bincount(pair[inside])).tolist():  # the GPU pairs used
                m = inside & (pair == p)
                add(cl.local_links(f"gpu{p // gpn}", f"gpu{p % gpn}"), ra[m], share[m])
        per_class: dict[LinkClass, float] = {}
        across = ~inside
        if across.any():
            na, la, nb, lb, share = na[across], la[across], nb[across], lb[across], share[across]
            ra, rb = ra[across], rb[across]
            near = np.asarray(cl.nearest_nic, dtype=np.int64)
            for g in range(gpn):
                m = la == g
                if m.any():
                    add(cl.local_links(f"gpu{g}", f"nic{near[g]}"), ra[m], share[m])
                m = lb == g
                if m.any():
                    add(cl.local_links(f"nic{near[g]}", f"gpu{g}"), rb[m], share[m])
            nic_a, nic_b = near[la], near[lb]
            up = np.bincount(ra * nics + nic_a, share, minlength=nn * nics).reshape(nn, nics)
            down = np.bincount(rb * nics + nic_b, share, minlength=nn * nics).reshape(nn, nics)
            nic_bw = cl.link_info((-1, "n0.nic0", cl.leaf_of(0))).bandwidth_Bps
            rail = cl.spec.fabric.rail_optimized
            leaf = [cl.link_class((-1, "n0.nic0", cl.leaf_of(i if rail else 0)))[1] for i in range(nics)]
            self._class_max(per_class, up, [(f"nic{i}", leaf[i]) for i in range(nics)], nic_bw, touched)
            self._class_max(per_class, down, [(leaf[i], f"nic{i}") for i in range(nics)], nic_bw, touched)
            # traffic between leaf switches, then each distinct pair's switch path
            npl, rails = cl.spec.fabric.nodes_per_leaf, (nics if rail else 1)
            leaves = -(-cl.num_nodes // npl) * rails
            leaf_a = (na // npl) * rails + (nic_a if rail else 0)
            leaf_b = (nb // npl) * rails + (nic_b if rail else 0)
            if cl.spine is not None:
                self._star_fabric(per_class, leaf_a, leaf_b, share, leaves, rails)
            else:
                self._fabric_by_pairs(per_class, leaf_a, leaf_b, share, leaves)
        if local:
            names = list(local)
            bandwidth = np.array([cl.link_info((0, u, v)).bandwidth_Bps for u, v in names])
            units = np.stack([local[x] for x in names], axis=1)
            self._class_max(per_class, units, names, bandwidth, touched)
        return per_class

    def _fabric_by_pairs(self, per_class: dict, leaf_a, leaf_b, share, leaves: int) -> None:
        """Each distinct pair of leaf switches' units added along the switch path between them."""
        cl = self.cluster
        pairs, inverse = np.unique(leaf_a * leaves + leaf_b, return_inverse=True)
        fabric: dict = defaultdict(float)
        for p, units in zip(pairs.tolist(), np.bincount(inverse, share).tolist(), strict=True):
            for link in cl.switch_path(*(cl.leaf_of(x) for x in divmod(p, leaves))):
                fabric[link] += units
        for link, units in fabric.items():
            c = (self.stages_of(link), *cl.link_class(link))
            s = units / cl.link_info(link).bandwidth_Bps
            if s > per_class.get(c, 0.0):
                per_class[c] = s

    def _star_fabric(self, per_class: dict, leaf_a, leaf_b, share, leaves: int, rails: int) -> None:
        """The same for a two-level fat tree (every leaf under one spine): a unit between two leaves climbs its
        source leaf's uplink and descends the destination's downlink, so each leaf's up and down loads are two
        sums over the units, whatever the number of leaf pairs. Leaves of one rail whose nodes host the same
        pipeline stages form a class; its busiest leaf gives the load."""
        cl = self.cluster
        cross = leaf_a != leaf_b
        if not cross.any():
            return
        up = np.bincount(leaf_a[cross], share[cross], minlength=leaves)
        down = np.bincount(leaf_b[cross], share[cross], minlength=leaves)
        fab = cl.spec.fabric
        if fab.routing == "ecmp":
            # each hop is a connection of qps_per_connection flows (a sampled all-to-all rotation stands for
            # ``share`` of them); a leaf's flows hash onto its uplinks, and the busiest sets the pace
            uplinks = max(
                1, round(fab.nodes_per_leaf * (1 if rails > 1 else cl.spec.node.nics) / fab.oversubscription)
            )
            flows = np.maximum(share[cross], 1.0) * fab.qps_per_connection
            for units, leaf in ((up, leaf_a[cross]), (down, leaf_b[cross])):
                per_leaf = np.rint(np.bincount(leaf, flows, minlength=leaves))
                counts, where = np.unique(per_leaf, return_inverse=True)
                units *= np.array([ecmp_slowdown(c, uplinks) for c in counts.tolist()])[where.ravel()]
        sets, key = self._leaf_classes(leaves, rails)
        bandwidth = cl.link_info((-1, cl.leaf_of(0), cl.spine)).bandwidth_Bps
        for units, outward in ((up, True), (down, False)):
            peak = np.zeros(len(sets) * rails)
            np.maximum.at(peak, key, units / bandwidth)
            for i in np.nonzero(peak)[0].tolist():
                leaf_class = cl.link_class((-1, cl.leaf_of(i % rails), cl.spine))
                link = leaf_class if outward else leaf_class[::-1]
                c = (sets[i // rails], *link)
                per_class[c] = max(per_class.get(c, 0.0), float(peak[i]))

    def _leaf_classes(self, leaves: int, rails: int) -> tuple[list[frozenset], np.ndarray]:
        """The distinct stage sets of the leaves' nodes, and each leaf's class index (set x rails + rail); kept
        on the object (a functools cache on the method would keep every simulation's object alive)."""
        if (leaves, rails) in self._leaf_cache:
            return self._leaf_cache[(leaves, rails)]
        npl, nn = self.cluster.spec.fabric.nodes_per_leaf, self.cluster.num_nodes
        sets: dict[frozenset, int] = {}
        key = np.zeros(leaves, dtype=np.int64)
        for leaf in range(leaves):
            group, rail = divmod(leaf, rails)
            nodes = self.node_stages[group * npl : min((group + 1) * npl, nn)]
            stages = frozenset().union(*nodes)
            key[leaf] = sets.setdefault(stages, len(sets)) * rails + rail
        self._leaf_cache[(leaves, rails)] = list(sets), key
        return self._leaf_cache[(leaves, rails)]

    @cached_property
    def _stage_ids(self) -> tuple[list[frozenset], np.ndarray]:
        """The distinct stage sets of the nodes, and each node's set index."""
        sets = sorted(set(self.node_stages), key=sorted)
        index = {x: i for i, x in enumerate(sets)}
        return sets, np.array([index[x] for x in self.node_stages], dtype=np.int64)

    def _class_max(self, per_class: dict, units: np.ndarray, links: list, bandwidth_Bps, nodes) -> None:
        """For each set of pipeline stages and each of ``links`` (the columns of ``units``, one row per node of
        ``nodes``), the busiest node's seconds per unit."""
        sets, set_of = self._stage_ids
        ids = set_of[nodes]
        order = np.argsort(ids, kind="stable")
        ranked = ids[order]  # sorted: each set's rows start where the id changes (np.unique would sort again)
        starts = np.flatnonzero(np.concatenate(([True], ranked[1:] != ranked[:-1])))
        present = ranked[starts]
        peak = np.maximum.reduceat(units[order], starts, axis=0) / bandwidth_Bps
        for i, j in zip(*np.nonzero(peak), strict=True):
            c = (sets[present[i]], *links[j])
            per_class[c] = max(per_class.get(c, 0.0), float(peak[i, j]))
