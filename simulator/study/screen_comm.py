"""The planner screen's communication costs (:class:`ScreenComm`, which :class:`~simulator.study.screen.Screen`
extends): the collectives inside a layer on as many nodes as their groups span, NCCL rings for the data-parallel
reductions with NCCL's latencies (costs/nccl.py), and host copies as a node's GPUs make them together."""

from __future__ import annotations

import math

from simulator.costs.collectives import CollectiveModel
from simulator.costs.host import HostModel
from simulator.costs.nccl import fastest, protocol_costs, ring_plateau
from simulator.costs.tables import table_lookups
from simulator.hardware.cluster import Cluster
from simulator.hardware.placement import Placement
from simulator.scenario.schema import Scenario
from simulator.study.layout import Layout, collective_span
from simulator.tables.select import resolve_tables


class ScreenComm:
    """The screen sets ``base``, ``cluster``, ``gpn``, ``nvlink``, ``nic_per_gpu``, ``intra``, ``tuning``,
    ``architecture`` and the caches ``_tp_comm``, ``_clusters``, ``_hosts``, ``_rings``."""

    def _comm(self, lay: Layout) -> CollectiveModel:
        """The collectives inside a layer (TP, CP, the experts' EP / ETP), on as many nodes as their groups span."""
        dp, pp = collective_span(lay, self.gpn)
        key = (lay.tp, lay.cp, lay.ep, lay.etp, dp, pp)
        if key not in self._tp_comm:
            one, measured = self._nodes(max(1, math.ceil(lay.tp * lay.cp * dp * pp / self.gpn)))
            placement = Placement(lay.tp, lay.cp, dp, pp, ep=lay.ep, etp=lay.etp)
            self._tp_comm[key] = CollectiveModel(one, placement, "auto", measured)
        return self._tp_comm[key]

    def _nodes(self, nodes: int) -> tuple:
        """(cluster, measured collectives) of ``nodes`` nodes, one per node count: its routes are cached on it."""
        if nodes not in self._clusters:
            one = Cluster(self.cluster.spec, nodes)
            tables = resolve_tables(self.base.kernels, one.gpu.lineage, self.base.kernels_only)
            self._clusters[nodes] = one, table_lookups(tables, one)[1]
        return self._clusters[nodes]

    def _host(self, lay: Layout, s: Scenario) -> HostModel:
        """Host copies (activation offloading, which runs without PP) as every GPU of a node makes them at once,
        sharing its PCIe switches and host memory (costs/host.py): a node's worth of the layout's ranks."""
        inner = lay.tp * lay.cp
        dp = max(1, min(lay.dp, self.gpn // inner)) if inner < self.gpn else 1
        key = (lay.tp, lay.cp, dp)
        if key not in self._hosts:
            one, measured = self._nodes(max(1, math.ceil(inner * dp / self.gpn)))
            placement = Placement(lay.tp, lay.cp, dp, 1)
            self._hosts[key] = HostModel(CollectiveModel(one, placement, "auto", measured), s)
        return self._hosts[key]

    def ring_s(self, op: str, n: int, per_node: int, nbytes: float) -> float:
        """An NCCL ring over ``n`` ranks, ``per_node`` per node, with NCCL's latencies (``costs/nccl.py``)."""
        return sum(self.ring_parts(op, n, per_node, nbytes))

    def ring_parts(self, op: str, n: int, per_node: int, nbytes: float) -> tuple[float, float]:
        """(latency, seconds at the bottleneck's bandwidth) of ``ring_s``'s ring; cached, the screen asks the same
        rings again and again."""
        if n <= 1 or nbytes <= 0:
            return 0.0, 0.0
        key = (op, n, per_node, nbytes)
        if key not in self._rings:
            self._rings[key] = self._ring_parts(op, n, per_node, nbytes)
        return self._rings[key]

    def _ring_parts(self, op: str, n: int, per_node: int, nbytes: float) -> tuple[float, float]:
        nodes = max(1, n // max(per_node, 1))
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        volume = (2 if op == "all_reduce" else 1) * (n - 1) / n * nbytes
        bw = self.nvlink if nodes == 1 else min(self.nvlink, per_node * self.nic_per_gpu)
        inter = 0 if nodes == 1 else (2 * nodes if op == "all_reduce" else nodes - 1)
        plateau = ring_plateau(op, n, nodes, nbytes, self.architecture, self.tuning["version"])
        costs = protocol_costs(
            "ring", steps - min(inter, steps), min(inter, steps), self.intra, self.tuning, bw, plateau=plateau
        )
        p = fastest(costs, volume / bw)
        return p.latency_s, volume / bw / p.bandwidth_factor
