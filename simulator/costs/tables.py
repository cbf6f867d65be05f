"""The lookups a run uses from its cost table: the table's rows (``simulator/tables``) joined to this cluster's
roofline, so a measured row corrects the model relative to the shape's roofline (``tables/lookup.py``)."""

from __future__ import annotations

import warnings
from functools import partial

from simulator.costs.compute import shape_roofline_s
from simulator.tables.format import CostTable, CostTableWarning
from simulator.tables.lookup import CollectiveLookup, KernelLookup, Layered
from simulator.tables.select import collective_rows_for


def table_lookups(
    tables: CostTable | list[CostTable] | None, cluster
) -> tuple[KernelLookup | Layered | None, CollectiveLookup | Layered | None, dict]:
    """The kernel and collective lookups a run uses, and what it says about them (``Metrics.cost_tables``).
    Several tables are layered: a cost comes from the first that has it (a user's table over the shipped one).
    Lookups are built once per table and GPU (kernels) or cluster (collectives) and kept with the table."""
    tables = [tables] if isinstance(tables, CostTable) else list(tables or [])
    if not tables:
        return None, None, {"table": None}
    layers = [_one(t, cluster) for t in tables]
    kernels = [k for k, _, _ in layers if k is not None]
    colls = [c for _, c, _ in layers if c is not None]
    info = layers[0][2]
    if len(tables) > 1:
        info = {
            **info,
            "table": " over ".join(t.label for t in tables),
            "kernel_rows": sum(len(t.kernels) for t in tables),
            "collective_rows": sum(x[2]["collective_rows"] for x in layers),
            "notes": [n for x in layers for n in x[2]["notes"]],
        }
    pick = lambda xs: None if not xs else xs[0] if len(xs) == 1 else Layered(xs)  # noqa: E731
    return pick(kernels), pick(colls), info


def _one(table: CostTable, cluster) -> tuple[KernelLookup | None, CollectiveLookup | None, dict]:
    gpu, notes = cluster.gpu, []
    kernels = None
    if table.kernels:
        key = ("kernels", gpu.name)
        if key not in table.lookups:
            table.lookups[key] = KernelLookup(table.kernels, partial(shape_roofline_s, gpu))
        kernels = table.lookups[key]
        if table.meta.gpu not in (None, gpu.lineage):
            device = table.meta.device.model or "an unnamed device"
            notes.append(f"kernels measured on {table.meta.gpu} ({device}), used for {gpu.name} as asked")
            warnings.warn(f"--kernels {table.label}: {notes[-1]}", CostTableWarning, stacklevel=4)
    key = ("collectives", cluster.spec.model_dump_json())
    if key not in table.lookups:
        nvlink = cluster.spec.node.nvlink_bandwidth_GBps or gpu.nvlink_bandwidth_GBps
        rows, why = collective_rows_for(table, cluster.spec, nvlink, cluster.gpu.lineage)
        table.lookups[key] = (CollectiveLookup(rows) if rows else None, len(rows), why)
    colls, used, why = table.lookups[key]
    if why:
        notes.append(why + ": those collectives are modelled")
    info = {"table": table.label, "kernel_rows": len(table.kernels), "collective_rows": used, "notes": notes}
    return kernels, colls, info
