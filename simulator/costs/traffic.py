"""Where a collective's bytes go: the load the hops of a communication pattern (``costs/hops.py``: NCCL's rings
and trees, pipeline neighbours, all-to-all) put on every link of the cluster graph, summed per link class.

A link class is (pipeline stages on the link's nodes, from, to): nodes that host the same pipeline stages are
interchangeable, so their links of one name form a class whose load is its busiest link's
(``simulator/costs/collectives.py`` turns a class's seconds per byte into a phase's demand).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from simulator.costs.hops import hops as pattern_hops
from simulator.costs.leaf_loads import fabric_by_pairs, star_fabric
from simulator.costs.node_sums import Peaks, Sums, index_dtype
from simulator.costs.rails import add_rail_hops, rail_chunks, rail_families
from simulator.hardware.cluster import Cluster
from simulator.hardware.placement import Groups, Placement

LinkClass = tuple[frozenset, str, str]  # (pipeline stages on the link's nodes, from, to)


# Hops summed at a time by LinkLoads.loads: its temporaries are about 200 bytes per hop
LOADS_CHUNK = 1 << 13
# Nodes no later chunk touches, read into their link classes together (their sums: 128 bytes a node and GPU)
CLOSE_ROWS = 1 << 10
# ... and multiplied into their links this many at a time: a [node x link] block of units, and its copies, for
# each (at 1,024 nodes and a DGX's ~40 links, 320 KiB each: the heap's peak at 131,072 GPUs)
NODE_BLOCK = 1 << 8


# Link loads of every pattern found so far, by the cluster's spec and node count, the placement, the pattern's kind
# and its groups: they depend on nothing else, and the runs of one process (a sweep, plan's confirmations, warm
# simulate() calls) cost the same patterns on the same cluster again. Emptied when it grows past _SHARED_MAX.
_SHARED: dict[tuple, dict] = {}
_SHARED_MAX = 4096


class LinkLoads:
    """Per link class, the seconds per byte the hops of a pattern put on the busiest link of the class."""

    def __init__(self, cluster: Cluster, placement: Placement):
        self.cluster = cluster
        self.placement = placement
        gpn = cluster.gpus_per_node
        self._fabric_stages: dict = {}
        self._leaf_cache: dict[tuple[int, int], tuple[list[frozenset], np.ndarray]] = {}
        self._maps: dict[tuple, tuple] = {}  # _node_links' columns by the node-local links a pattern used
        # nodes that host the same pipeline stages are interchangeable; others are not (their links carry
        # other stages' traffic at other times), so link classes carry the set of stages of their nodes:
        # ``stage_sets`` the distinct sets (in sorted order), ``node_set`` each node's index into them
        if placement.world_size == cluster.num_nodes * gpn:  # every GPU placed: one row per node
            # each node's first and last GPU's stage, a few thousand nodes at a time (not every GPU at once)
            block = max(1, (1 << 12) // gpn)
            blocks = [
                self._stage_range(placement, np.arange(n0, min(n0 + block, cluster.num_nodes)) * gpn, gpn)
                for n0 in range(0, cluster.num_nodes, block)
            ]
            # one stage per node (the usual): each node's index among the stages present
            if all(ok for _, ok in blocks):
                first = np.concatenate([f for f, _ in blocks])
                present = np.flatnonzero(np.bincount(first))
                self.stage_sets = [frozenset((x,)) for x in present.tolist()]
                index = np.zeros(placement.pp, dtype=index_dtype(len(present)))
                index[present] = np.arange(len(present))
                self.node_set = index[first]
                return
            stage = placement.coordinates("pp")
            rows, which = np.unique(np.sort(stage.reshape(-1, gpn), axis=1), axis=0, return_inverse=True)
            of_node = [frozenset(rows[i].tolist()) for i in which.ravel().tolist()]
        else:  # fewer ranks than GPUs (part of a node)
            stage = placement.coordinates("pp")
            of_node = [frozenset(stage[k * gpn : (k + 1) * gpn].tolist()) for k in range(cluster.num_nodes)]
        self.stage_sets = sorted(set(of_node), key=sorted)
        index = {x: i for i, x in enumerate(self.stage_sets)}
        self.node_set = np.array([index[x] for x in of_node], dtype=index_dtype(len(self.stage_sets)))

    @staticmethod
    def _stage_range(placement: Placement, starts: np.ndarray, gpn: int) -> tuple[np.ndarray, bool]:
        """(stage of the first GPU of each node starting at GPU ``starts``, whether all of each node's GPUs
        share it)."""
        stage = placement.coordinates_of(starts[:, None] + np.arange(gpn), "pp")
        narrow = index_dtype(placement.pp)  # kept for every node until all are read: 1-2 bytes each
        return stage[:, 0].astype(narrow), bool((stage.min(axis=1) == stage.max(axis=1)).all())

    @cached_property
    def _leaf_grid(self) -> tuple[int, int]:
        """(leaf switches, rails): a rail-optimized fabric has one leaf per NIC rail for every group of nodes."""
        cl = self.cluster
        rails = cl.spec.node.nics if cl.spec.fabric.rail_optimized else 1
        return -(-cl.num_nodes // cl.spec.fabric.nodes_per_leaf) * rails, rails

    @cached_property
    def one_stage_per_node(self) -> bool:
        """Whether every node's GPUs run one pipeline stage (stage_symmetry's condition)."""
        return all(len(n) == 1 for n in self.stage_sets)

    @cached_property
    def last_stage(self) -> int:
        return max(x for n in self.stage_sets for x in n)

    def stages_of(self, link) -> frozenset:
        if link[0] >= 0:
            return self.stage_sets[self.node_set[link[0]]]
        if link not in self._fabric_stages:
            nodes = self.cluster.link_nodes(link)
            sets = {self.stage_sets[i] for i in self.node_set[list(nodes)].tolist()}
            self._fabric_stages[link] = frozenset().union(*sets)
        return self._fabric_stages[link]

    def loads(self, hops: tuple[np.ndarray, np.ndarray, np.ndarray]) -> dict[LinkClass, float]:
        """Per link class, the busiest link's seconds per unit of data sent on every hop of ``hops`` (three
        arrays: source GPUs, destination GPUs, shares).

        Equivalent to adding ``share`` to every link of ``cluster.route(src, dst)`` for every hop, but counted
        per piece of the route with numpy (10^5 hops at 16,384 GPUs): a hop inside a node loads the node-local
        path between its two GPUs; a hop across nodes loads its source GPU's path to its nearest NIC, that
        NIC's uplink, the switch path between the two leaves, the destination's NIC downlink and the path to
        its GPU. Loads are summed per node, then the busiest node of each set of pipeline stages gives the
        class. The hops are summed LOADS_CHUNK at a time, so the temporaries (about 200 bytes a hop) stay
        bounded whatever the pattern's size."""
        src, dst, share = hops
        if len(src) == 0:
            return {}
        gpn = self.cluster.gpus_per_node
        slices = [slice(lo, lo + LOADS_CHUNK) for lo in range(0, len(src), LOADS_CHUNK)]
        return self._loads(
            len(slices),
            (np.concatenate((src[c], dst[c])) // gpn for c in slices),
            ((src[c], dst[c], share[c]) for c in slices),
        )

    def shared_group_loads(self, kind: str, groups) -> dict[LinkClass, float]:
        """``group_loads``, kept for every later run of this process on the same cluster and placement (_SHARED):
        the caller must not change what it returns."""
        key = (*self._cluster_key, self.placement, kind, groups)
        if key not in _SHARED:
            if len(_SHARED) >= _SHARED_MAX:
                _SHARED.clear()
            _SHARED[key] = self.group_loads(kind, groups)
        return _SHARED[key]

    @cached_property
    def _cluster_key(self) -> tuple[str, int]:
        """What the cluster's links are built from (``Cluster(spec, num_nodes)``), as a key."""
        return self.cluster.spec.model_dump_json(), self.cluster.num_nodes

    def group_loads(self, kind: str, groups) -> dict[LinkClass, float]:
        """``loads(hops(kind, groups))``, the hops made a few groups at a time (a group's hops depend on its
        ranks alone): at 131,072 GPUs the pipeline neighbours' 114,688 hops took 2.6 MiB at once. An
        all-to-all's sampled rotations follow its first group (``hops.all_pairs``), so it is made whole."""
        cl = self.cluster
        gpn, nics = cl.gpus_per_node, cl.spec.node.nics
        if kind == "all_pairs" or not isinstance(groups, Groups) or len(groups) == 0:
            return self.loads(pattern_hops(kind, groups, gpn, nics))
        # families of groups alike but for their GPU and rail: one group of each, one column per node
        families = rail_families(groups, gpn)
        if families is not None:
            chunks, nodes, count = rail_chunks(kind, families[0], gpn)
            return self._loads(count, nodes, chunks, families[1])
        # groups at a time: a ring or pipeline pattern has a hop per rank and rail, a tree four per node
        per = max(1, LOADS_CHUNK // (groups.size * (4 if kind == "tree" else 1)))
        spans = range(0, len(groups), per)
        return self._loads(
            len(spans),
            (groups.array[lo : lo + per] // gpn for lo in spans),  # every rank of a group is on some hop
            (pattern_hops(kind, groups[lo : lo + per], gpn, nics) for lo in spans),
        )

    def _loads(self, count: int, chunk_nodes, chunks, rails: tuple | None = None) -> dict[LinkClass, float]:
        """``loads`` of the hops in ``chunks`` (``count`` of them, each three arrays), ``chunk_nodes`` the nodes
        each chunk may touch.
        A node's sums are read into its link classes after the last chunk that touches it, and dropped: the
        per-node arrays hold the nodes a few chunks touch, not every node of the pattern (a pipeline pattern at
        131,072 GPUs touches all 16,384 nodes: 3 MiB of sums at once)."""
        cl = self.cluster
        last = np.full(cl.num_nodes, -1, dtype=index_dtype(count))  # the last chunk that touches each node
        for i, nodes in enumerate(chunk_nodes):
            last[nodes.ravel()] = i
        touched = int(np.count_nonzero(last >= 0))
        ecmp = cl.spine is not None and cl.spec.fabric.routing == "ecmp"
        row = np.full(cl.num_nodes, -1, dtype=index_dtype(cl.num_nodes))
        sums = Sums(1 if rails else cl.gpus_per_node, row, flows=ecmp, rails=rails)
        found = Peaks(len(self.stage_sets))
        for i, (src, dst, share) in enumerate(chunks):
            for lo in range(0, len(src), LOADS_CHUNK):
                c = slice(lo, lo + LOADS_CHUNK)
                if rails:
                    add_rail_hops(self, sums, src[c], dst[c], share[c])
                else:
                    self._add(sums, src[c], dst[c], share[c])
            done = last[sums.nodes] <= i  # no later chunk touches them: read them, a good many at a time
            if np.count_nonzero(done) >= CLOSE_ROWS:
                self._node_links(found, sums, done)
                sums.close(done)
        if len(sums.nodes):
            self._node_links(found, sums, np.ones(len(sums.nodes), dtype=bool))
        per_class: dict[LinkClass, float] = {}
        if sums.across:
            if cl.spine is not None:
                star_fabric(self, per_class, sums)
            else:
                fabric_by_pairs(self, per_class, sums)
        # the node links' classes in the order one pass over every touched node at once added them (links in
        # batches of as many as a 512 KiB [node x link] array held, each stage set's in turn), so nothing
        # downstream sees another order; links that carried nothing are left out
        paths = [c[0] for c in self._gpu_paths] if sums.across else []
        known = set(paths)
        at = {uv: j for j, uv in enumerate([*paths, *(uv for uv in sums.local if uv not in known)])}
        sets = self.stage_sets
        per = max(1, (1 << 16) // max(1, touched))
        links = sorted((uv for uv in found.column if uv in at), key=at.__getitem__)
        for lo in range(0, len(links), per):
            batch = links[lo : lo + per]
            values = found.values[:, [found.column[uv] for uv in batch]]
            for x, j in zip(*np.nonzero(values), strict=True):
                c = (sets[x], *batch[j])
                per_class[c] = max(per_class.get(c, 0.0), float(values[x, j]))
        return per_class

    def _columns(self, sums: Sums):
        """Every NIC link and node-local link a pattern loads: (link, bandwidth, GPUs whose traffic off the node
        it carries, GPUs whose traffic onto it), the GPUs' paths to their NICs first."""
        cl = self.cluster
        known = {c[0] for c in self._gpu_paths}
        local = [(uv, cl.link_info((0, *uv)).bandwidth_Bps, [], []) for uv in sums.local if uv not in known]
        return [*self._gpu_paths, *local]

    def _node_links(self, found: Peaks, sums: Sums, done: np.ndarray) -> None:
        """Each link of the nodes where ``done`` holds: units from hops inside the node, plus those of the GPUs
        whose traffic off or onto the node crosses it (a [GPU x link] map of which GPUs' paths use it); the
        busiest node of each stage set kept in ``found``. CLOSE_ROWS nodes at a time."""
        # the node-local links used so far (the same for most calls of a pattern), and the families' GPUs
        key = (tuple(sums.local), sums.rails)
        if key not in self._maps:
            columns = self._columns(sums)
            gpn = self.cluster.gpus_per_node
            off_map, onto_map = np.zeros((gpn, len(columns))), np.zeros((gpn, len(columns)))
            for j, (_, _, out, into) in enumerate(columns):
                off_map[out, j], onto_map[into, j] = 1.0, 1.0
            if sums.rails:  # one column stands for each of the families' GPUs: the links their paths use
                rows = list(sums.rails)
                off_map, onto_map = off_map[rows].sum(0, keepdims=True), onto_map[rows].sum(0, keepdims=True)
            local = [(j, c[0]) for j, c in enumerate(columns) if c[0] in sums.local]
            self._maps[key] = (
                [c[0] for c in columns],
                np.array([c[1] for c in columns]),
                off_map,
                onto_map,
                local,
            )
        links, bandwidth, off_map, onto_map, local = self._maps[key]
        rows = np.flatnonzero(done)
        for at in range(0, len(rows), NODE_BLOCK):
            take = rows[at : at + NODE_BLOCK]
            units = sums.out[take] @ off_map + sums.into[take] @ onto_map
            for j, uv in local:
                units[:, j] += sums.local[uv][take]
            self._class_max(found, units, links, bandwidth, sums.nodes[take])

    @cached_property
    def _gpu_paths(self) -> list[tuple[tuple[str, str], float, list[int], list[int]]]:
        """(link, bandwidth, GPUs whose traffic off the node it carries, GPUs whose traffic onto the node) for
        every NIC link (a NIC and its leaf, each way) and node-local link between a GPU and its nearest NIC."""
        cl = self.cluster
        near = cl.nearest_nic
        rail = cl.spec.fabric.rail_optimized
        nic_bw = cl.link_info((-1, "n0.nic0", cl.leaf_of(0))).bandwidth_Bps
        paths: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
        bandwidth: dict[tuple[str, str], float] = {}
        for i in range(cl.spec.node.nics):
            leaf = cl.link_class((-1, "n0.nic0", cl.leaf_of(i if rail else 0)))[1]
            gpus = [g for g in range(cl.gpus_per_node) if near[g] == i]
            paths[(f"nic{i}", leaf)], paths[(leaf, f"nic{i}")] = (gpus, []), ([], gpus)
            bandwidth[(f"nic{i}", leaf)] = bandwidth[(leaf, f"nic{i}")] = nic_bw
        for g in range(cl.gpus_per_node):
            for uv in cl.local_links(f"gpu{g}", f"nic{near[g]}"):
                paths.setdefault(uv, ([], []))[0].append(g)
            for uv in cl.local_links(f"nic{near[g]}", f"gpu{g}"):
                paths.setdefault(uv, ([], []))[1].append(g)
        return [
            (uv, bandwidth[uv] if uv in bandwidth else cl.link_info((0, *uv)).bandwidth_Bps, out, into)
            for uv, (out, into) in paths.items()
            if out or into
        ]

    def _add(self, sums: Sums, src: np.ndarray, dst: np.ndarray, share: np.ndarray) -> None:
        """Add one chunk of hops to the per-node, per-GPU and per-leaf sums."""
        cl = self.cluster
        gpn = cl.gpus_per_node
        na, la = np.divmod(src.astype(np.int64, copy=False), gpn)
        nb, lb = np.divmod(dst.astype(np.int64, copy=False), gpn)
        share = share.astype(float, copy=False)
        sums.open(np.concatenate((na, nb)))
        nn = len(sums.nodes)
        ra, rb = sums.row[na].astype(np.int32), sums.row[nb].astype(np.int32)  # rows x GPUs overflow int16
        inside = na == nb
        if inside.any():
            pair = la * gpn + lb
            for p in np.flatnonzero(np.bincount(pair[inside])).tolist():  # the GPU pairs used
                m = inside & (pair == p)
                w = np.bincount(ra[m], share[m], minlength=nn)
                for uv in cl.local_links(f"gpu{p // gpn}", f"gpu{p % gpn}"):
                    if uv in sums.local:
                        sums.local[uv] += w
                    else:
                        sums.local[uv] = w.copy()
        across = ~inside
        if not across.any():
            return
        na, la, nb, lb, share = na[across], la[across], nb[across], lb[across], share[across]
        sums.across = True
        # added in place (a bincount per chunk would be two more [node x GPU] arrays)
        np.add.at(sums.out.reshape(-1), ra[across] * gpn + la, share)
        np.add.at(sums.into.reshape(-1), rb[across] * gpn + lb, share)
        near = np.asarray(cl.nearest_nic, dtype=np.int64)
        nic_a, nic_b = near[la], near[lb]
        # traffic between leaf switches: per leaf (a two-level fat tree) or per pair of leaves
        npl, rail = cl.spec.fabric.nodes_per_leaf, cl.spec.fabric.rail_optimized
        leaves, rails = self._leaf_grid
        leaf_a = (na // npl) * rails + (nic_a if rail else 0)
        leaf_b = (nb // npl) * rails + (nic_b if rail else 0)
        sums.add_fabric(
            leaf_a, leaf_b, share, leaves, cl.spine is not None, cl.spec.fabric.qps_per_connection
        )

    def _class_max(self, found: Peaks, units: np.ndarray, links: list, bandwidth_Bps, nodes) -> None:
        """For each set of pipeline stages and each of ``links`` (the columns of ``units``, one row per node of
        ``nodes``), the busiest node's seconds per unit, into ``found``."""
        ids = self.node_set[nodes]
        if (ids[1:] >= ids[:-1]).all():  # nodes in stage order already (stages outermost): no sorted copy
            ranked = ids
        else:
            order = np.argsort(ids, kind="stable")
            ranked, units = ids[order], units[order]
        # each set's rows start where the id changes (np.unique would sort again)
        starts = np.flatnonzero(np.concatenate(([True], ranked[1:] != ranked[:-1])))
        present = ranked[starts]
        peak = np.maximum.reduceat(units, starts, axis=0) / bandwidth_Bps
        found.update(links, present, peak)
