"""Routes inside a node, kept on disk between runs: each GPU's nearest NIC and the shortest path between two
devices of a node, as ``Cluster`` finds them with networkx, filed under a digest of the node's links (every
device pair and its cost in seconds per byte). A later run of the same node reads them and needs no networkx,
whose import took 0.07 of the quickstart's 0.32 s (2026-11-27); a node wired differently has another digest,
so nothing stale is read.

Where two paths are equally short, ``Cluster._find_path`` picks one by a rule of its own (device names in
natural order), not by networkx's order of search: a file holds what any run would find again.

Where: ``routes`` under ``paths.cache_root()`` (``$CLUSTERSIM_CACHE``, else ``~/.cache/clustersim``), beside
the parsed shipped tables; read after the file of the same digest in ``SHIPPED_DIR``, the routes of the shipped
scenarios' and validation cases' nodes. A file that cannot be read or written, or does not parse, is ignored:
the routes are found again. Routes found during a run are written when the process exits, one file per node
layout, replaced whole (a concurrent run's file is never half-written).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import re
from pathlib import Path

from simulator import paths

# bump when what a route means changes (Cluster._find_path, Cluster._find_nearest_nic); 2: ties broken by our rule
FORMAT = 2
# the routes of the nodes the shipped scenarios and validation cases run on, found the same way and shipped with
# the package (docs/generate_shipped_routes.py), so their first run needs no networkx either
SHIPPED_DIR = Path(__file__).parent / "routes"

_tables: dict[str, RouteTable] = {}  # one per node layout in this process, shared by its clusters
_grown: list[RouteTable] = []  # the tables to write at exit


def cache_dir() -> Path:
    """The directory of route files."""
    return paths.cache_root() / "routes"


class RouteTable:
    """The routes of one node layout found so far: ``nearest_nic`` (one NIC per local GPU) and ``paths``
    (``"a>b"``: the device names from a to b)."""

    def __init__(self, path: Path, shipped: Path | None = None):
        self.path = path
        self.nearest_nic: list[int] | None = None
        self.paths: dict[str, list[str]] = {}
        for source in (shipped, path):  # what the package ships, then what runs here found besides
            if source is not None:
                self._read(source)

    def _read(self, source: Path) -> None:
        try:
            data = json.loads(source.read_text())
            near, found = data["nearest_nic"], data["paths"]
            if data.get("format") != FORMAT or not isinstance(found, dict):
                return
            if near is not None and not all(isinstance(x, int) for x in near):
                return
            if not all(isinstance(p, list) and all(isinstance(x, str) for x in p) for p in found.values()):
                return
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return
        self.nearest_nic = near if near is not None else self.nearest_nic
        self.paths.update(found)

    def set_nearest_nic(self, nics: list[int]) -> None:
        self.nearest_nic = list(nics)
        self._changed()

    def add_path(self, a: str, b: str, path: list[str]) -> None:
        self.paths[f"{a}>{b}"] = list(path)
        self._changed()

    def _changed(self) -> None:
        if self not in _grown:
            if not _grown:
                atexit.register(write_all)
            _grown.append(self)

    def write(self) -> None:
        """Replace the file with this table (``paths.keep``: nothing where that fails)."""
        data = {"format": FORMAT, "nearest_nic": self.nearest_nic, "paths": self.paths}
        paths.keep(self.path, json.dumps(data, separators=(",", ":")).encode())


def table(signature: str) -> RouteTable:
    """The route table of the node layout ``signature`` describes (read from disk once per process)."""
    digest = hashlib.sha256(f"{FORMAT}\n{signature}".encode()).hexdigest()[:32]
    if digest not in _tables:
        _tables[digest] = RouteTable(cache_dir() / f"{digest}.json", SHIPPED_DIR / f"{digest}.json")
    return _tables[digest]


def write_all() -> None:
    """Write every table that grew in this process (at exit; a test may call it)."""
    while _grown:
        _grown.pop().write()


def natural_order(path: list[str]) -> list[tuple]:
    """A path's sort key, device names with their numbers compared as numbers (``gpu8`` before ``gpu10``): of
    equally short paths ``Cluster._find_path`` keeps the first by it."""
    return [tuple((t, int(d) if d else -1) for t, d in re.findall(r"(\D+)(\d*)", name)) for name in path]
