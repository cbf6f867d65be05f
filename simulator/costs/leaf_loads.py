"""The fabric's share of a pattern's loads (``costs/traffic.py``, ``LinkLoads``): per pair of leaf switches along
the switch path between them, or on a two-level fat tree per leaf's uplink and downlink (ECMP's hashing of flows
onto uplinks included, ``costs/ecmp.py``), the busiest leaf of each class of leaves."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from simulator.costs.ecmp import slowdown as ecmp_slowdown
from simulator.costs.node_sums import LEAF_BLOCK, Sums, index_dtype


def fabric_by_pairs(links, per_class: dict, sums: Sums) -> None:
    """Each distinct pair of leaf switches' units added along the switch path between them."""
    cl = links.cluster
    fabric: dict = defaultdict(float)
    for p, units in sums.leaf_pairs.items():
        for link in cl.switch_path(*(cl.leaf_of(x) for x in divmod(p, links._leaf_grid[0]))):
            fabric[link] += units
    for link, units in fabric.items():
        c = (links.stages_of(link), *cl.link_class(link))
        s = units / cl.link_info(link).bandwidth_Bps
        if s > per_class.get(c, 0.0):
            per_class[c] = s


def star_fabric(links, per_class: dict, sums: Sums) -> None:
    """The same for a two-level fat tree (every leaf under one spine): a unit between two leaves climbs its
    source leaf's uplink and descends the destination's downlink, so each leaf's up and down loads are two
    sums over the units, whatever the number of leaf pairs. Leaves of one rail whose nodes host the same
    pipeline stages form a class; its busiest leaf gives the load."""
    cl = links.cluster
    if not sums.leaf_units:
        return
    leaves, rails = links._leaf_grid
    fab = cl.spec.fabric
    # a leaf's flows hash onto its uplinks, and the busiest sets the pace
    uplinks = max(
        1, round(fab.nodes_per_leaf * (1 if rails > 1 else cl.spec.node.nics) / fab.oversubscription)
    )
    sets, key = leaf_classes(links, leaves, rails)
    bandwidth = cl.link_info((-1, cl.leaf_of(0), cl.spine)).bandwidth_Bps
    for name, outward in (("up", True), ("down", False)):
        peak = np.zeros(len(sets) * rails)
        for b, units in sorted(sums.leaf_units[name].items()):
            lo = b * LEAF_BLOCK
            keys = key[lo : lo + LEAF_BLOCK]  # the last block may reach past the last leaf
            units = units[: len(keys)]
            if fab.routing == "ecmp":
                counts, where = np.unique(np.rint(sums.leaf_flows[name][b][: len(keys)]), return_inverse=True)
                units = units * np.array([ecmp_slowdown(c, uplinks) for c in counts.tolist()])[where.ravel()]
            np.maximum.at(peak, keys, units / bandwidth)
        for i in np.nonzero(peak)[0].tolist():
            leaf_class = cl.link_class((-1, cl.leaf_of(i % rails), cl.spine))
            link = leaf_class if outward else leaf_class[::-1]
            c = (sets[i // rails], *link)
            per_class[c] = max(per_class.get(c, 0.0), float(peak[i]))


def leaf_classes(links, leaves: int, rails: int) -> tuple[list[frozenset], np.ndarray]:
    """The distinct stage sets of the leaves' nodes, and each leaf's class index (set x rails + rail); kept
    on the object (a functools cache on the method would keep every simulation's object alive)."""
    if (leaves, rails) in links._leaf_cache:
        return links._leaf_cache[(leaves, rails)]
    npl, nn = links.cluster.spec.fabric.nodes_per_leaf, links.cluster.num_nodes
    starts = np.arange(0, nn, npl)  # each group of nodes under one leaf per rail
    code = np.minimum.reduceat(links.node_set, starts).astype(np.int64)
    # a group's stages are its nodes' where they all host the same (the usual), else their union
    named, index = list(links.stage_sets), {x: i for i, x in enumerate(links.stage_sets)}
    for g in np.flatnonzero(code != np.maximum.reduceat(links.node_set, starts)).tolist():
        nodes = links.node_set[g * npl : min((g + 1) * npl, nn)].tolist()
        union = frozenset().union(*(links.stage_sets[i] for i in nodes))
        if union not in index:
            index[union] = len(named)
            named.append(union)
        code[g] = index[union]
    # the distinct sets numbered in the order the leaves first show them
    distinct, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(distinct), dtype=np.int64)
    rank[order] = np.arange(len(distinct))
    key = np.repeat(rank[inverse.ravel()], rails) * rails + np.tile(np.arange(rails), len(starts))
    key = key.astype(index_dtype(len(distinct) * rails))  # a leaf each: 51 KiB in int64 at 131,072 GPUs
    links._leaf_cache[(leaves, rails)] = [named[c] for c in distinct[order].tolist()], key
    return links._leaf_cache[(leaves, rails)]
