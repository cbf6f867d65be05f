"""Which GPU runs which rank, and the communication groups that result.

Ranks fill GPUs in order (node-major). ``order`` names the axes innermost first, as Megatron-Core's
``order`` argument: the default ``tp-cp-dp-pp`` (Megatron's ``tp-cp-ep-dp-pp`` without experts) keeps TP groups
inside a node. For HSDP the data-parallel axis splits into ``dp_replicate x dp_shard``, shard innermost.

Mixture-of-experts layers fold their own grid over the same GPUs ("MoE parallel folding", Megatron-Core
``parallel_state.initialize_model_parallel``, core_v0.13.0): inside each pipeline stage the TP x CP x DP ranks are
renumbered as expert tensor parallel (``etp``, innermost) x expert parallel (``ep``) x expert data parallel
(``edp``), so an EP group is ``etp`` x ``ep`` consecutive ranks of the stage whatever the attention layout.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import product
from math import prod

import numpy as np

DEFAULT_ORDER = "tp-cp-dp-pp"
EXPERT_AXES = ("edp", "ep", "etp")  # the expert grid inside a pipeline stage, outermost first


@cache
def axes_of(order: str) -> tuple[str, ...]:
    """Grid axes outermost -> innermost for an innermost-first order such as ``tp-cp-dp-pp``."""
    parts = order.split("-")
    if sorted(parts) != ["cp", "dp", "pp", "tp"]:
        raise ValueError(f"rank order {order!r} must name tp, cp, dp and pp once each, innermost first")
    expanded = [a for part in parts for a in (("dp_shard", "dp_replicate") if part == "dp" else (part,))]
    return tuple(reversed(expanded))


class Groups(Sequence):
    """Every group of one kind, as one (groups x ranks) array of global GPU indices that reads as a tuple of
    tuples: ``groups[i]`` is a tuple, iteration yields tuples, ``np.asarray(groups)`` is the array. At 131,072
    GPUs a kind's groups held as Python tuples took 16 MiB; as one int64 array, 1 MiB. Hashed and compared by
    ``key``, what it was built from (a placement and a kind, then any selection), so the collective model's
    caches key on it without hashing every rank."""

    __slots__ = ("array", "key")

    def __init__(self, array, key):
        array = np.asarray(array, dtype=np.int64)
        if array.ndim != 2:
            raise ValueError(f"groups must be a 2-D array of ranks, got shape {array.shape}")
        array.setflags(write=False)
        self.array, self.key = array, key

    def __len__(self) -> int:
        return self.array.shape[0]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Groups(self.array[i], (self.key, "slice", i.start, i.stop, i.step))
        return tuple(self.array[i].tolist())

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return map(tuple, self.array.tolist())

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Groups):
            return NotImplemented
        return self.key == other.key or np.array_equal(self.array, other.array)

    def __reduce__(self):  # pickled for process pools: rebuilt read-only
        return (Groups, (self.array, self.key))

    def __array__(self, dtype=None, copy=None):
        return self.array if dtype is None else self.array.astype(dtype)

    def __repr__(self) -> str:
        return f"Groups({len(self)} x {self.size}, key={self.key!r})"

    @property
    def size(self) -> int:
        """Ranks per group."""
        return self.array.shape[1]

    def where(self, mask, label) -> Groups:
        """The groups where ``mask`` (one bool per group) holds, keyed by this set's key and ``label``: a view
        where they are consecutive rows (a stage's groups, stages outermost), else a copy."""
        rows = np.flatnonzero(np.asarray(mask, dtype=bool))
        if len(rows) and rows[-1] - rows[0] + 1 == len(rows):
            return Groups(self.array[rows[0] : rows[-1] + 1], (self.key, label))
        return Groups(self.array[rows], (self.key, label))


@dataclass(frozen=True)
class Placement:
    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    dp_shard: int | None = None  # HSDP shard-group size; None = the whole dp axis
    order: str = DEFAULT_ORDER  # innermost first
    ep: int = 1  # expert parallel
    etp: int = 1  # expert tensor parallel

    @property
    def edp(self) -> int:
        """Expert data parallel: the stage's TP x CP x DP ranks left over by ETP x EP."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    @property
    def axes(self) -> tuple[str, ...]:
        return axes_of(self.order)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def sizes(self) -> dict[str, int]:
        shard = self.dp_shard or self.dp
        return {
            "pp": self.pp,
            "dp_replicate": self.dp // shard,
            "dp_shard": shard,
            "cp": self.cp,
            "tp": self.tp,
        }

    @cache  # noqa: B019 - placements are few and immutable
    def groups(self, kind: str) -> Groups:
        """All groups of ``kind`` (``tp``, ``cp``, ``pp``, ``dp``, ``dp_shard``, ``dp_replicate``, a ``+``-joined
        combination such as ``dp+cp``, ``embedding``, ``mirror``, or ``KIND/N`` / ``KIND%N`` sub-groups), each a tuple of
        global GPU indices (read from one array: :class:`Groups`)."""
        return Groups(self._group_array(kind), (self, kind))

    def _group_array(self, kind: str) -> np.ndarray:
        if kind == "embedding":  # first and last stage of each pipeline: they share tied embedding weights
            return self.groups("pp").array[:, [0, -1]]
        if kind == "mirror":  # stages i and p - 1 - i: DualPipe's two copies of a model stage
            pp = self.groups("pp").array
            half = pp.shape[1] // 2
            return np.stack([pp[:, :half], pp[:, ::-1][:, :half]], axis=-1).reshape(-1, 2)
        if set(kind.split("+")) <= set(EXPERT_AXES):
            return np.array(self._expert_groups(kind), dtype=np.int64)
        if "/" in kind or "%" in kind:
            # "dp/8": each dp group cut into consecutive sub-groups of 8 (inside a node: ZeRO++ hpZ, qgZ step 1);
            # "dp%8": the ranks at the same position of those sub-groups (across nodes: qgZ step 2)
            sep = "/" if "/" in kind else "%"
            base, n = kind.split(sep)
            size = int(n)
            whole = self.groups(base).array
            if whole.shape[1] % size:
                raise ValueError(f"group {kind}: {whole.shape[1]} ranks do not split into groups of {size}")
            chunks = whole.reshape(len(whole), -1, size)  # [group, sub-group, position]
            if sep == "%":
                chunks = chunks.transpose(0, 2, 1)
            return chunks.reshape(-1, chunks.shape[2])
        names = [
            a for part in kind.split("+") for a in (("dp_replicate", "dp_shard") if part == "dp" else (part,))
        ]
        for a in names:
            if a not in self.axes:
                raise ValueError(f"unknown group kind {kind!r}")
        # ranks are row-major over the axes (outermost first); a group varies the named axes, in axes order,
        # with the others fixed: its members are a base (the fixed axes' offset) plus every offset of the varied
        # axes, both laid out with numpy (a Python loop over 131,072 ranks took 0.06 s)
        sizes = self.sizes
        stride, s = {}, 1
        for a in reversed(self.axes):
            stride[a] = s
            s *= sizes[a]

        def grid(axes: list[str]):  # every combination of the axes' indices, the first outermost (as product)
            out = np.zeros(1, dtype=np.int64)
            for a in axes:
                out = (out[:, None] + np.arange(sizes[a], dtype=np.int64) * stride[a]).ravel()
            return out

        offsets = grid([a for a in self.axes if a in names])
        bases = grid([a for a in self.axes if a not in names])
        return bases[:, None] + offsets

    def _expert_groups(self, kind: str) -> tuple[tuple[int, ...], ...]:
        """Groups of the expert grid (``ep``, ``etp``, ``edp`` or a ``+``-joined combination): each stage's ranks in
        increasing order, numbered etp + ETP (ep + EP edp)."""
        names = kind.split("+")
        sizes = {"etp": self.etp, "ep": self.ep, "edp": self.edp}
        stride = {"etp": 1, "ep": self.etp, "edp": self.etp * self.ep}
        keep = [a for a in EXPERT_AXES if a not in names]
        vary = [a for a in EXPERT_AXES if a in names]
        offsets = [
            sum(i * stride[a] for a, i in zip(vary, idx, strict=True))
            for idx in product(*(range(sizes[a]) for a in vary))
        ]
        bases = [
            sum(i * stride[a] for a, i in zip(keep, idx, strict=True))
            for idx in product(*(range(sizes[a]) for a in keep))
        ]
        stage_of, out = self.stages(), []
        for st in range(self.pp):
            ranks = np.flatnonzero(stage_of == st).tolist()
            out += [tuple(ranks[b + o] for o in offsets) for b in bases]
        return tuple(out)

    def coordinate(self, rank: int, axis: str) -> int:
        """The index of ``rank`` along ``axis`` (e.g. its pipeline stage for ``pp``)."""
        sizes = self.sizes
        inner = 1
        for a in reversed(self.axes):
            if a == axis:
                return rank // inner % sizes[a]
            inner *= sizes[a]
        raise ValueError(axis)

    @cache  # noqa: B019 - placements are few and immutable
    def stages(self) -> np.ndarray:
        """The pipeline stage of every rank (a read-only array)."""
        stages = self.coordinates("pp")
        stages.setflags(write=False)
        return stages

    def coordinates(self, axis: str):
        """Every rank's index along ``axis``, as a numpy array (``coordinate`` for all ranks at once)."""
        return self.coordinates_of(np.arange(self.world_size, dtype=np.int64), axis)

    def coordinates_of(self, ranks: np.ndarray, axis: str) -> np.ndarray:
        """The index along ``axis`` of each of ``ranks`` (an array of any shape): only the ranks asked about,
        where ``coordinates`` lays out every rank (1 MiB and its temporaries at 131,072 GPUs)."""
        sizes = self.sizes
        inner = 1
        for a in reversed(self.axes):
            if a == axis:
                return ranks // inner % sizes[a]
            inner *= sizes[a]
        raise ValueError(axis)

    def group_size(self, kind: str) -> int:
        """The ranks in one group of ``kind``, from the axes' sizes (``groups`` builds every group: O(GPUs))."""
        if kind in ("embedding", "mirror"):
            return 2
        if "/" in kind or "%" in kind:
            sep = "/" if "/" in kind else "%"
            base, n = kind.split(sep)
            whole, size = self.group_size(base), int(n)
            if whole % size:
                return len(self.groups(kind)[0])  # raises: the groups do not split
            return size if sep == "/" else whole // size
        names = kind.split("+")
        if set(names) <= set(EXPERT_AXES):
            sizes = {"etp": self.etp, "ep": self.ep, "edp": self.edp}
            return prod(sizes[a] for a in names)
        names = [a for part in names for a in (("dp_replicate", "dp_shard") if part == "dp" else (part,))]
        for a in names:
            if a not in self.axes:
                raise ValueError(f"unknown group kind {kind!r}")
        return prod(self.sizes[a] for a in names)
