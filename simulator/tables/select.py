"""Which cost table a run uses, and which of its rows apply to the run's cluster.

``kernels:`` (scenario) / ``--kernels`` (command line): ``auto`` is the shipped table of the cluster's GPU where
there is one, ``none`` the pure model, else a shipped table's name or a table directory. A directory is layered
over the shipped table of the cluster's GPU (its rows first, the shipped rows where it has none, then the
model), unless ``kernels_only`` / ``--kernels-only`` asks for it alone. Kernel rows apply to
the GPU they name (another GPU's rows are used when asked, with a warning); collective rows only to a cluster
whose fabric matches the table's ``system``, so what-ifs with other links fall back to the model.
"""

from __future__ import annotations

from dataclasses import astuple
from functools import cache
from pathlib import Path

from simulator import paths
from simulator.errors import ScenarioError
from simulator.tables.format import SHIPPED_DIR, CollectiveRow, CostTable, KernelColumns, is_shipped
from simulator.tables.io import read_table


def shipped_tables() -> dict[str, Path]:
    return {p.name: p for p in sorted(SHIPPED_DIR.iterdir()) if (p / "table.yaml").is_file()}


def _names() -> str:
    return ", ".join(shipped_tables()) or "none shipped"


def _stamp(path: Path) -> tuple:
    """When the table's files last changed: a table rewritten in place is read again."""
    return tuple(p.stat().st_mtime_ns for p in sorted(path.iterdir()) if p.is_file())


@cache
def _load(path: str, stamp: tuple) -> CostTable:
    if is_shipped(path):
        return _cached_shipped(Path(path), stamp)
    return read_table(path)


CACHE_VERSION = 2  # bump when CostTable, KernelRow or CollectiveRow change shape


def cache_dir() -> Path:
    """Where parsed shipped tables are kept between processes: ``tables`` under ``paths.cache_root()``."""
    return paths.cache_root() / "tables"


def _cached_shipped(path: Path, stamp: tuple) -> CostTable:
    """A shipped table parsed once per install: its metadata, kernel rows as columns (``KernelColumns``) and
    collective rows as tuples, pickled under cache_dir() (``paths.pickled``), keyed by the table's name, files'
    sizes and modification times and the cache version (parsing its CSVs took ~0.1 s of every process's start;
    unpickling takes about a millisecond)."""
    files = sorted(p for p in path.iterdir() if p.is_file())

    def parse() -> tuple:
        table = read_table(path)
        return table.meta, KernelColumns.of(table.kernels).columns, [astuple(r) for r in table.collectives]

    key = (CACHE_VERSION, [(p.name, p.stat().st_size) for p in files], stamp)
    meta, kernels, collectives = paths.pickled(cache_dir(), path.name, key, parse)
    return CostTable(meta, KernelColumns(kernels), [CollectiveRow(*r) for r in collectives], path)


def check_choice(choice: str, field: str = "kernels", base_dir: Path | None = None) -> str:
    """A valid ``kernels`` value: auto, none, a shipped table's name, or an existing table directory (made
    absolute, relative to ``base_dir`` or the working directory)."""
    if choice in ("auto", "none") or choice in shipped_tables():
        return choice
    path = Path(choice)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    if not paths.is_dir(path, field):
        raise ScenarioError(
            f"{field}: '{choice}' is neither a table directory nor a shipped table ({_names()}); "
            "use auto or none for the defaults"
        )
    return str(path.resolve())


def resolve_table(choice: str | None, gpu_name: str) -> CostTable | None:
    """The table ``choice`` names (see the module docstring), or None for the pure model."""
    if choice == "none":
        return None
    if choice is None or choice == "auto":
        path = shipped_tables().get(gpu_name)
        if path is None:
            return None
    else:
        path = (shipped_tables().get(choice) or Path(choice)).resolve()
    if not paths.is_dir(path, "kernels"):
        raise ScenarioError(f"kernels: '{choice}' is not a table directory")
    return _load(str(path), _stamp(path))


def resolve_tables(choice: str | None, gpu_name: str, only: bool = False) -> list[CostTable]:
    """The tables a run looks costs up in, first match wins: the one ``choice`` names and, for a table directory
    (not a shipped table) unless ``only``, the shipped table of ``gpu_name`` beneath it."""
    first = resolve_table(choice, gpu_name)
    if first is None:
        return []
    if only or choice in (None, "auto") or choice in shipped_tables():
        return [first]
    beneath = resolve_table("auto", gpu_name)
    return [first] if beneath is None or beneath.path == first.path else [first, beneath]


def collective_rows_for(
    table: CostTable, spec, nvlink_GBps: float, gpu_name: str | None = None
) -> tuple[list[CollectiveRow], str]:
    """The collective rows that describe the cluster of topology ``spec`` (with its what-if overrides), and
    why others were left out. Rows inside a node need the same intra-node fabric; rows across nodes also the
    same topology and NICs. ``nvlink_GBps`` is the cluster's NVLink bandwidth per GPU."""
    sys, node = table.meta.system, spec.node
    intra = {
        "intra_node": (sys.intra_node, node.intra_node),
        "nvlink_bandwidth_GBps": (sys.nvlink_bandwidth_GBps, nvlink_GBps),
    }
    inter = {
        "topology": (sys.topology, spec.name),
        "nics_per_node": (sys.nics_per_node, node.nics),
        "nic_bandwidth_gbps": (sys.nic_bandwidth_gbps, node.nic_bandwidth_gbps),
        "nic_kind": (sys.nic_kind, node.nic_kind),
    }

    def differ(checks: dict) -> list[str]:
        return [
            f"{k} {want} (cluster: {have})" for k, (want, have) in checks.items() if want not in (None, have)
        ]

    gpu = gpu_name or node.gpu  # the GPU's own name (node.gpu may be a GPU file's path)
    if table.meta.gpu not in (None, gpu):
        return [], f"collectives measured with {table.meta.gpu}, the cluster has {gpu}"
    if bad := differ(intra):
        return [], "collectives measured on " + ", ".join(bad)
    bad = differ(inter)
    rows = [r for r in table.collectives if r.nodes == 1 or not bad]
    return rows, ("multi-node collectives measured on " + ", ".join(bad)) if bad else ""
