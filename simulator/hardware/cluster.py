"""The cluster as a networkx graph: GPUs, NVSwitch, PCIe switches, CPUs, host memory, NVMe, NICs, leaf and
spine switches. Every edge is a full-duplex link with a per-direction bandwidth, a latency and a kind.

Routing asks the graph (``networkx.shortest_path`` weighted by seconds per byte), never a hard-coded
"intra-node = X GB/s" table. Because every node is wired alike, paths inside a node are computed once on node 0
and renamed, and fabric paths once per pair of leaf switches: a 3,072-GPU job routes in milliseconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, cached_property

import networkx as nx

from simulator.errors import ScenarioError
from simulator.hardware.gpus import GPU, get_gpu
from simulator.hardware.topology import TopologySpec

LinkKey = tuple[int, str, str]  # (node or -1 for fabric, from, to), directed

_GROUP_PREFIX = re.compile(r"^[ng]\d+\.")


@dataclass(frozen=True)
class LinkInfo:
    kind: str  # nvlink | pcie | infiniband | ethernet | nvme | memory | cpu
    bandwidth_Bps: float  # effective, per direction (nominal x efficiency)
    latency_s: float


class Cluster:
    """A built cluster: ``graph`` plus GPU indexing and cached routing."""

    def __init__(self, spec: TopologySpec, num_nodes: int):
        self.spec = spec
        self.num_nodes = num_nodes
        self.gpus_per_node = spec.node.gpus
        self.gpu: GPU = get_gpu(spec.node.gpu)
        self.graph = build_graph(spec, num_nodes, self.gpu)

    # -- naming -------------------------------------------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    # -- routing ------------------------------------------------------------------------------------------
    # A link key is (node, from, to) with node-local names for links inside node ``node``, and
    # (-1, from, to) with global names for fabric links (NIC -> leaf -> spine). Node-local paths come from
    # node 0's subgraph, fabric paths from the switch subgraph, both by networkx shortest path.

    def route(self, a: int, b: int) -> tuple[tuple[LinkKey, ...], float]:
        """Directed links from GPU ``a`` to GPU ``b`` and the sum of their latencies.

        Across nodes each GPU uses its nearest NIC (GPUDirect RDMA through its PCIe switch); the fabric path
        between the two NICs comes from the switch graph (same rail: one leaf; otherwise through the spine).
        """
        na, la = divmod(a, self.gpus_per_node)
        nb, lb = divmod(b, self.gpus_per_node)
        if na == nb:
            return self._gpu_to_gpu(na, la, lb)
        src, lat_a, up, leaf_a, lat_up = self._to_fabric(na, la)
        dst, lat_b, down, leaf_b, lat_down = self._to_fabric(nb, lb, inbound=True)
        mid, lat_f = self._switch_path(leaf_a, leaf_b)
        return src + (up,) + mid + (down,) + dst, lat_a + lat_up + lat_f + lat_down + lat_b

    @cache  # noqa: B019 - one entry per pair of GPUs in a node that talk
    def _gpu_to_gpu(self, node: int, a: int, b: int) -> tuple[tuple[LinkKey, ...], float]:
        return self.local_route(node, f"gpu{a}", f"gpu{b}")

    @cache  # noqa: B019 - one entry per GPU of the cluster
    def _to_fabric(self, node: int, local: int, inbound: bool = False) -> tuple:
        """GPU ``local`` of ``node`` to its nearest NIC's leaf switch (or back, ``inbound``): the node-local
        links, their latency, the NIC-leaf link, the leaf's name and that link's latency."""
        nic = self.nearest_nic[local]
        name = f"n{node}.nic{nic}"
        leaf = self.graph.nodes[name]["leaf"]
        ends = (f"nic{nic}", f"gpu{local}") if inbound else (f"gpu{local}", f"nic{nic}")
        links, lat = self.local_route(node, *ends)
        hop = (-1, leaf, name) if inbound else (-1, name, leaf)
        return (
            links,
            lat,
            hop,
            leaf,
            self.graph.edges[name, leaf]["info"].latency_s,
        )

    def link_info(self, key: LinkKey) -> LinkInfo:
        node, u, v = key
        if node >= 0:
            return self._local_info(u, v)
        return self._fabric_info(u, v)

    @cache  # noqa: B019 - fabric links are few
    def _fabric_info(self, u: str, v: str) -> LinkInfo:
        return self.graph.edges[u, v]["info"]

    @staticmethod
    @cache
    def link_class(key: LinkKey) -> tuple[str, str]:
        """Node-independent name of a link: the link gpu3 -> nvswitch of node 17 is ``(gpu3, nvswitch)``.

        Nodes are wired alike and ranks that behave alike load them alike, so contention is tracked per class.
        """
        node, u, v = key
        if node >= 0:
            return (u, v)
        return (_GROUP_PREFIX.sub("", u), _GROUP_PREFIX.sub("", v))

    def link_nodes(self, key: LinkKey) -> tuple[int, ...]:
        """The compute nodes a link belongs to: its node, a NIC's node, or every node under a leaf switch
        (empty for the spine)."""
        node, u, v = key
        if node >= 0:
            return (node,)
        for name in (u, v):
            attrs = self.graph.nodes[name]
            if attrs["kind"] == "nic":
                return (attrs["node"],)
        for name in (u, v):
            attrs = self.graph.nodes[name]
            if attrs["kind"] == "leaf":
                per = self.spec.fabric.nodes_per_leaf
                return tuple(range(attrs["group"] * per, min((attrs["group"] + 1) * per, self.num_nodes)))
        return ()

    @cached_property
    def nearest_nic(self) -> list[int]:
        """For each local GPU, the NIC reached with the least seconds per byte; ties go to NIC i for GPU i
        (as NCCL pairs GPU i with NIC i on DGX systems) so equidistant NICs share the load."""
        nics = self.spec.node.nics
        out = []
        for i in range(self.gpus_per_node):
            d = nx.single_source_dijkstra_path_length(self._node0_graph, f"n0.gpu{i}", weight="cost")
            best = min(d[f"n0.nic{k}"] for k in range(nics))
            near = [k for k in range(nics) if d[f"n0.nic{k}"] <= best * (1 + 1e-9)]
            out.append(min(near, key=lambda k, i=i: (k - i * nics // self.gpus_per_node) % nics))
        return out

    def local_route(self, node: int, a: str, b: str) -> tuple[tuple[LinkKey, ...], float]:
        """Directed links between two devices of one node (``gpu3``, ``hostmem``, ``nvme0``...) and their
        latency: the path a host copy or an NVMe read takes."""
        links, lat = self._in_node(a, b)
        return tuple((node, u, v) for u, v in links), lat

    @cache  # noqa: B019 - one cluster, a handful of local pairs
    def _in_node(self, a_local: str, b_local: str) -> tuple[tuple[tuple[str, str], ...], float]:
        path = nx.shortest_path(self._node0_graph, f"n0.{a_local}", f"n0.{b_local}", weight="cost")
        links = tuple((u[3:], v[3:]) for u, v in zip(path[:-1], path[1:], strict=False))
        return links, sum(self._local_info(u, v).latency_s for u, v in links)

    @cache  # noqa: B019
    def _local_info(self, u: str, v: str) -> LinkInfo:
        return self.graph.edges[f"n0.{u}", f"n0.{v}"]["info"]

    @cached_property
    def _node0_graph(self) -> nx.Graph:
        # a copy, not a view: shortest paths on a view filter every node they touch
        g = self.graph.subgraph([n for n in self.graph if n.startswith("n0.")]).copy()
        if not nx.is_connected(g):
            parts = sorted(sorted(c) for c in nx.connected_components(g))
            raise ScenarioError(
                f"topology '{self.spec.name}': a node's devices are not all connected "
                f"({len(parts)} separate groups, e.g. {', '.join(parts[-1][:4])})"
            )
        return g

    @cache  # noqa: B019
    def _switch_path(self, leaf_a: str, leaf_b: str) -> tuple[tuple[LinkKey, ...], float]:
        root_paths = self._switch_tree_paths
        if root_paths is None:
            path = nx.shortest_path(self._switch_graph, leaf_a, leaf_b, weight="cost")
        else:  # a tree: up from leaf_a to the last switch both share on their way from the root, then down
            pa, pb = root_paths[leaf_a], root_paths[leaf_b]
            common = 0
            while common < min(len(pa), len(pb)) and pa[common] == pb[common]:
                common += 1
            path = pa[common - 1 :][::-1] + pb[common:]
        links = tuple((-1, u, v) for u, v in zip(path[:-1], path[1:], strict=False))
        return links, sum(self._fabric_info(u, v).latency_s for _, u, v in links)

    @cached_property
    def _switch_tree_paths(self) -> dict[str, list[str]] | None:
        """When the switches form a tree (a two-level fat tree does: leaves under one spine), the path from
        the root to every switch; any route between two switches follows from two of them. None otherwise."""
        g = self._switch_graph
        if g.number_of_nodes() == 0 or not nx.is_tree(g):
            return None
        root = max(g.degree, key=lambda nd: nd[1])[0]
        return nx.single_source_shortest_path(g, root)

    @cached_property
    def _switch_graph(self) -> nx.Graph:
        return self.graph.subgraph(
            [n for n, d in self.graph.nodes(data=True) if d["kind"] in ("leaf", "spine")]
        ).copy()


def build_graph(spec: TopologySpec, num_nodes: int, gpu: GPU) -> nx.Graph:
    """Wire ``num_nodes`` identical nodes into a (rail-optimized) two-level fat tree."""
    n, eff = spec.node, spec.efficiency
    g = nx.Graph()

    kinds: dict[tuple, dict] = {}  # every node repeats the same few link kinds: one attribute set each

    def link(u: str, v: str, kind: str, GBps: float, latency_us: float) -> None:
        key = (kind, GBps, latency_us)
        if key not in kinds:
            bw = GBps * 1e9 * getattr(eff, kind)
            kinds[key] = {
                "info": LinkInfo(kind, bw, latency_us * 1e-6),
                "cost": 1.0 / bw + latency_us * 1e-12,
            }
        g.add_edge(u, v, **kinds[key])

    nvlink_GBps = n.nvlink_bandwidth_GBps or gpu.nvlink_bandwidth_GBps
    pcie_GBps = n.pcie_bandwidth_GBps or gpu.pcie_bandwidth_GBps
    nic_GBps = n.nic_bandwidth_gbps / 8
    ports_per_leaf = (
        n.nics * spec.fabric.nodes_per_leaf if not spec.fabric.rail_optimized else spec.fabric.nodes_per_leaf
    )
    num_groups = -(-num_nodes // spec.fabric.nodes_per_leaf)
    num_leaves = num_groups * (n.nics if spec.fabric.rail_optimized else 1)

    def attach(
        p: str,
        device: str,
        i: int,
        count: int,
        kind: str = "pcie",
        GBps: float = pcie_GBps,
        latency_us: float = n.pcie_latency_us,
    ) -> None:
        """Device i of ``count`` in node ``p`` hangs off PCIe switch i * switches // count (spread evenly)."""
        link(p + device, p + f"pcie{i * n.pcie_switches // max(count, 1)}", kind, GBps, latency_us)

    for k in range(num_nodes):
        p = f"n{k}."
        for c in range(n.cpus):
            g.add_node(p + f"cpu{c}", kind="cpu")
            link(p + f"cpu{c}", p + "hostmem", "memory", n.host_memory_bandwidth_GBps / n.cpus, 0.1)
            if c:
                link(p + "cpu0", p + f"cpu{c}", "memory", n.cpu_interconnect_GBps, 0.3)
        g.nodes[p + "hostmem"]["kind"] = "hostmem"

        for sw in range(n.pcie_switches):
            g.add_node(p + f"pcie{sw}", kind="pcie_switch")
            link(
                p + f"pcie{sw}",
                p + f"cpu{sw * n.cpus // n.pcie_switches}",
                "pcie",
                pcie_GBps,
                n.pcie_latency_us,
            )
        if n.intra_node == "nvswitch":
            g.add_node(p + "nvswitch", kind="nvswitch")
        for i in range(n.gpus):
            g.add_node(p + f"gpu{i}", kind="gpu", node=k, local=i)
            attach(p, f"gpu{i}", i, n.gpus)
            if n.intra_node == "nvswitch":
                link(p + f"gpu{i}", p + "nvswitch", "nvlink", nvlink_GBps, n.nvlink_latency_us)
        for i in range(n.nics):
            leaf = k // spec.fabric.nodes_per_leaf
            leaf_name = f"g{leaf}.leaf{i}" if spec.fabric.rail_optimized else f"g{leaf}.leaf"
            g.add_node(p + f"nic{i}", kind="nic", leaf=leaf_name, node=k)
            g.add_node(leaf_name, kind="leaf", group=leaf)
            attach(p, f"nic{i}", i, n.nics)
            link(p + f"nic{i}", leaf_name, n.nic_kind, nic_GBps, n.nic_latency_us)
        for d in range(n.nvme_drives):
            g.add_node(p + f"nvme{d}", kind="nvme")
            attach(p, f"nvme{d}", d, n.nvme_drives, "nvme", n.nvme_bandwidth_GBps, n.nvme_latency_us)
    if num_leaves > 1:
        g.add_node("spine", kind="spine")
        uplink_GBps = ports_per_leaf * nic_GBps / spec.fabric.oversubscription
        for leaf in [v for v, d in g.nodes(data=True) if d["kind"] == "leaf"]:
            link(leaf, "spine", n.nic_kind, uplink_GBps, spec.fabric.switch_latency_us)
    return g
