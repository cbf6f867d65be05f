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
