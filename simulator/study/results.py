"""A sweep's results as files: ``results.csv`` and, with pyarrow, ``results.parquet``, one row per point (nested
metrics as dotted columns, lists as JSON), each written to a temporary file and renamed into place."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from simulator import paths


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys; lists as JSON text (one cell)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, name + "."))
        elif isinstance(v, list):
            out[name] = json.dumps(v)
        else:
            out[name] = v
    return out


def write_results(rows: list[dict], out: Path) -> list[str]:
    """``results.csv`` and, with pyarrow, ``results.parquet``; each written to a temporary file and renamed."""
    columns: list[str] = []
    for r in rows:
        for k in r:
            if k not in columns:
                columns.append(k)
    written = []
    tmp = out / "results.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow(r)
    paths.install(tmp, out / "results.csv", "--out")
    written.append(str(out / "results.csv"))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return written
    mixed = {c for c in columns if len({_kind(r.get(c)) for r in rows} - {"none"}) > 1}
    table = pa.Table.from_pylist(
        [{c: (_text(r.get(c)) if c in mixed else _cell(r.get(c))) for c in columns} for r in rows]
    )
    tmp = out / "results.parquet.tmp"
    pq.write_table(table, tmp)
    paths.install(tmp, out / "results.parquet", "--out")
    written.append(str(out / "results.parquet"))
    return written


def _kind(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    return "text"


def _cell(v: Any) -> Any:
    return v if v is None or isinstance(v, bool | int | float | str) else json.dumps(v, default=str)


def _text(v: Any) -> Any:
    """A column whose cells are of several kinds (a varied field given 1 and "auto") is stored as text."""
    return None if v is None else v if isinstance(v, str) else json.dumps(v, default=str)
