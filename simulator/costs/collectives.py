"""Collective communication on the cluster graph: ring, tree and hierarchical algorithms on NCCL's protocols.

Every collective is turned into *phases*. A phase has a latency and a *demand*: for each link class, the seconds
that class must spend moving this collective's bytes at full bandwidth. The latency and the bandwidth share
come from the protocol NCCL would pick for the call (``simulator/costs/nccl.py``: LL, LL128 or Simple, each
with its base and per-step latency and its fraction of the link bandwidth). All groups of the same kind run the collective at once (all
DP groups reduce together), so the demand adds every group's traffic on every link before taking, per class,
the busiest link: shared NICs, PCIe switches and oversubscribed spines slow the collective down. The engine
then shares link classes between collectives that overlap in time.

Closed forms these reduce to (tests check them): ring all-reduce moves 2(n-1)/n x S per rank in 2(n-1) steps,
reduce-scatter and all-gather (n-1)/n x S in n-1 steps (Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan
2009; NCCL docs "Performance reported by NCCL tests", busbw = algbw x 2(n-1)/n).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from simulator.costs.nccl import fastest, protocol_costs
from simulator.hardware.cluster import Cluster
from simulator.hardware.placement import Placement
from simulator.tables.lookup import MODELLED, CollectiveLookup

LinkClass = tuple[frozenset, str, str]  # (pipeline stages on the link's nodes, from, to)

OPS = ("all_reduce", "all_gather", "reduce_scatter", "reduce", "broadcast", "all_to_all", "send_recv")


@dataclass(frozen=True)
class Phase:
    latency_s: float
    demand_s: dict[LinkClass, float] = field(hash=False)  # seconds of exclusive use per link class

    @cached_property
    def busiest_s(self) -> float:
        """Seconds on the busiest link class: the phase's length after its latency when nothing else shares
        the links (demand dicts of big jobs hold hundreds of classes, so this is computed once)."""
        return max(self.demand_s.values(), default=0.0)

    @property
    def duration_s(self) -> float:
        """Time when nothing else shares the links."""
        return self.latency_s + self.busiest_s


def ring_steps(op: str, n: int) -> int:
    """Steps of the ring algorithm: 2(n-1) for all-reduce (reduce-scatter + all-gather), n-1 otherwise (a reduce
    to one rank runs as a pipelined chain of n-1 hops)."""
    if n <= 1:
        return 0
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def ring_bytes_per_rank(op: str, n: int, size_bytes: float) -> float:
    """Bytes each rank sends: 2(n-1)/n S (all-reduce), (n-1)/n S (all-gather, reduce-scatter, all-to-all, reduce),
    S (broadcast, send/recv). ``size_bytes`` is the full (unsharded) buffer."""
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) / n * size_bytes
    # a reduce (chain to the root): n-1 of the n ranks send S, (n-1)/n S per rank on average
    if op in ("all_gather", "reduce_scatter", "all_to_all", "reduce"):
        return (n - 1) / n * size_bytes
    return size_bytes


@dataclass
class _Pattern:
    """Per-link load of one unit of data per step on every hop."""

    unit_demand_s: dict[LinkClass, float]  # seconds per byte-per-hop, busiest link of each class


class CollectiveModel:
    """Costs collectives of named groups (``dp``, ``tp``, ...) on a cluster; patterns and phases are cached."""

    def __init__(
        self,
        cluster: Cluster,
        placement: Placement,
        algorithm: str = "auto",
        measured: CollectiveLookup | None = None,
    ):
        self.cluster = cluster
        self.placement = placement
        self.algorithm = algorithm
        # measured times embody NCCL's own choice of algorithm: a forced algorithm is a what-if for the model
        self.measured = measured if algorithm == "auto" else None
        self.intra = "nvlink" if cluster.spec.node.intra_node == "nvswitch" else "pcie"
        self.tuning = cluster.spec.nccl.model_dump()
        self._patterns: dict[tuple, _Pattern] = {}
        self._phases: dict[tuple, tuple[Phase, ...]] = {}
        self._sources: dict[tuple, str] = {}
        self._by_stage: dict[str, dict[int, tuple]] = {}
        # nodes that host the same pipeline stages are interchangeable; others are not (their links carry
        # other stages' traffic at other times), so link classes carry the set of stages of their nodes
        gpn = cluster.gpus_per_node
        self._fabric_stages: dict = {}
        self._cross: dict[tuple[str, str], float] = {}
        self._node_stages = [
            frozenset(
                placement.coordinate(r, "pp")
                for r in range(k * gpn, min((k + 1) * gpn, placement.world_size))
            )
            for k in range(cluster.num_nodes)
        ]

    # -- public ---------------------------------------------------------------------------------------------
    def phases(self, op: str, group: str, size_bytes: float, stage: int | None = None) -> tuple[Phase, ...]:
        """Phases of ``op`` on every group of kind ``group`` at once, or, with ``stage``, on the groups of that
        pipeline stage only (each stage reduces its gradients at its own time)."""
        key = (op, group, size_bytes, stage)
        if key not in self._phases and stage:
            shifted = self._translated(op, group, size_bytes, stage)
            if shifted is not None:
                self._phases[key], self._sources[key] = shifted
        if key not in self._phases:
            groups = self.placement.groups(group)
            gpn = self.cluster.gpus_per_node
            if stage is not None:
                groups = self._stage_groups(group, stage)
            elif all(g[0] // gpn == g[-1] // gpn for g in groups):
                # groups inside nodes (tensor parallelism): every node is wired alike and runs the same
                # collective, so the groups of one node give the cost (they still contend with each other)
                first = groups[0][0] // gpn
                groups = tuple(g for g in groups if g[0] // gpn == first)
            phases, source = self._cost(op, groups, size_bytes), MODELLED
            if self.measured is not None and phases:
                phases, source = self._calibrated(op, groups, size_bytes, phases)
            self._phases[key], self._sources[key] = phases, source
        return self._phases[key]

    def _stage_groups(self, group: str, stage: int) -> tuple:
        """The groups of kind ``group`` with a rank in pipeline stage ``stage``."""
        if group not in self._by_stage:
            pp, by_stage = self.placement.stages(), defaultdict(list)
            for g in self.placement.groups(group):
                for x in sorted({pp[r] for r in g}):
                    by_stage[x].append(g)
            self._by_stage[group] = {x: tuple(gs) for x, gs in by_stage.items()}
        return self._by_stage[group].get(stage, ())

    def _translated(self, op: str, group: str, size_bytes: float, stage: int):
        """Stage ``stage``'s phases as stage 0's, moved: exact when stage ``stage``'s groups are stage 0's shifted
        by whole leaf switches and every node holds one stage (the usual placement: pipeline stages outermost),
        so its links are loaded alike; the link classes then carry the stage set shifted by ``stage``.
        ``None`` where that does not hold (the caller computes the groups' loads)."""
        gpn, per_leaf = self.cluster.gpus_per_node, self.cluster.spec.fabric.nodes_per_leaf
        base, mine = self._stage_groups(group, 0), self._stage_groups(group, stage)
        if not base or len(base) != len(mine):
            return None
        shift = min(r for g in mine for r in g) - min(r for g in base for r in g)
        nodes = shift // gpn
        if shift % gpn or nodes % per_leaf or any(len(n) != 1 for n in self._node_stages):
            return None
        if sorted(tuple(r + shift for r in g) for g in base) != sorted(mine):
            return None
        last = max(x for n in self._node_stages for x in n)
        phases = self.phases(op, group, size_bytes, 0)
        moved = []
        for ph in phases:
            demand = {}
            for (stages, *rest), sec in ph.demand_s.items():
                if any(x + stage > last for x in stages):
                    return None
                demand[(frozenset(x + stage for x in stages), *rest)] = sec
            moved.append(Phase(ph.latency_s, demand))
        return tuple(moved), self._sources[(op, group, size_bytes, 0)]

    def standalone_time_s(self, op: str, group: str, size_bytes: float, stage: int | None = None) -> float:
        return sum(p.duration_s for p in self.phases(op, group, size_bytes, stage))

    def source(self, op: str, group: str, size_bytes: float, stage: int | None = None) -> str:
        """Where the cost of this collective came from: measured | interpolated | modelled."""
        self.phases(op, group, size_bytes, stage)
        return self._sources[(op, group, size_bytes, stage)]

    def _calibrated(self, op: str, groups, size_bytes: float, phases: tuple[Phase, ...]):
        """Phases rescaled so that one group alone takes the measured time: which links the collective loads
        stays the model's, so groups that run together still share them (all DP groups' NICs)."""
        grp = groups[0][:2] if op == "send_recv" else groups[0]  # one transfer between pipeline neighbours
        gpn = self.cluster.gpus_per_node
        nodes = len({g // gpn for g in grp})
        if len(grp) % nodes:
            return phases, MODELLED
        hit = self.measured.cost(op, len(grp), nodes, len(grp) // nodes, size_bytes)
        alone = sum(p.duration_s for p in self._cost(op, (tuple(grp),), size_bytes))
        if hit is None or alone <= 0:
            return phases, MODELLED
        seconds, source = hit
        f = seconds / alone
        return tuple(
            Phase(p.latency_s * f, {c: s * f for c, s in p.demand_s.items()}) for p in phases
        ), source

    # -- algorithms -----------------------------------------------------------------------------------------
    def _cost(self, op: str, groups, size_bytes: float) -> tuple[Phase, ...]:
        n = len(groups[0])
        if n <= 1 or size_bytes <= 0:
            return ()
        nodes = self._nodes(groups[0])
        if op == "send_recv":
            return (self._on_protocol(self._pattern("pairs", groups), 1, size_bytes, *self._split(1, nodes)),)
        if op == "all_to_all":
            # every rank sends S/n to each of the n-1 others, all pairs at once; n-1 rounds of latency
            pattern = self._pattern("all_pairs", groups)
            return (self._on_protocol(pattern, 1, size_bytes / n, *self._split(n - 1, nodes)),)
        steps = ring_steps(op, n)
        units, chunk = steps, size_bytes / n  # each hop carries ``units`` chunks
        if op == "broadcast":
            units, chunk = n - 1, size_bytes / (n - 1)
        elif op == "reduce":  # a pipelined chain to the root: each link carries the buffer once
            units, chunk = 1, size_bytes
        # NCCL's ring: of its steps, 2 x nodes (all-reduce) or nodes - 1 cross the network (tuning.cc)
        inter = 0 if nodes == 1 else (2 * nodes if op == "all_reduce" else nodes - 1)
        ring = (
            self._on_protocol(self._pattern("ring", groups), units, chunk, steps - inter, min(inter, steps)),
        )
        if op != "all_reduce" or self.algorithm == "ring" or nodes == 1:
            return ring
        if self.algorithm == "hierarchical":
            return self._hierarchical(groups, size_bytes)
        tree = (self._tree(groups, size_bytes),)
        if self.algorithm == "tree":
            return tree
        return min((ring, tree), key=lambda ph: sum(p.duration_s for p in ph))  # NCCL chooses ring or tree

    def _split(self, steps: int, nodes: int) -> tuple[int, int]:
        """(steps inside nodes, steps across the network) of a point-to-point pattern."""
        return (steps, 0) if nodes == 1 else (0, steps)

    def _on_protocol(
        self,
        pattern: _Pattern,
        units: float,
        chunk_bytes: float,
        intra_steps: int,
        inter_steps: int,
        algorithm: str = "ring",
    ) -> Phase:
        """A phase moving ``units`` x ``chunk_bytes`` over ``pattern``'s hops, on the protocol NCCL picks."""
        demand = {c: units * chunk_bytes * s for c, s in pattern.unit_demand_s.items()}
        busiest = max(demand.values(), default=0.0)
        busbw = self._busbw(pattern)
        costs = protocol_costs(algorithm, intra_steps, inter_steps, self.intra, self.tuning, busbw)
        p = fastest(costs, busiest)
        if p.bandwidth_factor != 1.0:
            demand = {c: s / p.bandwidth_factor for c, s in demand.items()}
        return Phase(p.latency_s, demand)

    def _busbw(self, pattern: _Pattern) -> float | None:
        """Bytes per second per rank on the pattern's busiest link class at Simple's bandwidth."""
        worst = max(pattern.unit_demand_s.values(), default=0.0)
        return 1.0 / worst if worst > 0 else None

    def _tree(self, groups, size_bytes: float) -> Phase:
        """NCCL double binary tree across nodes, chain inside each node; pipelined, so the bandwidth term is
        the busiest link and the latency 2 x (chain length x intra-node hop + tree depth x network hop)."""
        pattern = self._pattern("tree", groups)
        nodes = self._nodes(groups[0])
        per_node = len(groups[0]) // nodes
        depth = max(1, (nodes - 1).bit_length())
        return self._on_protocol(pattern, 1, size_bytes, 2 * (per_node - 1), 2 * depth, "tree")

    def _hierarchical(self, groups, size_bytes: float) -> tuple[Phase, ...]:
        """Reduce-scatter inside each node, all-reduce across nodes per local rank, all-gather inside the node."""
        gpn = self.cluster.gpus_per_node
        intra = tuple(
            tuple(g for g in grp if g // gpn == node)
            for grp in groups
            for node in sorted({x // gpn for x in grp})
        )
        k = len(intra[0])
        inter = tuple(tuple(grp[i::k]) for grp in groups for i in range(k))
        out = []
        if k > 1:
            out.append(self._on_protocol(self._pattern("ring", intra), k - 1, size_bytes / k, k - 1, 0))
        m = len(inter[0])
        out.append(
            self._on_protocol(self._pattern("ring", inter), 2 * (m - 1), size_bytes / k / m, 0, 2 * (m - 1))
        )
        if k > 1:
            out.append(self._on_protocol(self._pattern("ring", intra), k - 1, size_bytes / k, k - 1, 0))
        return tuple(out)

    def _nodes(self, grp) -> int:
        gpn = self.cluster.gpus_per_node
        return len({g // gpn for g in grp})

    def _spans_nodes(self, grp) -> bool:
        gpn = self.cluster.gpus_per_node
        return len({g // gpn for g in grp}) > 1

    # -- link loads on the graph ----------------------------------------------------------------------------
    def cross_node_fraction(self, op: str, group: str) -> float:
        """Share of a collective's bytes that cross node boundaries (the rest stays on NVLink / PCIe), averaged
        over every group of that kind."""
        key = (op, group)
        if key not in self._cross:
            groups = self.placement.groups(group)
            kind = {"send_recv": "pairs", "all_to_all": "all_pairs"}.get(op, "ring")
            gpn = self.cluster.gpus_per_node
            hops = self._hops(kind, groups) if len(groups[0]) > 1 else []
            total = sum(share for _, _, share in hops)
            cross = sum(share for a, b, share in hops if a // gpn != b // gpn)
            self._cross[key] = cross / total if total else 0.0
        return self._cross[key]

    def _pattern(self, kind: str, groups) -> _Pattern:
        key = (kind, groups)
        if key not in self._patterns:
            self._patterns[key] = self._loads(self._hops(kind, groups))
        return self._patterns[key]

    def _hops(self, kind: str, groups) -> list[tuple[int, int, float]]:
        """(src GPU, dst GPU, share of the per-step chunk) for every hop of every group."""
        hops: list[tuple[int, int, float]] = []
        gpn, nics = self.cluster.gpus_per_node, self.cluster.spec.node.nics
        for grp in groups:
            by_node: dict[int, list[int]] = defaultdict(list)
            for g in sorted(grp):
                by_node[g // gpn].append(g)
            segs = list(by_node.values())
            if kind == "pairs":  # send/recv: rank i -> rank i+1 of the group (pipeline neighbours)
                hops += [(a, b, 1.0) for a, b in zip(grp[:-1], grp[1:], strict=False)]
            elif kind == "all_pairs":
                hops += [(a, b, 1.0) for a in grp for b in grp if a != b]
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

    def stages_of(self, link) -> frozenset:
        if link[0] >= 0:
            return self._node_stages[link[0]]
        if link not in self._fabric_stages:
            nodes = self.cluster.link_nodes(link)
            self._fabric_stages[link] = frozenset().union(*(self._node_stages[n] for n in nodes))
        return self._fabric_stages[link]

    def _loads(self, hops) -> _Pattern:
        """Per link class, the busiest link's seconds per unit of data sent on every hop of ``hops``.

        Equivalent to adding ``share`` to every link of ``cluster.route(src, dst)`` for every hop, but counted
        per piece of the route with numpy (10^5 hops at 16,384 GPUs): a hop inside a node loads the node-local
        path between its two GPUs; a hop across nodes loads its source GPU's path to its nearest NIC, that
        NIC's uplink, the switch path between the two leaves, the destination's NIC downlink and the path to
        its GPU. Loads are summed per node (one array per node-local link name), then the busiest node of each
        set of pipeline stages gives the class."""
        cl = self.cluster
        if not hops:
            return _Pattern({})
        gpn, nn, nics = cl.gpus_per_node, cl.num_nodes, cl.spec.node.nics
        src, dst, share = (np.asarray(x) for x in zip(*hops, strict=True))
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
        return _Pattern(per_class)

    @cached_property
    def _stage_index(self) -> tuple[list[frozenset], np.ndarray, np.ndarray]:
        """The distinct stage sets of the nodes, the nodes ordered by set, and where each set starts."""
        sets = sorted(set(self._node_stages), key=sorted)
        index = {x: i for i, x in enumerate(sets)}
        ids = np.array([index[x] for x in self._node_stages], dtype=np.int64)
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
