"""Reading and writing cost-table directories (the format is ``format.py``).

Rows are validated as they are read: a bad cell is one line naming the file, the line and the column. Writers
write a complete table next to the target and rename it into place, so an interrupted write never leaves half a
table.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import stat
import tempfile
from dataclasses import asdict, fields
from pathlib import Path

import yaml
from pydantic import ValidationError

from simulator import paths
from simulator.errors import ScenarioError
from simulator.scenario.files import read_bytes, read_text, read_yaml
from simulator.scenario.section import MAX_GPUS
from simulator.tables.format import (
    COLLECTIVE_OPS,
    DTYPES,
    KERNEL_FIELDS,
    KERNEL_OPS,
    PASSES,
    CollectiveRow,
    CostTable,
    KernelRow,
    TableMeta,
    is_shipped,
)
from simulator.tables.lookup import SHAPED

# -- reading ----------------------------------------------------------------------------------------------------
# One table file holds at most this many bytes and rows (a full calibration is a few thousand rows), and no cell
# is past 1e18 (bytes, microseconds, ranks all far below; int(float("1e400")) overflowed)
MAX_TABLE_BYTES = 256 * 2**20
MAX_TABLE_ROWS = 1_000_000
MAX_CELL = 1e18


def _cell(text: str, kind: type, where: str, column: str, optional: bool):
    text = (text or "").strip()
    if not text:
        if optional:
            return None
        raise ScenarioError(f"{where}: column '{column}' is empty")
    if kind is str:
        return text
    try:
        value = float(text)
    except ValueError:
        raise ScenarioError(f"{where}: column '{column}': expected a number (got '{text[:40]}')") from None
    if not math.isfinite(value) or abs(value) > MAX_CELL:
        raise ScenarioError(f"{where}: column '{column}': expected a finite number (got '{text[:40]}')")
    return int(value) if kind is int else value


def _rows(path: Path, cls, required: tuple[str, ...], check) -> list:
    """Rows of ``cls`` from a CSV (or Parquet) file; every problem names the file, line and column."""
    # each column's type (the field's annotation before any "| None") and whether it may be empty, once per file
    kinds = {
        f.name: (
            {"int": int, "float": float, "str": str}[f.type.split(" |")[0].strip()],
            f.name not in required,
        )
        for f in fields(cls)
    }
    records = _records(path)
    out = []
    for line, rec in records:
        where = f"{path} line {line}"
        missing = [c for c in required if c not in rec]
        if missing:
            raise ScenarioError(f"{path}: missing column(s) {', '.join(missing)}")
        values = {}
        for col, text in rec.items():
            kind = kinds.get(col)
            if kind is None:
                continue
            value = _cell(text, kind[0], where, col, optional=kind[1])
            if value is not None:
                values[col] = value
        row = cls(**values)
        check(row, where)
        out.append(row)
    return out


def _records(path: Path) -> list[tuple[int, dict[str, str]]]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ScenarioError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
        read_bytes(path, limit=MAX_TABLE_BYTES)  # checked: a regular file within the size limit
        try:
            meta = pq.read_metadata(path)
            if meta.num_rows > MAX_TABLE_ROWS:
                raise ScenarioError(
                    f"{path}: more than {MAX_TABLE_ROWS:,} rows (the limit of one table file)"
                )
            data = pq.read_table(path).to_pylist()
        except ScenarioError:
            raise
        except Exception as e:  # pyarrow raises many kinds for a bad file
            raise ScenarioError(f"{path}: not a readable Parquet file ({type(e).__name__})") from None
        return [(i + 1, {k: "" if v is None else str(v) for k, v in r.items()}) for i, r in enumerate(data)]
    text = read_text(path, limit=MAX_TABLE_BYTES)  # a regular file, bounded, UTF-8
    reader = csv.DictReader(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    out = []
    try:
        if not reader.fieldnames:
            raise ScenarioError(f"{path}: no header line")
        for rec in reader:
            if None in rec:
                raise ScenarioError(f"{path} line {reader.line_num}: more cells than header columns")
            out.append((reader.line_num, rec))
            if len(out) > MAX_TABLE_ROWS:
                raise ScenarioError(
                    f"{path}: more than {MAX_TABLE_ROWS:,} rows (the limit of one table file)"
                )
    except csv.Error as e:  # a field over csv's size limit, a NUL byte
        raise ScenarioError(f"{path} line {reader.line_num + 1}: not readable CSV ({e})") from None
    return out


def _check_kernel(row: KernelRow, where: str) -> None:
    if row.op not in KERNEL_OPS:
        raise ScenarioError(
            f"{where}: column 'op': unknown kernel '{row.op}'; one of {', '.join(KERNEL_OPS)}"
        )
    if row.dtype not in DTYPES:
        raise ScenarioError(f"{where}: column 'dtype': '{row.dtype}' is not one of {', '.join(DTYPES)}")
    if row.direction not in PASSES:
        raise ScenarioError(f"{where}: column 'direction': '{row.direction}' is not forward or backward")
    if min(row.m, row.n, row.batch) < 1 or row.k < 0:
        raise ScenarioError(
            f"{where}: shape m={row.m} n={row.n} k={row.k} batch={row.batch} must be positive"
        )
    if row.op in SHAPED and row.k < 1:
        raise ScenarioError(f"{where}: column 'k': a {row.op} needs k >= 1")
    if row.median_us <= 0:
        raise ScenarioError(f"{where}: column 'median_us': must be > 0 (got {row.median_us})")


def _check_collective(row: CollectiveRow, where: str) -> None:
    if row.op not in COLLECTIVE_OPS:
        raise ScenarioError(
            f"{where}: column 'op': unknown collective '{row.op}'; one of {', '.join(COLLECTIVE_OPS)}"
        )
    if row.ranks < 2 or row.nodes < 1 or row.ranks_per_node < 1:
        raise ScenarioError(f"{where}: ranks ({row.ranks}) must be >= 2, nodes and ranks_per_node >= 1")
    if row.nodes * row.ranks_per_node != row.ranks:
        raise ScenarioError(
            f"{where}: nodes ({row.nodes}) x ranks_per_node ({row.ranks_per_node}) = "
            f"{row.nodes * row.ranks_per_node}, but ranks is {row.ranks}"
        )
    if row.bytes <= 0 or row.median_us <= 0:
        raise ScenarioError(f"{where}: bytes and median_us must be > 0")


def row_problem(row: KernelRow | CollectiveRow) -> str | None:
    """Why ``row`` cannot be in a table (the checks reading applies, and finite numbers within the cell
    limit), or None: an importer skips such rows, so every table it writes is one ``run --kernels`` reads."""
    for f in fields(row):
        value = getattr(row, f.name)
        number = isinstance(value, float | int) and not isinstance(value, bool)
        if number and (not math.isfinite(value) or abs(value) > MAX_CELL):
            return f"{f.name} is {value:g}, not a finite number"
    try:
        (_check_kernel if isinstance(row, KernelRow) else _check_collective)(row, "row")
    except ScenarioError as e:
        return str(e).removeprefix("row: ")
    if isinstance(row, CollectiveRow) and row.ranks > MAX_GPUS:
        return f"{row.ranks} ranks; a simulation holds at most {MAX_GPUS:,}"
    return None


def _table_file(directory: Path, stem: str) -> Path | None:
    for suffix in (".csv", ".parquet"):
        if (directory / f"{stem}{suffix}").is_file():
            return directory / f"{stem}{suffix}"
    return None


def read_table(directory: str | Path) -> CostTable:
    """Read a table directory; one clear :class:`ScenarioError` per problem."""
    directory = Path(directory)
    if not paths.is_dir(directory, "kernels"):
        raise ScenarioError(f"kernels: '{directory}' is not a table directory")
    meta_path = directory / "table.yaml"
    if not meta_path.is_file():
        raise ScenarioError(
            f"{directory}: no table.yaml (a table is a directory with table.yaml + CSV files)"
        )
    # bounded (UTF-8, size, depth, alias expansion) unless it is one of the package's own
    data = read_yaml(meta_path, shipped=is_shipped(directory))
    try:
        meta = TableMeta.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "table.yaml"
        raise ScenarioError(f"{meta_path}: {loc}: {err['msg']}") from None
    kernels_path = _table_file(directory, "kernels")
    coll_path = _table_file(directory, "collectives")
    if kernels_path is None and coll_path is None:
        raise ScenarioError(f"{directory}: neither kernels.csv nor collectives.csv")
    kernels = (
        _rows(kernels_path, KernelRow, ("op", "dtype", "m", "median_us"), _check_kernel)
        if kernels_path
        else []
    )
    colls = (
        _rows(
            coll_path,
            CollectiveRow,
            ("op", "ranks", "nodes", "ranks_per_node", "bytes", "median_us"),
            _check_collective,
        )
        if coll_path
        else []
    )
    return CostTable(meta, kernels, colls, directory)


# -- writing ----------------------------------------------------------------------------------------------------
KERNEL_COLUMNS = list(KERNEL_FIELDS)
COLLECTIVE_COLUMNS = [f.name for f in fields(CollectiveRow)]


def _format(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e18 else f"{value:.10g}"
    return str(value)


def write_csv(path: Path, rows: list, columns: list[str]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            d = asdict(r)
            w.writerow([_format(d[c]) for c in columns])


def check_table_dir(directory: str | Path, option: str = "--out") -> None:
    """Where a table will be written: a missing path, an empty directory or a table directory; a file, device
    or a directory of other things is refused before any work (it would have been renamed aside and lost)."""
    directory = Path(directory)
    st = paths.lookup(directory, option)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise ScenarioError(
            f"{option} {directory}: exists and is not a directory (a cost table is a directory of table.yaml and "
            "CSV files): give a new path or a table directory"
        )
    if not (directory / "table.yaml").is_file() and any(directory.iterdir()):
        raise ScenarioError(
            f"{option} {directory}: holds other files and no table.yaml: give a new or empty directory, or a "
            "table directory"
        )


def read_existing(directory: str | Path, option: str = "--out") -> CostTable | None:
    """The table already at an output directory (None: none there yet); one that cannot be read says how to get
    out of it instead of failing the same way on every import."""
    directory = Path(directory)
    check_table_dir(directory, option)
    if not (directory / "table.yaml").is_file():
        return None
    try:
        return read_table(directory)
    except ScenarioError as e:
        raise ScenarioError(
            f"{option} {directory}: holds a table that cannot be read ({e}); repair or delete that file, or "
            "write to a new directory"
        ) from None


def write_table(directory: str | Path, table: CostTable) -> Path:
    """Write ``table`` to ``directory`` atomically: a complete copy is written beside it, then swapped in (the
    old copy moved to a fresh hidden name and removed)."""
    directory = Path(directory)
    check_table_dir(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    old = None
    try:
        meta = table.meta.model_dump(exclude_defaults=True)
        (tmp / "table.yaml").write_text(
            yaml.safe_dump(meta, sort_keys=False, allow_unicode=True), encoding="utf-8"
        )
        if table.kernels:
            write_csv(tmp / "kernels.csv", table.kernels, KERNEL_COLUMNS)
        if table.collectives:
            write_csv(tmp / "collectives.csv", table.collectives, COLLECTIVE_COLUMNS)
        if directory.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
            os.replace(directory, old)  # onto the fresh empty directory
            os.replace(tmp, directory)
        else:
            os.replace(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return directory
