"""Which communication groups move bytes across nodes alike: a group's pattern over the nodes depends only on
which of its ranks share a node, in order, so one group of each shape stands for the others (at 131,072 GPUs: 64
data-parallel groups of 2,048, 16,384 tensor-parallel groups of 8; ``CollectiveModel.cross_node_fraction``)."""

from __future__ import annotations

import numpy as np

from simulator.hardware.placement import Groups


def distinct_rows(rows: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(index of each distinct row's first occurrence, how many rows equal it), in the order the rows first
    occur: what np.unique(rows, axis=0) finds, but sorting one int64 per row (a fixed pseudo-random projection
    of it) instead of the rows: 16,384 rows of 8 or 64 of 2,048 in a few ms. Rows that project alike are checked
    equal; np.unique decides where two differ."""
    if weights is None:
        weights = _projection_weights(rows.shape[1])
    with np.errstate(over="ignore"):
        keys = rows @ weights  # wraps around on overflow: still a function of the row
    _, first, inverse, counts = np.unique(keys, return_index=True, return_inverse=True, return_counts=True)
    same = first[inverse.ravel()]  # each row's representative, checked a few thousand rows at a time
    step = max(1, 4096 // max(1, rows.shape[1]))
    if not all(
        np.array_equal(rows[lo : lo + step], rows[same[lo : lo + step]]) for lo in range(0, len(rows), step)
    ):
        _, first, counts = np.unique(rows, axis=0, return_index=True, return_counts=True)
    order = np.argsort(first)  # in the order the rows first occur, whatever the projection
    return first[order], counts[order]


def _projection_weights(n: int) -> np.ndarray:
    """``n`` fixed pseudo-random int64 weights in [1, 2^62): splitmix64 of 1..n (Steele et al., OOPSLA 2014),
    in numpy's wrapping unsigned arithmetic. Not numpy.random, whose import alone costs a short run 8 ms."""
    z = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(2)).astype(np.int64) | 1


def group_shapes(groups, gpus_per_node: int) -> list[tuple[tuple[int, ...], int]]:
    """(a representative group, how many groups share its shape): groups whose ranks sit on nodes at the same
    offsets from their first rank's node, in order, move bytes across nodes alike."""
    if isinstance(groups, Groups) or len({len(g) for g in groups}) == 1:
        rel = np.asarray(groups, dtype=np.int64) // gpus_per_node  # a new array: made relative in place
        rel -= rel[:, :1].copy()
        first, counts = distinct_rows(rel)
        return [(groups[i], int(c)) for i, c in zip(first.tolist(), counts.tolist(), strict=True)]
    shapes: dict[tuple, list] = {}
    for grp in groups:
        key = tuple(g // gpus_per_node - grp[0] // gpus_per_node for g in grp)
        shapes.setdefault(key, [grp, 0])[1] += 1
    return [(g, c) for g, c in shapes.values()]
