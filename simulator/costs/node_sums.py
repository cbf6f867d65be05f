"""The sums a communication pattern's hops add up per node and per leaf switch (``costs/traffic.py``,
``LinkLoads.loads``), with rows for the nodes still open: touched so far, and by a later chunk of hops too."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np


def index_dtype(largest: int) -> np.dtype:
    """The narrowest signed integer type holding -1 to ``largest``: per-node index arrays at 16,384 nodes take
    32 KiB in int16 instead of 64 KiB in int32 (they are the part of a pattern's sums that grows with the
    cluster)."""
    for t in (np.int8, np.int16, np.int32):
        if largest <= np.iinfo(t).max:
            return np.dtype(t)
    return np.dtype(np.int64)


# Leaves per block of the per-leaf sums (2 KiB a block and sum)
LEAF_BLOCK = 256


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
    flows: bool = False  # whether to count flows per leaf too (ECMP hashes flows, not bytes)
    rails: tuple | None = None  # rail families (costs/rails.py): one column per node for these local GPUs
    leaf_units: dict = field(default_factory=dict)  # "up" | "down" -> {block: units of its LEAF_BLOCK leaves}
    leaf_flows: dict = field(default_factory=dict)  # the same, only with ``flows``
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
        self.local = {uv: _grown(w, len(new)) for uv, w in self.local.items()}
        self.out, self.into = _grown(self.out, len(new)), _grown(self.into, len(new))

    def add_fabric(
        self, leaf_a: np.ndarray, leaf_b: np.ndarray, share: np.ndarray, leaves: int, star: bool, qps: int
    ) -> None:
        """Hops from leaf switch ``leaf_a`` to ``leaf_b`` (of ``leaves``): on a two-level fat tree (``star``) those
        between two leaves onto the source leaf's uplink and the destination's downlink, each hop a connection of
        ``qps`` flows (a sampled all-to-all rotation stands for ``share`` of them) where ECMP hashes flows;
        otherwise per pair of leaves, to be routed on the switch graph."""
        if not star:
            pairs, inverse = np.unique(leaf_a * leaves + leaf_b, return_inverse=True)
            for p, units in zip(pairs.tolist(), np.bincount(inverse, share).tolist(), strict=True):
                self.leaf_pairs[p] += units
            return
        cross = leaf_a != leaf_b
        if not cross.any():
            return
        leaf_a, leaf_b, share = leaf_a[cross], leaf_b[cross], share[cross]
        flows = np.maximum(share, 1.0) * qps if self.flows else None
        self.add_leaves("up", leaf_a, share, flows)
        self.add_leaves("down", leaf_b, share, flows)

    def add_leaves(self, name: str, leaf: np.ndarray, units: np.ndarray, flows: np.ndarray | None) -> None:
        """Add ``units`` (and ``flows``) per hop onto leaf ``leaf`` of each hop, ``name`` "up" or "down", in blocks
        of LEAF_BLOCK leaves: a pattern holds the blocks it touches, not the span between the leaves it touches
        (the embedding all-reduce between the first and the last stage touches both ends of the fabric)."""
        block, at = np.divmod(leaf, LEAF_BLOCK)
        present = np.flatnonzero(np.bincount(block))  # the blocks touched, numbered 0, 1, ... in order
        if len(present) > 1:
            number = np.zeros(int(present[-1]) + 1, dtype=np.int64)
            number[present] = np.arange(len(present))
            at = number[block] * LEAF_BLOCK + at
        size = len(present) * LEAF_BLOCK
        for d, w in ((self.leaf_units, units), (self.leaf_flows, flows)):
            if w is None:
                continue
            blocks = d.setdefault(name, {})
            rows = np.bincount(at, w, minlength=size).reshape(-1, LEAF_BLOCK)
            for b, row in zip(present.tolist(), rows, strict=True):
                if b in blocks:
                    blocks[b] += row
                else:
                    blocks[b] = row.copy()

    def close(self, done: np.ndarray) -> None:
        """Drop the rows where ``done`` holds."""
        keep = ~done
        self.row[self.nodes[done]] = -1
        self.nodes = self.nodes[keep]
        self.row[self.nodes] = np.arange(len(self.nodes), dtype=self.row.dtype)
        self.local = {uv: w[keep] for uv, w in self.local.items()}
        self.out, self.into = self.out[keep], self.into[keep]


def _grown(a: np.ndarray, rows: int) -> np.ndarray:
    """``a`` with ``rows`` rows of zeros after it, in one new array (a concatenation with a block of zeros makes
    the block too: 128 KiB more at once for 2,048 new nodes' [node x GPU] sums)."""
    out = np.zeros((len(a) + rows, *a.shape[1:]))
    out[: len(a)] = a
    return out


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
