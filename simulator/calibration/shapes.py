"""The distinct kernel shapes and collectives a scenario's simulation costs: what ``clustersim calibrate
kernels`` measures. Ordered by the time the model gives them in one iteration, most first, so that a run cut
short has measured what matters most."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from simulator.costs.host import HOST_GROUPS
from simulator.scenario.schema import Scenario
from simulator.tables.lookup import table_pass


@dataclass(frozen=True)
class KernelShape:
    op: str
    direction: str  # GEMMs: "forward" (their backward is GEMMs of other shapes)
    dtype: str
    m: int
    n: int
    k: int
    batch: int
    name: str  # the workload's name of (one of) the ops with this shape

    @property
    def key(self) -> tuple:
        return (self.op, self.direction, self.dtype, self.m, self.n, self.k, self.batch)


@dataclass(frozen=True)
class CollectiveShape:
    op: str
    ranks: int
    nodes: int
    ranks_per_node: int
    bytes: float
    name: str

    @property
    def key(self) -> tuple:
        return (self.op, self.ranks, self.nodes, self.ranks_per_node, float(self.bytes))


def costed_shapes(s: Scenario) -> tuple[list[KernelShape], list[CollectiveShape]]:
    """Every distinct kernel (with a table kind) and collective of one simulated iteration of ``s``."""
    from simulator.api import simulate  # the whole data flow, once, on the pure model

    r = simulate(s.model_copy(update={"kernels": "none"}))
    dtype = s.training.dtype  # FP8 training: its linear layers' GEMMs are fp8 (op.dtype), the rest bf16
    kernel_time: dict[KernelShape, float] = defaultdict(float)
    coll_time: dict[CollectiveShape, float] = defaultdict(float)
    gpn = r.cluster.gpus_per_node

    def group_shape(op: str, group: str, nbytes: float, name: str) -> CollectiveShape | None:
        if group in HOST_GROUPS or nbytes <= 0:
            return None
        grp = r.placement.groups(group)[0]
        if op == "send_recv":
            grp = grp[:2]
        if len(grp) < 2:
            return None
        nodes = len({g // gpn for g in grp})
        return CollectiveShape(op, len(grp), nodes, len(grp) // nodes, float(nbytes), name)

    seen_ops: dict[int, tuple] = {}
    for t in r.program.tasks:
        if t.group is None:
            if id(t.ops) in seen_ops:
                continue
            seen_ops[id(t.ops)] = t.ops
            for op in t.ops:
                if op.kind == "collective":
                    shape = group_shape(op.collective, op.group, op.bytes, op.name)
                    if shape:
                        coll_time[shape] += r.comm.standalone_time_s(op.collective, op.group, op.bytes)
                elif op.kernel:
                    direction = table_pass(op.kernel, op.direction)
                    kind = op.dtype or dtype
                    shape = KernelShape(op.kernel, direction, kind, op.m, op.n, op.k, op.batch, op.name)
                    kernel_time[shape] += r.compute.op_time_s(op)
        elif t.is_collective:
            shape = group_shape(t.kind, t.group, t.bytes, t.name)
            if shape:
                coll_time[shape] += r.comm.standalone_time_s(t.kind, t.group, t.bytes)
    return _distinct(kernel_time), _distinct(coll_time)


def _distinct(times: dict) -> list:
    """One shape per key (ops of one shape may carry different names), the most time first."""
    merged: dict[tuple, list] = {}
    for shape, seconds in times.items():
        merged.setdefault(shape.key, [0.0, shape])[0] += seconds
    return [shape for _, shape in sorted(merged.values(), key=lambda x: -x[0])]
