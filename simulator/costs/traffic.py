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

from simulator.hardware.cluster import Cluster
from simulator.hardware.placement import Placement

LinkClass = tuple[frozenset, str, str]  # (pipeline stages on the link's nodes, from, to)


# An all-to-all's n(n-1) pairs are n-1 rotations (rank i -> rank i+s mod n), each a permutation. Up to this many
# ranks every rotation is taken; beyond it (1-bit Adam's momentum all-to-all over a 16,384-GPU data-parallel
# group has 2.7e8 pairs) the rotations that can stay on a node are taken and this many others, evenly spaced,
# stand for the rest.
ALL_PAIRS_EXACT = 256
SAMPLED_ROTATIONS = 16


def all_pairs(groups, gpus_per_node: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src GPUs, dst GPUs, shares) of an all-to-all over every group: each rank sends one unit (its chunk for
    that peer) to each of the n-1 others.

    A group of more than ALL_PAIRS_EXACT ranks keeps the rotations |s| < c exactly (c: the most ranks of the
    group on one node, the only rotations with pairs inside a node when the group fills nodes in order) and
    SAMPLED_ROTATIONS of the others, each weighted by the rotations it stands for. Every rank then still sends
    n-1 units, n-c of them off its node, and receives as many: NVLink, GPU-to-NIC and NIC loads are the exact
    ones; only how the cross-node units spread over leaf-switch pairs is sampled."""
    by_size: dict[int, list] = defaultdict(list)
    for grp in groups:
        by_size[len(grp)].append(grp)
    src, dst, share = [], [], []
    for n, same in by_size.items():
        if n < 2:
            continue
        g = np.asarray(same, dtype=np.int64)
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


def hops(kind: str, groups, gpus_per_node: int, nics: int):
    """(src GPU, dst GPU, share of the per-step chunk) for every hop of every group of a collective whose
    communication pattern is ``kind``: ``ring`` (NCCL's rings, one per NIC rail), ``tree`` (NCCL's double binary
    tree across nodes, chains inside them), ``pairs`` (pipeline neighbours), as a list; ``all_pairs``
    (all-to-all) as three arrays (see all_pairs)."""
    if kind == "all_pairs":
        return all_pairs(groups, gpus_per_node)
    hops: list[tuple[int, int, float]] = []
    gpn = gpus_per_node
    for grp in groups:
        by_node: dict[int, list[int]] = defaultdict(list)
        for g in sorted(grp):
            by_node[g // gpn].append(g)
        segs = list(by_node.values())
        if kind == "pairs":  # send/recv: rank i -> rank i+1 of the group (pipeline neighbours)
            hops += [(a, b, 1.0) for a, b in zip(grp[:-1], grp[1:], strict=False)]
        elif kind == "ring":
            # NCCL runs one ring per NIC rail. Ring c enters and leaves every node on the same rail: it
            # crosses even nodes from GPU off to GPU off-1 and odd nodes back from off-1 to off.
            k = len(segs[0])
            channels = min(k, nics) if len(segs) > 1 else 1
            for c in range(channels):
                off = c * k // channels
                order = []
                for j, seg in enumerate(segs):
                    rot = seg[off:] + seg[:off]
                    order += rot if j % 2 == 0 else rot[::-1]
                hops += [(order[i], order[(i + 1) % len(order)], 1 / channels) for i in range(len(order))]
        elif kind == "tree":
            k = len(segs[0])
            channels = min(k, nics)
            for c in range(channels):
                off = c * k // channels
                chains = [seg[off:] + seg[:off] for seg in segs]
                for ch in chains:  # reduce up the chain and broadcast back down
                    for a, b in zip(ch[:-1], ch[1:], strict=False):
                        hops += [(b, a, 1 / channels), (a, b, 1 / channels)]
                leaders = [ch[0] for ch in chains]
                for t in range(2):  # two mirrored binary trees, each with half the data
                    order = leaders if t == 0 else leaders[::-1]
                    for i in range(1, len(order)):
                        parent, child = order[(i - 1) // 2], order[i]
                        hops += [(child, parent, 0.5 / channels), (parent, child, 0.5 / channels)]
        else:
            raise ValueError(kind)
    return hops


class LinkLoads:
    """Per link class, the seconds per byte the hops of a pattern put on the busiest link of the class."""

    def __init__(self, cluster: Cluster, placement: Placement):
        self.cluster = cluster
        gpn = cluster.gpus_per_node
        self._fabric_stages: dict = {}
        # nodes that host the same pipeline stages are interchangeable; others are not (their links carry
        # other stages' traffic at other times), so link classes carry the set of stages of their nodes
        stage = placement.coordinates("pp")
        memo: dict[tuple, frozenset] = {}
        self.node_stages = []
        for k in range(cluster.num_nodes):
            here = tuple(np.unique(stage[k * gpn : (k + 1) * gpn]).tolist())
            self.node_stages.append(memo.setdefault(here, frozenset(here)))

    def stages_of(self, link) -> frozenset:
        if link[0] >= 0:
            return self.node_stages[link[0]]
        if link not in self._fabric_stages:
            nodes = self.cluster.link_nodes(link)
            self._fabric_stages[link] = frozenset().union(*(self.node_stages[n] for n in nodes))
        return self._fabric_stages[link]

    def loads(self, hops) -> dict[LinkClass, float]:
        """Per link class, the busiest link's seconds per unit of data sent on every hop of ``hops``.

        Equivalent to adding ``share`` to every link of ``cluster.route(src, dst)`` for every hop, but counted
        per piece of the route with numpy (10^5 hops at 16,384 GPUs): a hop inside a node loads the node-local
        path between its two GPUs; a hop across nodes loads its source GPU's path to its nearest NIC, that
        NIC's uplink, the switch path between the two leaves, the destination's NIC downlink and the path to
        its GPU. Loads are summed per node (one array per node-local link name), then the busiest node of each
        set of pipeline stages gives the class."""
        cl = self.cluster
        if isinstance(hops, tuple):  # arrays (all_pairs)
            src, dst, share = hops
        elif hops:
            src, dst, share = (np.asarray(x) for x in zip(*hops, strict=True))
        else:
            return {}
        if len(src) == 0:
            return {}
        gpn, nn, nics = cl.gpus_per_node, cl.num_nodes, cl.spec.node.nics
        na, la = np.divmod(src.astype(np.int64), gpn)
        nb, lb = np.divmod(dst.astype(np.int64), gpn)
        share = share.astype(float)
        local: dict[tuple[str, str], np.ndarray] = {}  # node-local link -> units per node

        def add(links, nodes, weights) -> None:
            w = np.bincount(nodes, weights, minlength=nn)
            for uv in links:
                local[uv] = local[uv] + w if uv in local else w

        inside = na == nb
        if inside.any():
            pair = la * gpn + lb
            for p in np.unique(pair[inside]).tolist():
                m = inside & (pair == p)
                add(cl.local_links(f"gpu{p // gpn}", f"gpu{p % gpn}"), na[m], share[m])
        per_class: dict[LinkClass, float] = {}
        across = ~inside
        if across.any():
            na, la, nb, lb, share = na[across], la[across], nb[across], lb[across], share[across]
            near = np.asarray(cl.nearest_nic, dtype=np.int64)
            for g in range(gpn):
                m = la == g
                if m.any():
                    add(cl.local_links(f"gpu{g}", f"nic{near[g]}"), na[m], share[m])
                m = lb == g
                if m.any():
                    add(cl.local_links(f"nic{near[g]}", f"gpu{g}"), nb[m], share[m])
            nic_a, nic_b = near[la], near[lb]
            up = np.bincount(na * nics + nic_a, share, minlength=nn * nics).reshape(nn, nics)
            down = np.bincount(nb * nics + nic_b, share, minlength=nn * nics).reshape(nn, nics)
            nic_bw = cl.link_info((-1, "n0.nic0", cl.leaf_of(0))).bandwidth_Bps
            rail = cl.spec.fabric.rail_optimized
            leaf = [cl.link_class((-1, "n0.nic0", cl.leaf_of(i if rail else 0)))[1] for i in range(nics)]
            self._class_max(per_class, up, [(f"nic{i}", leaf[i]) for i in range(nics)], nic_bw)
            self._class_max(per_class, down, [(leaf[i], f"nic{i}") for i in range(nics)], nic_bw)
            # traffic between leaf switches, then each distinct pair's switch path
            npl, rails = cl.spec.fabric.nodes_per_leaf, (nics if rail else 1)
            leaves = -(-nn // npl) * rails
            leaf_a = (na // npl) * rails + (nic_a if rail else 0)
            leaf_b = (nb // npl) * rails + (nic_b if rail else 0)
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
        if local:
            names = list(local)
            bandwidth = np.array([cl.link_info((0, u, v)).bandwidth_Bps for u, v in names])
            self._class_max(per_class, np.stack([local[x] for x in names], axis=1), names, bandwidth)
        return per_class

    @cached_property
    def _stage_index(self) -> tuple[list[frozenset], np.ndarray, np.ndarray]:
        """The distinct stage sets of the nodes, the nodes ordered by set, and where each set starts."""
        sets = sorted(set(self.node_stages), key=sorted)
        index = {x: i for i, x in enumerate(sets)}
        ids = np.array([index[x] for x in self.node_stages], dtype=np.int64)
        order = np.argsort(ids, kind="stable")
        return sets, order, np.searchsorted(ids[order], np.arange(len(sets)))

    def _class_max(self, per_class: dict, units: np.ndarray, links: list, bandwidth_Bps) -> None:
        """For each set of pipeline stages and each of ``links`` (the columns of ``units``, one row per node),
        the busiest node's seconds per unit."""
        sets, order, starts = self._stage_index
        peak = np.maximum.reduceat(units[order], starts, axis=0) / bandwidth_Bps
        for i, j in zip(*np.nonzero(peak), strict=True):
            c = (sets[i], *links[j])
            per_class[c] = max(per_class.get(c, 0.0), float(peak[i, j]))
