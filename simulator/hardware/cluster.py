"""The cluster as a networkx graph: GPUs, NVSwitch, PCIe switches, CPUs, host memory, NVMe, NICs, leaf and
spine switches. Every edge is a full-duplex link with a per-direction bandwidth, a latency and a kind.

Routing inside a node asks the graph (``networkx.shortest_path`` weighted by seconds per byte), never a
hard-coded "intra-node = X GB/s" table. Because every node is wired alike, paths inside a node are computed once
on node 0 and renamed. The fabric is a two-level fat tree (``fabric_graph``): two leaves' path is the first
leaf's uplink and the second's downlink through the spine, so routing needs no switch graph (at 131,072 GPUs its
6,561 switches took 4.4 MiB). The whole cluster's graph (``Cluster.graph``, 100,000 edges at 16,384 GPUs) is built
when something asks for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, cached_property, wraps
from typing import TYPE_CHECKING

from simulator.errors import ScenarioError
from simulator.hardware import route_cache
from simulator.hardware.gpus import GPU, get_gpu
from simulator.hardware.topology import TopologySpec

if TYPE_CHECKING:  # imported where a graph is built or searched (0.09 s: start-up need not pay it)
    import networkx as nx

LinkKey = tuple[int, str, str]  # (node or -1 for fabric, from, to), directed

_GROUP_PREFIX = re.compile(r"^[ng]\d+\.")
_NIC = re.compile(r"^n(\d+)\.nic\d+$")
_LEAF = re.compile(r"^g(\d+)\.leaf\d*$")  # leaf_name's


@dataclass(frozen=True)
class LinkInfo:
    kind: str  # nvlink | pcie | infiniband | ethernet | nvme | memory | cpu
    bandwidth_Bps: float  # effective, per direction (nominal x efficiency)
    latency_s: float


def per_instance(method):
    """``functools.cache`` for a method, its table kept on the instance: it goes with the cluster (a method under
    ``functools.cache`` keeps every instance it saw alive for the process, over a long sweep or plan)."""
    name = f"_cache_{method.__name__.lstrip('_')}"

    @wraps(method)
    def cached(self, *args, **kwargs):
        table = self.__dict__.setdefault(name, {})
        key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
        if key not in table:
            table[key] = method(self, *args, **kwargs)
        return table[key]

    return cached


class Cluster:
    """A built cluster: ``graph`` plus GPU indexing and cached routing."""

    def __init__(self, spec: TopologySpec, num_nodes: int):
        self.spec = spec
        self.num_nodes = num_nodes
        self.gpus_per_node = spec.node.gpus
        self.gpu: GPU = get_gpu(spec.node.gpu).at_power(spec.node.power_w)
        rails = spec.node.nics if spec.fabric.rail_optimized else 1
        self.num_leaves = -(-num_nodes // spec.fabric.nodes_per_leaf) * rails  # fabric_graph's leaves

    @cached_property
    def graph(self) -> nx.Graph:
        """Every device and link of the cluster (built on first use; routing does not need it)."""
        return build_graph(self.spec, self.num_nodes, self.gpu)

    @per_instance
    def first_nodes_graph(self, nodes: int) -> nx.Graph:
        """The graph with the devices of the first ``nodes`` nodes only, and every switch: what a report draws,
        without building 16,384 GPUs' worth of graph."""
        return build_graph(self.spec, self.num_nodes, self.gpu, wired=nodes)

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
        mid = self.switch_path(leaf_a, leaf_b)
        lat_f = sum(self._fabric_info(u, v).latency_s for _, u, v in mid)
        return src + (up,) + mid + (down,) + dst, lat_a + lat_up + lat_f + lat_down + lat_b

    @per_instance
    def _gpu_to_gpu(self, node: int, a: int, b: int) -> tuple[tuple[LinkKey, ...], float]:
        return self.local_route(node, f"gpu{a}", f"gpu{b}")

    @per_instance
    def _to_fabric(self, node: int, local: int, inbound: bool = False) -> tuple:
        """GPU ``local`` of ``node`` to its nearest NIC's leaf switch (or back, ``inbound``): the node-local
        links, their latency, the NIC-leaf link, the leaf's name and that link's latency."""
        nic = self.nearest_nic[local]
        name = f"n{node}.nic{nic}"
        leaf = leaf_name(self.spec, node, nic)
        ends = (f"nic{nic}", f"gpu{local}") if inbound else (f"gpu{local}", f"nic{nic}")
        links, lat = self.local_route(node, *ends)
        hop = (-1, leaf, name) if inbound else (-1, name, leaf)
        return links, lat, hop, leaf, self._fabric_info(name, leaf).latency_s

    def link_info(self, key: LinkKey) -> LinkInfo:
        node, u, v = key
        if node >= 0:
            return self._local_info(u, v)
        return self._fabric_info(u, v)

    def _fabric_info(self, u: str, v: str) -> LinkInfo:
        if "spine" in (u, v):
            return self._uplink["info"]  # a leaf's uplinks to the spine, as one link (fabric_graph)
        return self._nic_link["info"]  # a NIC and its leaf: every node's alike

    @cached_property
    def _uplink(self) -> dict:
        return _uplink_attrs(self.spec)

    @cached_property
    def _nic_link(self) -> dict:
        n = self.spec.node
        return _link_attrs(n.nic_kind, n.nic_bandwidth_gbps / 8, n.nic_latency_us, self.spec)

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
            if nic := _NIC.match(name):
                return (int(nic[1]),)
        for name in (u, v):
            if leaf := _LEAF.match(name):
                group, per = int(leaf[1]), self.spec.fabric.nodes_per_leaf
                return tuple(range(group * per, min((group + 1) * per, self.num_nodes)))
        return ()

    @cached_property
    def nearest_nic(self) -> list[int]:
        """For each local GPU, the NIC reached with the least seconds per byte; ties go to NIC i for GPU i
        (as NCCL pairs GPU i with NIC i on DGX systems) so equidistant NICs share the load."""
        routes = self._routes
        if routes.nearest_nic is None or len(routes.nearest_nic) != self.gpus_per_node:
            routes.set_nearest_nic(self._find_nearest_nic())
        return list(routes.nearest_nic)

    def _find_nearest_nic(self) -> list[int]:
        import networkx as nx

        nics = self.spec.node.nics
        out = []
        for i in range(self.gpus_per_node):
            d = nx.single_source_dijkstra_path_length(self._node0_graph, f"n0.gpu{i}", weight="cost")
            best = min(d[f"n0.nic{k}"] for k in range(nics))
            near = [k for k in range(nics) if d[f"n0.nic{k}"] <= best * (1 + 1e-9)]
            out.append(min(near, key=lambda k, i=i: (k - i * nics // self.gpus_per_node) % nics))
        return out

    def local_links(self, a: str, b: str) -> tuple[tuple[str, str], ...]:
        """The links from device ``a`` to device ``b`` of one node, by node-local name (``("gpu3", "nvswitch")``):
        the same in every node."""
        return self._in_node(a, b)[0]

    def leaf_of(self, leaf_id: int) -> str:
        """Name of leaf switch number ``leaf_id`` = group x rails + rail (rails: NICs per node when
        rail-optimized, else 1), the numbering ``CollectiveModel`` uses to count traffic between leaves."""
        rails = self.spec.node.nics if self.spec.fabric.rail_optimized else 1
        group, rail = divmod(leaf_id, rails)
        return leaf_name(self.spec, group * self.spec.fabric.nodes_per_leaf, rail)

    @property
    def spine(self) -> str | None:
        """The spine switch joining the leaves (fabric_graph), None where there is one leaf."""
        return "spine" if self.num_leaves > 1 else None

    def switch_path(self, leaf_a: str, leaf_b: str) -> tuple[LinkKey, ...]:
        """Fabric links from leaf switch ``leaf_a`` to ``leaf_b``: up to the spine and down (empty when they
        are the same leaf)."""
        return ((-1, leaf_a, "spine"), (-1, "spine", leaf_b)) if leaf_a != leaf_b else ()

    def local_route(self, node: int, a: str, b: str) -> tuple[tuple[LinkKey, ...], float]:
        """Directed links between two devices of one node (``gpu3``, ``hostmem``, ``nvme0``...) and their
        latency: the path a host copy or an NVMe read takes."""
        links, lat = self._in_node(a, b)
        return tuple((node, u, v) for u, v in links), lat

    @per_instance
    def _in_node(self, a_local: str, b_local: str) -> tuple[tuple[tuple[str, str], ...], float]:
        path = self._routes.paths.get(f"{a_local}>{b_local}")
        if path is None:
            path = self._find_path(a_local, b_local)
            self._routes.add_path(a_local, b_local, path)
        links = tuple(zip(path[:-1], path[1:], strict=False))
        return links, sum(self._local_info(u, v).latency_s for u, v in links)

    def _find_path(self, a_local: str, b_local: str) -> list[str]:
        """The path of least seconds per byte; of equally short ones the first by device names in natural order
        (``gpu8`` before ``gpu10``), not networkx's order of search (a release may change it; 3.6's is this)."""
        import networkx as nx

        ties = nx.all_shortest_paths(self._node0_graph, f"n0.{a_local}", f"n0.{b_local}", weight="cost")
        return min(([x[3:] for x in path] for path in ties), key=route_cache.natural_order)

    @per_instance
    def _local_info(self, u: str, v: str) -> LinkInfo:
        edges = self._node0.edges
        key = (f"n0.{u}", f"n0.{v}")
        return (edges[key] if key in edges else edges[key[::-1]])["info"]

    @cached_property
    def _node0(self) -> NodeParts:
        """Node 0's devices and links as ``node_graph`` lays them out, recorded without networkx."""
        return node_graph(self.spec, 0, self.gpu, NodeParts())

    @cached_property
    def _routes(self) -> route_cache.RouteTable:
        """Node 0's routes found so far by any run of a node wired alike (hardware/route_cache.py)."""
        return route_cache.table(self._node0.signature())

    @cached_property
    def _node0_graph(self) -> nx.Graph:
        """Node 0's graph, for finding routes not in the route table (networkx)."""
        import networkx as nx

        g = nx.Graph()
        g.add_nodes_from(self._node0.nodes.items())
        g.add_edges_from((u, v, attrs) for (u, v), attrs in self._node0.edges.items())
        if not nx.is_connected(g):
            parts = sorted(sorted(c) for c in nx.connected_components(g))
            raise ScenarioError(
                f"topology '{self.spec.name}': a node's devices are not all connected "
                f"({len(parts)} separate groups, e.g. {', '.join(parts[-1][:4])})"
            )
        return g


class NodeParts:
    """A node's devices (name: attributes) and links ((u, v): attributes) as ``node_graph`` adds them to a
    graph, recorded without networkx: routing reads link attributes from it, and its signature names the node
    layout in the route cache."""

    def __init__(self):
        self.nodes: dict[str, dict] = {}
        self.edges: dict[tuple[str, str], dict] = {}

    def add_node(self, name: str, **attrs) -> None:
        self.nodes.setdefault(name, {}).update(attrs)

    def add_edge(self, u: str, v: str, **attrs) -> None:
        self.add_node(u)
        self.add_node(v)
        self.edges[(u, v)] = attrs

    def signature(self) -> str:
        """Every device and every link with its cost and latency: what a route depends on."""
        devices = ",".join(sorted(self.nodes))
        links = sorted(f"{u}|{v}|{a['cost']!r}|{a['info'].latency_s!r}" for (u, v), a in self.edges.items())
        return devices + "\n" + "\n".join(links)


def _link_attrs(kind: str, GBps: float, latency_us: float, spec: TopologySpec) -> dict:
    """Edge attributes of one link: its LinkInfo (bandwidth = nominal x the topology's efficiency for that kind)
    and the routing cost in seconds per byte (latency breaks ties)."""
    bw = GBps * 1e9 * getattr(spec.efficiency, kind)
    return {"info": LinkInfo(kind, bw, latency_us * 1e-6), "cost": 1.0 / bw + latency_us * 1e-12}


def _uplink_attrs(spec: TopologySpec) -> dict:
    """A leaf switch's uplinks to the spine as one link: its ports' bandwidth over the oversubscription."""
    n, fab = spec.node, spec.fabric
    ports_per_leaf = fab.nodes_per_leaf * (1 if fab.rail_optimized else n.nics)
    GBps = ports_per_leaf * n.nic_bandwidth_gbps / 8 / fab.oversubscription
    return _link_attrs(n.nic_kind, GBps, fab.switch_latency_us, spec)


def leaf_name(spec: TopologySpec, node: int, nic: int) -> str:
    """The leaf switch that NIC ``nic`` of compute node ``node`` plugs into: one leaf per rail per group of
    ``nodes_per_leaf`` nodes when rail-optimized, else one leaf per group."""
    group = node // spec.fabric.nodes_per_leaf
    return f"g{group}.leaf{nic}" if spec.fabric.rail_optimized else f"g{group}.leaf"


def fabric_graph(spec: TopologySpec, num_nodes: int) -> nx.Graph:
    """The switches of a (rail-optimized) two-level fat tree: leaves, and a spine joining them when there is
    more than one. A leaf's uplink carries its ports' bandwidth divided by the oversubscription."""
    import networkx as nx

    n, fab = spec.node, spec.fabric
    g = nx.Graph()
    num_groups = -(-num_nodes // fab.nodes_per_leaf)
    rails = n.nics if fab.rail_optimized else 1
    for group in range(num_groups):
        for r in range(rails):
            g.add_node(leaf_name(spec, group * fab.nodes_per_leaf, r), kind="leaf", group=group)
    if num_groups * rails > 1:
        uplink = _uplink_attrs(spec)
        leaves = list(g)
        g.add_node("spine", kind="spine")
        for leaf in leaves:
            g.add_edge(leaf, "spine", **uplink)
    return g


def node_graph(spec: TopologySpec, k: int, gpu: GPU, g=None):
    """Compute node ``k``'s devices and links (names prefixed ``n{k}.``), added to ``g`` (a networkx graph or
    a ``NodeParts``) or a new graph: CPUs and host memory, PCIe switches, GPUs (and the NVSwitch), NICs
    (attribute ``leaf``: their leaf switch) and NVMe drives."""
    if g is None:
        import networkx as nx

        g = nx.Graph()
    n = spec.node
    kinds: dict[tuple, dict] = {}  # every node repeats the same few link kinds: one attribute set each

    def link(u: str, v: str, kind: str, GBps: float, latency_us: float) -> None:
        key = (kind, GBps, latency_us)
        if key not in kinds:
            kinds[key] = _link_attrs(kind, GBps, latency_us, spec)
        g.add_edge(u, v, **kinds[key])

    nvlink_GBps = n.nvlink_bandwidth_GBps or gpu.nvlink_bandwidth_GBps
    pcie_GBps = n.pcie_bandwidth_GBps or gpu.pcie_bandwidth_GBps

    def attach(p: str, device: str, i: int, count: int, kind: str = "pcie", GBps: float = pcie_GBps,
               latency_us: float = n.pcie_latency_us) -> None:  # fmt: skip
        """Device i of ``count`` in node ``p`` hangs off PCIe switch i * switches // count (spread evenly)."""
        link(p + device, p + f"pcie{i * n.pcie_switches // max(count, 1)}", kind, GBps, latency_us)

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
            p + f"pcie{sw}", p + f"cpu{sw * n.cpus // n.pcie_switches}", "pcie", pcie_GBps, n.pcie_latency_us
        )
    if n.intra_node == "nvswitch":
        g.add_node(p + "nvswitch", kind="nvswitch")
    for i in range(n.gpus):
        g.add_node(p + f"gpu{i}", kind="gpu", node=k, local=i)
        attach(p, f"gpu{i}", i, n.gpus)
        if n.intra_node == "nvswitch":
            link(p + f"gpu{i}", p + "nvswitch", "nvlink", nvlink_GBps, n.nvlink_latency_us)
    for i in range(n.nics):
        g.add_node(p + f"nic{i}", kind="nic", leaf=leaf_name(spec, k, i), node=k)
        attach(p, f"nic{i}", i, n.nics)
    for d in range(n.nvme_drives):
        g.add_node(p + f"nvme{d}", kind="nvme")
        attach(p, f"nvme{d}", d, n.nvme_drives, "nvme", n.nvme_bandwidth_GBps, n.nvme_latency_us)
    return g


def build_graph(spec: TopologySpec, num_nodes: int, gpu: GPU, wired: int | None = None) -> nx.Graph:
    """Wire ``num_nodes`` identical nodes into a (rail-optimized) two-level fat tree: every node's graph, the
    switches, and each NIC's link to its leaf. ``wired``: only the first that many nodes' devices (the
    switches are all there), for drawing part of a big cluster."""
    g = fabric_graph(spec, num_nodes)
    nic = _link_attrs(spec.node.nic_kind, spec.node.nic_bandwidth_gbps / 8, spec.node.nic_latency_us, spec)
    for k in range(num_nodes if wired is None else min(wired, num_nodes)):
        node_graph(spec, k, gpu, g)
        for i in range(spec.node.nics):
            g.add_edge(f"n{k}.nic{i}", leaf_name(spec, k, i), **nic)
    return g
