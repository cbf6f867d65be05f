"""Measurements made elsewhere (PyTorch profiler traces, nccl-tests logs) as rows of a cost table."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.hardware.gpus import gpu_catalogue
from simulator.tables.format import (
    CollectiveRow,
    CostTable,
    DeviceInfo,
    KernelRow,
    SourceInfo,
    SystemInfo,
    TableMeta,
)
from simulator.tables.io import read_existing, row_problem, write_table


def _plain(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower().replace("nvidia", ""))


def match_gpu(device_name: str) -> str | None:
    """The catalogue name of a device as the driver names it ("NVIDIA A100-SXM4-80GB" -> a100-sxm4-80gb)."""
    want = _plain(device_name)
    if not want:
        return None
    for name, gpu in gpu_catalogue().items():
        if want in {_plain(gpu.display_name), _plain(name), *(_plain(d) for d in gpu.device_names)}:
            return name
    return None


def _keep(rows: list, skipped: dict[str, int] | None) -> list:
    kept = []
    for row in rows:
        problem = row_problem(row)
        if problem is None:
            kept.append(row)
        elif skipped is not None:
            key = f"{row.op} row skipped: {problem}"
            skipped[key] = skipped.get(key, 0) + 1
    return kept


def merge_into(
    out: Path,
    kernels: list[KernelRow],
    collectives: list[CollectiveRow],
    source: SourceInfo,
    device_model: str = "",
    gpu: str | None = None,
    system: SystemInfo | None = None,
    skipped: dict[str, int] | None = None,
) -> CostTable:
    """Add rows to the table at ``out`` (made if missing; an existing one must describe the same GPU) and
    write it atomically. A row a table cannot hold (a time of zero, inf or NaN; a shape or group it cannot
    describe) is skipped and counted in ``skipped`` by reason."""
    kernels, collectives = _keep(kernels, skipped), _keep(collectives, skipped)
    if not kernels and not collectives:
        raise ScenarioError("nothing to import: no row could be read (see the notes above)")
    old = read_existing(out)
    if old is not None:
        if gpu and old.meta.gpu and gpu != old.meta.gpu:
            raise ScenarioError(f"--out {out}: holds a table for {old.meta.gpu}, these rows are for {gpu}")
        meta = old.meta.model_copy(update={"sources": (*old.meta.sources, source)})
        kernels, collectives = [*old.kernels, *kernels], [*old.collectives, *collectives]
    else:
        meta = TableMeta(
            name=out.name,
            gpu=gpu,
            description="Imported measurements (clustersim calibrate import).",
            device=DeviceInfo(model=device_model),
            system=system or SystemInfo(),
            date=datetime.date.today().isoformat(),
            method="imported: see sources",
            sources=(source,),
        )
    table = CostTable(meta, kernels, collectives, out)
    write_table(out, table)
    return table


def merge_trace(
    out: Path,
    trace: Path,
    source: str,
    gpu: str | None = None,
    licence: str = "the measurer's own",
    ranks: int | None = None,
    nodes: int = 1,
    ranks_per_node: int | None = None,
    require: str | None = None,
) -> tuple[CostTable, dict, str, str | None, int]:
    """A PyTorch profiler trace's kernel and collective rows (``kineto.import_trace``) added to the table at
    ``out``, as ``source``: for ``gpu`` (checked; None: the catalogue GPU the trace's device names, ``cpu`` for a
    CPU trace) or, with ``require``, for that GPU, which the trace must have run on. Returns the table, what the
    import found, the device's name, the GPU the rows are for and how many rows were read."""
    from simulator.calibration.importers.kineto import import_trace
    from simulator.hardware.gpus import get_gpu

    read_existing(out)  # a file, device or broken table at out: said before the trace is read
    if gpu:
        get_gpu(gpu, "--gpu")
    kernels, colls, info = import_trace(trace, ranks, nodes, ranks_per_node)
    model = str(info["device"].get("name", "")) if info["gpu_trace"] else "cpu"
    if require is not None:
        if not info["gpu_trace"]:
            raise ScenarioError(f"--trace {trace}: no GPU kernels (a CPU trace)")
        traced = match_gpu(model)
        if traced and traced != require:
            raise ScenarioError(f"--trace {trace}: traced on {traced}, the scenario runs on {require}")
        gpu = require
    gpu = gpu or (match_gpu(model) if info["gpu_trace"] else "cpu")
    rows = f"{len(kernels)} kernel, {len(colls)} collective"
    source_info = SourceInfo(rows=rows, source=source, licence=licence)
    table = merge_into(out, kernels, colls, source_info, model, gpu, skipped=info["skipped"])
    return table, info, model, gpu, len(kernels) + len(colls)
