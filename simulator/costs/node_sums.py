"""The sums a communication pattern's hops add up per node and per leaf switch (``costs/traffic.py``,
``LinkLoads.loads``), with rows for the nodes still open: touched so far, and by a later chunk of hops too."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Sums:
    """What LinkLoads.loads adds up over the chunks of a pattern's hops. Per open node (a row each: ``nodes``
    names them, ``row`` finds them), each node-local link's units from hops inside the node and each GPU's units
    off and onto the node (through its nearest NIC). A node's row is read into its link classes and dropped once
    no later chunk touches it, so the rows are the nodes a few chunks touch, not every node of the pattern. Per
    leaf switch (a two-level fat tree) the units and flows up and down, or per pair of leaves the units between
    them, for the whole pattern."""

    gpn: int
    row: np.ndarray  # [cluster node] -> its row, -1 where none
    nodes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    local: dict = field(default_factory=dict)  # node-local link -> [row]
    out: np.ndarray = field(init=False)  # [row, local GPU]
    into: np.ndarray = field(init=False)
    across: bool = False  # some hop crossed nodes
    leaf_units: dict = field(default_factory=dict)  # "up" | "down" -> per leaf from ``leaf_lo`` on
    leaf_flows: dict = field(default_factory=dict)
    leaf_lo: int = 0  # the first leaf the leaf sums hold: they span the leaves the pattern touched so far
    leaf_pairs: defaultdict = field(default_factory=lambda: defaultdict(float))

    def __post_init__(self) -> None:
        self.out, self.into = np.zeros((0, self.gpn)), np.zeros((0, self.gpn))

    def open(self, nodes: np.ndarray) -> None:
        """A row for each of ``nodes`` that has none."""
        new = np.sort(nodes[self.row[nodes] < 0])
        if not len(new):
            return
        # distinct by sorting (numpy's np.unique hashes: several times slower here)
        new = new[np.concatenate(([True], new[1:] != new[:-1]))]
        self.row[new] = np.arange(len(self.nodes), len(self.nodes) + len(new), dtype=self.row.dtype)
        self.nodes = np.concatenate((self.nodes, new))
        grow = lambda a: np.concatenate((a, np.zeros((len(new), *a.shape[1:]))))  # noqa: E731
        self.local = {uv: grow(w) for uv, w in self.local.items()}
        self.out, self.into = grow(self.out), grow(self.into)

    def leaf_slices(self, lo: int, hi: int) -> slice:
        """The per-leaf sums widened to hold leaves ``lo`` to ``hi`` - 1 (zeros where new), and where those
        leaves are in them: a stage's data-parallel pattern at 131,072 GPUs touches 824 of 6,560 leaves."""
        if not self.leaf_units:
            self.leaf_lo = lo
            for d in (self.leaf_units, self.leaf_flows):
                d["up"], d["down"] = np.zeros(hi - lo), np.zeros(hi - lo)
        start, end = min(lo, self.leaf_lo), max(hi, self.leaf_lo + len(self.leaf_units["up"]))
        if (start, end) != (self.leaf_lo, self.leaf_lo + len(self.leaf_units["up"])):
            before, after = self.leaf_lo - start, end - self.leaf_lo - len(self.leaf_units["up"])
            for d in (self.leaf_units, self.leaf_flows):
                for name in ("up", "down"):
                    d[name] = np.concatenate((np.zeros(before), d[name], np.zeros(after)))
            self.leaf_lo = start
        return slice(lo - self.leaf_lo, hi - self.leaf_lo)

    def close(self, done: np.ndarray) -> None:
        """Drop the rows where ``done`` holds."""
        keep = ~done
        self.row[self.nodes[done]] = -1
        self.nodes = self.nodes[keep]
        self.row[self.nodes] = np.arange(len(self.nodes), dtype=self.row.dtype)
        self.local = {uv: w[keep] for uv, w in self.local.items()}
        self.out, self.into = self.out[keep], self.into[keep]


class Peaks:
    """Per node link and stage set, the busiest node's seconds per unit so far: ``values[set, column[link]]``."""

    def __init__(self, sets: int):
        self.column: dict = {}
        self.values = np.zeros((sets, 0))

    def update(self, links: list, present: np.ndarray, peak: np.ndarray) -> None:
        """``peak[i, j]``: the busiest of some nodes of set ``present[i]`` on ``links[j]`` (each set once)."""
        new = [uv for uv in links if uv not in self.column]
        if new:
            self.column.update({uv: len(self.column) + k for k, uv in enumerate(new)})
            self.values = np.concatenate((self.values, np.zeros((len(self.values), len(new)))), axis=1)
        at = np.ix_(present, [self.column[uv] for uv in links])
        self.values[at] = np.maximum(self.values[at], peak)
