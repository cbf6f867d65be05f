"""Which communication groups move bytes across nodes alike: a group's pattern over the nodes depends only on
which of its ranks share a node, in order, so one group of each shape stands for the others (at 131,072 GPUs: 64
data-parallel groups of 2,048, 16,384 tensor-parallel groups of 8; ``CollectiveModel.cross_node_fraction``)."""

from __future__ import annotations

import numpy as np

from simulator.hardware.placement import Groups


def distinct_rows(rows, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(index of each distinct row's first occurrence, how many rows equal it), in the order the rows first
    occur: what np.unique(rows, axis=0) finds, but sorting one int64 per row (a fixed pseudo-random projection
    of it) instead of the rows, a few thousand numbers at a time: 16,384 rows of 8 or 64 of 2,048 in a few ms,
    in memory that does not grow with the rows (the distinct projections seen so far are kept in a dict; a
    layout's groups come in a handful of shapes). Rows that project alike are checked equal; np.unique decides
    where two differ. ``rows``: an array, or an object whose ``[index]`` makes the rows asked for (``len`` and
    ``width`` say how many and how wide)."""
    n, width = len(rows), rows.shape[1] if isinstance(rows, np.ndarray) else rows.width
    if weights is None:
        weights = _projection_weights(width)
    step = max(1, (1 << 12) // max(1, width))  # rows at a time: 32 KiB of them
    first: dict[int, int] = {}  # projection -> its first row
    counts: dict[int, int] = {}
    alike = True
    for lo in range(0, n, step):
        block = rows[lo : lo + step]
        with np.errstate(over="ignore"):  # wraps around on overflow: still a function of the row
            keys = block @ weights
        distinct, at, inverse, count = np.unique(
            keys, return_index=True, return_inverse=True, return_counts=True
        )
        reps = []
        for k, i, c in zip(distinct.tolist(), at.tolist(), count.tolist(), strict=True):
            first.setdefault(k, lo + i)
            counts[k] = counts.get(k, 0) + c
            reps.append(first[k])
        alike = alike and np.array_equal(block, rows[np.asarray(reps)[inverse.ravel()]])
    if not alike:  # two rows projected alike: sort the rows themselves
        _, index, number = np.unique(rows[0:n], axis=0, return_index=True, return_counts=True)
    else:
        index, number = np.array(list(first.values())), np.array(list(counts.values()))
    order = np.argsort(index)  # in the order the rows first occur, whatever the projection
    return index[order], number[order]


class _Offsets:
    """Each group's nodes as offsets from its first rank's node, made for the rows asked for."""

    def __init__(self, array: np.ndarray, gpus_per_node: int):
        self.array, self.gpn, self.width = array, gpus_per_node, array.shape[1]

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index) -> np.ndarray:
        rel = self.array[index] // self.gpn
        return rel - rel[:, :1]


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
        array = np.asarray(groups.array if isinstance(groups, Groups) else groups, dtype=np.int64)  # no copy
        first, counts = distinct_rows(_Offsets(array, gpus_per_node))
        return [(groups[i], int(c)) for i, c in zip(first.tolist(), counts.tolist(), strict=True)]
    shapes: dict[tuple, list] = {}
    for grp in groups:
        key = tuple(g // gpus_per_node - grp[0] // gpus_per_node for g in grp)
        shapes.setdefault(key, [grp, 0])[1] += 1
    return [(g, c) for g, c in shapes.values()]
