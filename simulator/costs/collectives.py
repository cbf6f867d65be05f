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

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from simulator.costs.group_shapes import group_shapes
from simulator.costs.hops import hops as traffic_hops
from simulator.costs.nccl import defaults, fastest, protocol_costs, ring_plateau, tuning_of
from simulator.costs.stage_symmetry import translated
from simulator.costs.traffic import LinkClass, LinkLoads
from simulator.hardware.cluster import Cluster
from simulator.hardware.placement import Groups, Placement
from simulator.tables.lookup import MODELLED, CollectiveLookup

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


def _first(groups):
    """The first group's ranks: a row of a :class:`Groups` array (a 2,048-rank group as a tuple of Python ints
    is 80 KiB), else the first tuple."""
    return groups.array[0] if isinstance(groups, Groups) else groups[0]


def _inside_nodes(array: np.ndarray, gpn: int) -> bool:
    """Whether every group (a row) has its first and last rank on one node, a few thousand groups at a time."""
    step = 1 << 12
    return all(
        (a[:, 0] // gpn == a[:, -1] // gpn).all()
        for a in (array[lo : lo + step] for lo in range(0, len(array), step))
    )


def tree_steps(n: int, nodes: int) -> tuple[int, int]:
    """(steps inside nodes, steps across the network) of NCCL's tree all-reduce over ``n`` ranks on ``nodes``
    nodes: up and down a chain of n / nodes - 1 NVLink hops and a binary tree of log2(nodes) network hops
    (tuning.cc: 2 x ((nRanks/nNodes - 1) x intraLat + log2i(nNodes) x interLat))."""
    return 2 * (n // nodes - 1), 2 * max(1, (nodes - 1).bit_length())


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
        self.tuning = tuning_of(cluster)  # the topology's NCCL constants, the release resolved
        self._patterns: dict[tuple, _Pattern] = {}
        self._phases: dict[tuple, tuple[Phase, ...]] = {}
        self._sources: dict[tuple, str] = {}
        self._by_stage: dict[str, dict[int, tuple]] = {}
        self._cross: dict[tuple[str, str], float] = {}
        self.links = LinkLoads(cluster, placement)

    def stages_of(self, link) -> frozenset:
        """The pipeline stages whose nodes a link serves (its class's first element)."""
        return self.links.stages_of(link)

    # -- public ---------------------------------------------------------------------------------------------
    def phases(self, op: str, group: str, size_bytes: float, stage: int | None = None) -> tuple[Phase, ...]:
        """Phases of ``op`` on every group of kind ``group`` at once, or, with ``stage``, on the groups of that
        pipeline stage only (each stage reduces its gradients at its own time)."""
        key = (op, group, size_bytes, stage)
        if key not in self._phases and stage:
            shifted = translated(self, op, group, size_bytes, stage)
            if shifted is not None:
                self._phases[key], self._sources[key] = shifted
        if key not in self._phases:
            groups = self.placement.groups(group)
            gpn = self.cluster.gpus_per_node
            if stage is not None:
                groups = self._stage_groups(group, stage)
            elif _inside_nodes(groups.array, gpn):
                # groups inside nodes (tensor parallelism): every node is wired alike and runs the same
                # collective, so the groups of one node give the cost (they still contend with each other)
                first = int(groups.array[0, 0] // gpn)
                groups = groups.where(groups.array[:, 0] // gpn == first, ("node", first))
            phases, source = self._cost(op, groups, size_bytes), MODELLED
            if self.measured is not None and phases:
                phases, source = self._calibrated(op, groups, size_bytes, phases)
            self._phases[key], self._sources[key] = phases, source
        return self._phases[key]

    def _stage_groups(self, group: str, stage: int) -> Groups | tuple:
        """The groups of kind ``group`` with a rank in pipeline stage ``stage`` (``()`` where none has)."""
        if group not in self._by_stage:
            groups = self.placement.groups(group)
            member: dict[int, np.ndarray] = {}  # stage -> which groups have a rank in it
            rows = max(1, (1 << 12) // max(1, groups.array.shape[1]))  # a few groups' members at a time
            for lo in range(0, len(groups.array), rows):
                of = self.placement.coordinates_of(groups.array[lo : lo + rows], "pp")  # each member's stage
                for x in np.flatnonzero(np.bincount(of.ravel())).tolist():  # (np.unique imports numpy.ma)
                    member.setdefault(x, np.zeros(len(groups.array), dtype=bool))[lo : lo + rows] = (
                        of == x
                    ).any(axis=1)
            self._by_stage[group] = {x: groups.where(m, ("stage", x)) for x, m in sorted(member.items())}
        return self._by_stage[group].get(stage, ())

    def standalone_time_s(self, op: str, group: str, size_bytes: float, stage: int | None = None) -> float:
        return sum(p.duration_s for p in self.phases(op, group, size_bytes, stage))

    def source(self, op: str, group: str, size_bytes: float, stage: int | None = None) -> str:
        """Where the cost of this collective came from: measured | interpolated | modelled."""
        self.phases(op, group, size_bytes, stage)
        return self._sources[(op, group, size_bytes, stage)]

    def _calibrated(self, op: str, groups, size_bytes: float, phases: tuple[Phase, ...]):
        """Phases rescaled so that one group alone takes the measured time: which links the collective loads
        stays the model's, so groups that run together still share them (all DP groups' NICs)."""
        grp = _first(groups)[:2] if op == "send_recv" else _first(groups)  # one transfer between neighbours
        nodes = self._nodes(grp)
        if len(grp) % nodes:
            return phases, MODELLED
        hit = self.measured.cost(op, len(grp), nodes, len(grp) // nodes, size_bytes)
        # that group as the pattern's key: a view of the groups' array, not a tuple of its ranks kept in the
        # pattern cache (2,048 ranks: 70 KiB each)
        one = (
            Groups(groups.array[:1, : len(grp)], (groups.key, "first", len(grp)))
            if isinstance(groups, Groups)
            else (grp,)
        )
        alone = sum(p.duration_s for p in self._cost(op, one, size_bytes))
        if hit is None or alone <= 0:
            return phases, MODELLED
        seconds, source = hit
        top = self.measured.largest(op, len(grp), nodes, len(grp) // nodes)
        if top is not None and size_bytes > top:
            # above the table's range: its largest row, plus the model's time for the bytes beyond it (the row
            # holds the latencies and protocol the table measured; more bytes move at the modelled bandwidth,
            # where an 8-GPU A100 all-reduce of 1 GiB is 8.1-8.2 ms on three public nccl-tests curves and 8.3
            # modelled, docs/collectives.md; the row's bandwidth carried on gave 11.0)
            at_top = sum(p.duration_s for p in self._cost(op, one, top))
            seconds = self.measured.cost(op, len(grp), nodes, len(grp) // nodes, top)[0] + alone - at_top
        f = seconds / alone
        return tuple(
            Phase(p.latency_s * f, {c: s * f for c, s in p.demand_s.items()}) for p in phases
        ), source

    # -- algorithms -----------------------------------------------------------------------------------------
    def _cost(self, op: str, groups, size_bytes: float) -> tuple[Phase, ...]:
        n = len(_first(groups))
        if n <= 1 or size_bytes <= 0:
            return ()
        nodes = self._nodes(_first(groups))
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
        plateau = ring_plateau(
            op, n, nodes, size_bytes, self.cluster.gpu.architecture, self.tuning["version"]
        )
        ring = (
            self._on_protocol(
                self._pattern("ring", groups), units, chunk, steps - inter, min(inter, steps), plateau=plateau
            ),
        )
        if op == "all_reduce" and nodes == 1 and self.algorithm in ("auto", "nvls") and self._nvls():
            nvls = (self._nvls_phase(ring[0], n, size_bytes),)
            if self.algorithm == "nvls":
                return nvls
            return min((ring, nvls), key=lambda ph: sum(p.duration_s for p in ph))  # NCCL picks the faster
        if op != "all_reduce" or self.algorithm == "ring" or nodes == 1:
            return ring
        if self.algorithm == "hierarchical":
            return self._hierarchical(groups, size_bytes)
        tree = (self._tree(groups, size_bytes),)
        if self.algorithm == "tree":
            return tree
        prefers_tree = self._nccl_prefers_tree(groups, size_bytes, steps, inter, nodes, plateau)
        return tree if prefers_tree else ring

    def _nccl_prefers_tree(
        self, groups, size_bytes: float, steps: int, inter: int, nodes: int, plateau: float
    ) -> bool:
        """Whether NCCL runs this all-reduce on its tree: the choice NCCL makes by its own tuning model, with its
        own constants, those of the release the scenario runs (the call then costs what the chosen algorithm does
        on the graph).

        ncclTopoTuneModel (src/graph/tuning.cc, v2.14.3 through v2.23.4 alike) gives both algorithms the same bus
        bandwidth (the graph's per-channel bandwidth x channels: bwIntra on up to two nodes, bwInter beyond;
        here the ring's Simple bus bandwidth on the graph) and converts it to an algorithm bandwidth by
        nRanks / nsteps for the ring and 0.5 for the tree (after each protocol's factor, the tree's x 0.92 and
        its correction by size); ncclTopoGetAlgoTime adds each one's latency. So NCCL takes the tree for its
        latency, never for the bandwidth a tree can reach between exactly two nodes (each byte crosses the
        network once each way, against 2(n-1)/n times on the ring): on 2 x 8 A100 with 8 HDR NICs at 1-4 GB
        (NCCL 2.17.1, microsoft/mscclpp docs/performance-ndmv4.md) all-reduce ran at the ring's bus bandwidth."""
        n = len(_first(groups))
        busbw = self._busbw(self._pattern("ring", groups))
        if not busbw:
            return False
        own = {"version": self.tuning["version"]}  # NCCL's constants of the release, not a fabric's
        ring = protocol_costs(
            "ring", steps - inter, min(inter, steps), self.intra, own, busbw, plateau=plateau
        )
        ring_s = min(c.latency_s + 2 * (n - 1) / n * size_bytes / (busbw * c.bandwidth_factor) for c in ring)
        tree = protocol_costs("tree", *tree_steps(n, nodes), self.intra, own, busbw, size_bytes)
        tree_s = min(c.latency_s + size_bytes / (0.5 * busbw * c.bandwidth_factor) for c in tree)
        return tree_s < ring_s

    def _nvls(self) -> float | None:
        """The node's NVLink SHARP bus bandwidth as a fraction of NVLink's (None: no NVLS)."""
        spec = self.cluster.spec
        return spec.efficiency.nvls if spec.node.intra_node == "nvswitch" else None

    def _nvls_phase(self, ring: Phase, n: int, size_bytes: float) -> Phase:
        """An all-reduce inside one node reduced in the NVSwitch (NVLS): the ring's link classes, each busy for
        2(n-1)/n x S / (NVLink x efficiency.nvls), the measured NVLS bus bandwidth, after NCCL's NVLS latency."""
        node = self.cluster.spec.node
        nvlink = (node.nvlink_bandwidth_GBps or self.cluster.gpu.nvlink_bandwidth_GBps) * 1e9
        seconds = 2 * (n - 1) / n * size_bytes / (nvlink * self._nvls())
        return Phase(
            defaults(self.tuning["version"])["nvls_latency_us"] * 1e-6, dict.fromkeys(ring.demand_s, seconds)
        )

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
        plateau: float = 1.0,
    ) -> Phase:
        """A phase moving ``units`` x ``chunk_bytes`` over ``pattern``'s hops, on the protocol NCCL picks (a tree:
        ``units`` 1, ``chunk_bytes`` its buffer, which sets NCCL's tree correction; ``plateau``: the Simple ring's
        latency factor, nccl.ring_plateau)."""
        demand = {c: units * chunk_bytes * s for c, s in pattern.unit_demand_s.items()}
        busiest = max(demand.values(), default=0.0)
        busbw = self._busbw(pattern)
        tree_bytes = chunk_bytes if algorithm == "tree" else None
        costs = protocol_costs(
            algorithm, intra_steps, inter_steps, self.intra, self.tuning, busbw, tree_bytes, plateau
        )
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
        steps = tree_steps(len(_first(groups)), self._nodes(_first(groups)))
        return self._on_protocol(pattern, 1, size_bytes, *steps, "tree")

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
        """Nodes the ranks of ``grp`` (a tuple or an array row) are on."""
        gpn = self.cluster.gpus_per_node
        if isinstance(grp, np.ndarray) and len(grp) >= 64:  # (a set is quicker on a few ranks)
            node = np.sort(grp // gpn)
            return 1 + int(np.count_nonzero(node[1:] != node[:-1]))
        return len({g // gpn for g in (grp.tolist() if isinstance(grp, np.ndarray) else grp)})

    # -- link loads on the graph ----------------------------------------------------------------------------
    def cross_node_fraction(self, op: str, group: str) -> float:
        """Share of a collective's bytes that cross node boundaries (the rest stays on NVLink / PCIe), averaged
        over every group of that kind."""
        key = (op, group)
        if key not in self._cross:
            groups = self.placement.groups(group)
            kind = {"send_recv": "pairs", "all_to_all": "all_pairs"}.get(op, "ring")
            gpn = self.cluster.gpus_per_node
            nics = self.cluster.spec.node.nics
            # a group's share of cross-node bytes depends only on which of its ranks share a node, in order: one
            # group of each shape stands for the others (at 131,072 GPUs: 64 data-parallel groups of 2,048, 16,384
            # tensor-parallel groups of 8)
            total = cross = 0.0
            for grp, count in group_shapes(groups, gpn):
                if len(grp) < 2:
                    continue
                if kind == "all_pairs":  # n(n-1) unit pairs, of which those inside a node: sum of c(c-1)
                    n, on_node = len(grp), np.unique(np.asarray(grp) // gpn, return_counts=True)[1]
                    total += count * n * (n - 1)
                    cross += count * (n * (n - 1) - float((on_node * (on_node - 1)).sum()))
                    continue
                src, dst, share = traffic_hops(kind, (grp,), gpn, nics)
                total += count * float(share.sum())
                cross += count * float(share[src // gpn != dst // gpn].sum())
            self._cross[key] = cross / total if total else 0.0
        return self._cross[key]

    def _pattern(self, kind: str, groups) -> _Pattern:
        key = (kind, groups)
        if key not in self._patterns:
            self._patterns[key] = _Pattern(self.links.shared_group_loads(kind, groups))
        return self._patterns[key]
