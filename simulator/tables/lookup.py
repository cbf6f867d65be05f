"""Measured costs first: an exact table row, else interpolation between measured neighbours, else the model.

Every cost says where it came from: ``measured`` (a row of exactly this shape), ``interpolated`` (derived from
measured rows), ``modelled`` (the roofline / alpha-beta model; the caller's fallback).

* GEMMs, batched GEMMs and FlashAttention (several shape dimensions). The ratio of each measured time to the
  GPU's roofline at that shape (``simulator/costs/compute.py``) is interpolated in log space, inverse-distance
  weighted over the 8 nearest rows in log2(shape); the query's roofline times that ratio is its time. This is
  interpolation of the achieved FLOP/s relative to the shape's roofline: the roofline carries the trends
  (FLOPs, wave quantization), the neighbours correct it locally. Used only inside the measured range of every
  dimension and with a row within a factor 2 of the query in every dimension; the achieved FLOP/s never exceeds
  the fastest neighbour's. Measured on the shipped A100 rows by leaving one model's shapes out at a time:
  median |error| 3.9%, 90th percentile 15% (A100; `python benchmarks/bench_lookups.py`).
* Memory-bound kernels and collectives (one size dimension: elements m x n, or bytes). Log-log interpolation
  between the two measured sizes around the query (equivalently, of the achieved bytes/s); above the largest
  measured size the largest size's bandwidth is kept (never extrapolated upwards), below the smallest the
  smallest size's time is a floor. A collective above its curve's range is the caller's to price
  (``CollectiveLookup.largest``; costs/collectives.py adds the model's time for the bytes beyond it).
* 16-bit formats stand in for each other (fp16 rows for a bf16 run, and back): such costs count as
  interpolated.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable
from math import exp, log, log2
from statistics import median
from typing import Any

import numpy as np

from simulator.tables.format import CollectiveRow, KernelColumns, KernelRow

MEASURED, INTERPOLATED, MODELLED = "measured", "interpolated", "modelled"
SHAPED = (
    "gemm",
    "batched_gemm",
    "grouped_gemm",
    "flash_attention",
)  # interpolated over their shape, relative to the roofline
GEMMS = ("gemm", "batched_gemm", "grouped_gemm")  # a pass of each is GEMMs of other shapes
NEIGHBOURS = 8
MAX_LOG2_GAP = 1.0  # the nearest measured row must lie within a factor 2 in every dimension
_SAME_WIDTH = {"fp16": "bf16", "bf16": "fp16"}

Cost = tuple[float, str]  # seconds, source
# (op, direction, dtype, m, n, k, batch) -> seconds, for ints or for integer arrays of many shapes at once
Roofline = Callable[..., Any]


def table_pass(op: str, direction: str) -> str:
    """The pass a table row of this kernel is looked up by: a GEMM's backward is GEMMs of other shapes (the
    workload lists them), so for GEMMs the pass does not matter and every row counts as forward."""
    return "forward" if op in GEMMS else direction


def work(op: str, direction: str, m: int, n: int, k: int, batch: int) -> float:
    """FLOPs of a shaped kernel: 2mnk per GEMM; causal FlashAttention 2bmnk forward, 2.5x that backward
    (Dao 2023, FlashAttention-2, Sec. 4: backward does 2.5 times the matmul work of forward)."""
    f = 2.0 * m * n * k * batch
    return f * 2.5 if op == "flash_attention" and direction == "backward" else f


def _features(op: str, m: int, n: int, k: int, batch: int) -> tuple[float, ...]:
    """log2 of the shape; a GEMM and its transpose (m <-> n) are the same problem for cuBLAS."""
    if op == "flash_attention":
        return (log2(m), log2(n), log2(k), log2(batch))
    a, b = (m, n) if m <= n else (n, m)
    return (log2(a), log2(b), log2(k)) if op == "gemm" else (log2(a), log2(b), log2(k), log2(batch))


def curve_cost(sizes: list[float], seconds: list[float], size: float) -> float:
    """Time at ``size`` on a measured curve (sorted ``sizes``): log-log between neighbours, the largest
    size's bandwidth above the range, the smallest size's time below it."""
    if size <= sizes[0]:
        return seconds[0]
    if size >= sizes[-1]:
        return seconds[-1] * size / sizes[-1]
    i = bisect_left(sizes, size)
    x0, x1, y0, y1 = log(sizes[i - 1]), log(sizes[i]), log(seconds[i - 1]), log(seconds[i])
    return exp(y0 + (y1 - y0) * (log(size) - x0) / (x1 - x0))


def _curves(points: Iterable[tuple[tuple, float, float]]) -> dict[tuple, tuple[list[float], list[float]]]:
    """(key, size, seconds) -> per key, sorted sizes and the median time at each size."""
    by_key: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key, size, seconds in points:
        by_key[key][size].append(seconds)
    out = {}
    for key, sizes in by_key.items():
        xs = sorted(sizes)
        out[key] = (xs, [median(sizes[x]) for x in xs])
    return out


class _Shaped:
    """Rows of one shaped kernel kind and dtype, ready for nearest-neighbour interpolation: ``rows``, their
    columns (as ``KernelColumns`` has them)."""

    def __init__(self, rows: dict[str, list], roofline: Roofline):
        self.op = op = rows["op"][0]
        m, n, k, batch = rows["m"], rows["n"], rows["k"], rows["batch"]
        self.x = np.array([_features(op, *shape) for shape in zip(m, n, k, batch, strict=True)])
        # every row at once: one kernel and dtype, and a direction that matters only where it is the same for all
        # (a GEMM's pass does not, table_pass)
        m, n, k, batch = (np.array(v, dtype=np.int64) for v in (m, n, k, batch))
        direction = rows["direction"][0]
        model = roofline(op, direction, rows["dtype"][0], m, n, k, batch)
        seconds = np.array(rows["median_us"]) * 1e-6
        self.log_ratio = np.log(seconds / model)
        self.rate = work(op, direction, m, n, k, batch) / seconds
        self.lo, self.hi = self.x.min(axis=0).tolist(), self.x.max(axis=0).tolist()

    def cost(self, direction: str, m: int, n: int, k: int, batch: int, roofline_s: float) -> float | None:
        q = _features(self.op, m, n, k, batch)
        if any(v < lo - 1e-9 or v > hi + 1e-9 for v, lo, hi in zip(q, self.lo, self.hi, strict=True)):
            return None
        gaps = self.x - np.array(q)
        d2 = np.einsum("ij,ij->i", gaps, gaps)
        # the NEIGHBOURS nearest rows, equal distances in table order (a grid of powers of two has many)
        if len(d2) > NEIGHBOURS:
            within = np.flatnonzero(d2 <= np.partition(d2, NEIGHBOURS - 1)[NEIGHBOURS - 1])
            near = within[np.argsort(d2[within], kind="stable")[:NEIGHBOURS]]
        else:
            near = np.argsort(d2, kind="stable")
        if np.abs(gaps[near[0]]).max() > MAX_LOG2_GAP:
            return None
        w = 1.0 / (d2[near] + 0.01)
        seconds = roofline_s * float(np.exp((w * self.log_ratio[near]).sum() / w.sum()))
        fastest = float(self.rate[near].max())
        return max(seconds, work(self.op, direction, m, n, k, batch) / fastest)


class _Group:
    """The rows of one kernel, pass and dtype: their exact times by shape (the median where a shape recurs), and
    the interpolation between them (``_Shaped`` for shaped kernels, a curve over m x n for the others)."""

    def __init__(self, key: tuple, columns: dict[str, list], at: list[int], roofline: Roofline):
        op, _, dtype = key
        rows = {
            f: [columns[f][i] for i in at]
            for f in ("op", "direction", "dtype", "m", "n", "k", "batch", "median_us")
        }
        times: dict[tuple, list[float]] = defaultdict(list)
        points = []
        shapes = (rows[f] for f in ("direction", "m", "n", "k", "batch", "median_us"))
        for direction, m, n, k, batch, us in zip(*shapes, strict=True):
            seconds = us * 1e-6
            times[KernelLookup.shape_key(op, m, n, k, batch)].append(seconds)
            if op not in SHAPED:
                points.append(((op, direction, dtype), float(m * n), seconds))
        self.exact = {k: v[0] if len(v) == 1 else median(v) for k, v in times.items()}
        self.shaped = _Shaped(rows, roofline) if op in SHAPED else None
        self.curve = _curves(points).get(key) if op not in SHAPED else None


class KernelLookup:
    """Measured kernel times of one table, bound to a roofline for the model-relative interpolation. The rows
    are grouped by kernel, pass and dtype at once; a group's lookups are made when a query first needs them (a
    run asks for a few kinds of a table's dozens: building all of them took 5 ms of every run's start)."""

    def __init__(self, rows: list[KernelRow] | KernelColumns, roofline: Roofline):
        self._columns = KernelColumns.of(rows).columns  # read by column: a cached table's rows stay unmade
        self._roofline = roofline
        self._rows_of: dict[tuple, list[int]] = defaultdict(list)  # (op, pass, dtype) -> its rows, in order
        kinds = zip(self._columns["op"], self._columns["direction"], self._columns["dtype"], strict=True)
        for i, (op, direction, dtype) in enumerate(kinds):
            self._rows_of[(op, table_pass(op, direction), dtype)].append(i)
        self._groups: dict[tuple, _Group | None] = {}
        self._seen: dict[tuple, Cost | None] = {}

    def _group(self, key: tuple) -> _Group | None:
        if key not in self._groups:
            at = self._rows_of.get(key)
            self._groups[key] = _Group(key, self._columns, at, self._roofline) if at else None
        return self._groups[key]

    def _all(self) -> dict[tuple, _Group]:
        return {key: self._group(key) for key in self._rows_of}

    @property
    def exact(self) -> dict[tuple, float]:
        """Every row's time by (op, pass, dtype, m, n, k, batch), k 0 where a kernel's time does not depend on it."""
        return {(*key, *shape): t for key, g in self._all().items() for shape, t in g.exact.items()}

    @property
    def shaped(self) -> dict[tuple, _Shaped]:
        return {key: g.shaped for key, g in self._all().items() if g.shaped is not None}

    @property
    def curves(self) -> dict[tuple, tuple[list[float], list[float]]]:
        return {key: g.curve for key, g in self._all().items() if g.curve is not None}

    @staticmethod
    def shape_key(op, m, n, k, batch) -> tuple:
        """A row's shape as its exact time is kept: k only where the kernel's time depends on it."""
        return (m, n, k if op in SHAPED or op == "embedding" else 0, batch)

    def cost(
        self, op: str, direction: str, dtype: str, m: int, n: int, k: int, batch: int, roofline_s: float
    ) -> Cost | None:
        """Seconds and source of one kernel, or None where the table cannot say (the caller models it); kept
        per query (one GEMM shape recurs across many ops and layouts)."""
        query = (op, direction, dtype, m, n, k, batch, roofline_s)
        if query not in self._seen:
            self._seen[query] = self._cost(*query)
        return self._seen[query]

    def _cost(
        self, op: str, direction: str, dtype: str, m: int, n: int, k: int, batch: int, roofline_s: float
    ) -> Cost | None:
        for dt, exact_source in ((dtype, MEASURED), (_SAME_WIDTH.get(dtype), INTERPOLATED)):
            group = self._group((op, table_pass(op, direction), dt)) if dt is not None else None
            if group is None:
                continue
            hit = group.exact.get(self.shape_key(op, m, n, k, batch))
            if hit is not None:
                return hit, exact_source
            if group.shaped is not None:
                seconds = group.shaped.cost(direction, m, n, k, batch, roofline_s)
            else:
                seconds = curve_cost(*group.curve, float(m * n)) if group.curve else None
            if seconds is not None:
                return seconds, INTERPOLATED
        return None


class CollectiveLookup:
    """Measured collective times by (op, ranks, nodes, ranks per node), interpolated over bytes."""

    def __init__(self, rows: list[CollectiveRow]):
        self.exact = {}
        points = []
        for r in rows:
            key = (r.op, r.ranks, r.nodes, r.ranks_per_node)
            points.append((key, float(r.bytes), r.seconds))
        self.curves = _curves(points)
        for key, (sizes, seconds) in self.curves.items():
            for size, s in zip(sizes, seconds, strict=True):
                self.exact[(*key, size)] = s

    def cost(self, op: str, ranks: int, nodes: int, ranks_per_node: int, nbytes: float) -> Cost | None:
        key = (op, ranks, nodes, ranks_per_node)
        hit = self.exact.get((*key, float(nbytes)))
        if hit is not None:
            return hit, MEASURED
        curve = self.curves.get(key)
        return (curve_cost(*curve, float(nbytes)), INTERPOLATED) if curve else None

    def largest(self, op: str, ranks: int, nodes: int, ranks_per_node: int) -> float | None:
        """The largest measured size of this collective, bytes (None where the table has no row of it)."""
        curve = self.curves.get((op, ranks, nodes, ranks_per_node))
        return curve[0][-1] if curve else None


class Layered:
    """Lookups of several tables, first match wins: a user's table over the shipped one (tables/select.py)."""

    def __init__(self, lookups: list):
        self.lookups = lookups

    def cost(self, *args) -> Cost | None:
        for lookup in self.lookups:
            hit = lookup.cost(*args)
            if hit is not None:
                return hit
        return None

    def largest(self, *args) -> float | None:
        """``CollectiveLookup.largest`` of the table whose cost ``cost`` gives."""
        for lookup in self.lookups:
            if lookup.cost(*args, 1.0) is not None:
                return lookup.largest(*args)
        return None
