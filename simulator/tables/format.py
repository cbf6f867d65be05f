"""Cost tables: measured kernel and collective times, one directory per table (docs/calibration.md).

    TABLE/
      table.yaml        what was measured, on what, how, by whom, under which licence (TableMeta)
      kernels.csv       one row per kernel shape (KernelRow); or kernels.parquet (needs pyarrow)
      collectives.csv   one row per collective size (CollectiveRow); or collectives.parquet

Either CSV may be missing. This module is the format: the kernel and collective vocabulary, one row of each,
the metadata, and the table; ``io.py`` reads and writes directories, ``lookup.py`` interpolates between rows,
``select.py`` says which table a run uses. The shipped tables live in ``shipped/``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

SHIPPED_DIR = Path(__file__).parent / "shipped"


def is_shipped(directory: str | Path) -> bool:
    """``directory`` is one of the package's own tables (trusted, immutable: parsed fast, cached)."""
    return Path(directory).resolve().parent == SHIPPED_DIR.resolve()


# The kernel vocabulary (what the workload's ops call themselves, simulator/workload/)
KERNEL_OPS = {
    "gemm": "C[m,n] = A[m,k] B[k,n]",
    "batched_gemm": "batch x (m x k) @ (k x n), e.g. unfused attention QK^T and PV",
    "grouped_gemm": "one kernel over batch experts' (m x k) @ (k x n), m = rows per expert (MoE experts)",
    "flash_attention": "fused attention: batch = samples x heads, m = queries, n = keys, k = head dim (causal)",
    "softmax": "softmax over rows of m x n (attention probabilities: m = samples x heads x queries, n = keys)",
    "dropout": "dropout on m x n",
    "layernorm": "LayerNorm over n (hidden) for m rows (tokens)",
    "rmsnorm": "RMSNorm over n for m rows",
    "gelu": "GeLU on m x n",
    "swiglu": "SiLU(a) * b on m x n outputs (reads m x 2n)",
    "relu": "ReLU on m x n",
    "squared_relu": "ReLU^2 on m x n",
    "bias_dropout_add": "Megatron's fused bias + dropout + residual add on m x n",
    "residual_add": "x + residual on m x n",
    "elementwise": "another elementwise kernel on m x n",
    "embedding": "embedding lookup: m tokens, n hidden, k vocabulary rows",
    "cross_entropy": "cross-entropy over n (vocabulary) for m rows",
    "adam_step": "Adam / AdamW step on m parameters (n = 1)",
    "sgd_step": "SGD step on m parameters (n = 1)",
}
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "tf32": 4, "fp8": 1, "int8": 1}
DTYPES = tuple(DTYPE_BYTES)
PASSES = ("forward", "backward")
SOURCES = ("measured", "interpolated", "modelled")


class CostTableWarning(UserWarning):
    """A calibration table is used on hardware other than the one it was measured on."""


@dataclass(frozen=True)
class KernelRow:
    """One kernel shape: its median time, how often and how tightly it was measured, and (where known) the
    CPU time to issue it. ``m, n, k, batch`` per :data:`KERNEL_OPS`; memory-bound kernels use m x n."""

    op: str
    dtype: str
    m: int
    n: int = 1
    k: int = 0
    batch: int = 1
    median_us: float = 0.0
    direction: str = "forward"
    repeats: int = 0
    spread_pct: float | None = None  # (p90 - p10) / median, percent
    host_us: float | None = None
    name: str = ""  # free text: where the row came from (layer op, aten op, trace kernel)

    @property
    def seconds(self) -> float:
        return self.median_us * 1e-6

    @property
    def key(self) -> tuple:
        """What the runner measures a row for (``shapes.KernelShape.key``)."""
        return (self.op, self.direction, self.dtype, self.m, self.n, self.k, self.batch)


@dataclass(frozen=True)
class CollectiveRow:
    """One collective size on one group shape. ``bytes`` is the full buffer, NCCL's (and nccl-tests') "size":
    the all-gather output, the reduce-scatter input, each rank's buffer for all-to-all, the message for
    send/recv."""

    op: str
    ranks: int
    nodes: int
    ranks_per_node: int
    bytes: float
    median_us: float
    repeats: int = 0
    spread_pct: float | None = None
    dtype: str = ""
    algorithm: str = ""
    protocol: str = ""

    @property
    def seconds(self) -> float:
        return self.median_us * 1e-6

    @property
    def key(self) -> tuple:
        """What the runner measures a row for (``shapes.CollectiveShape.key``)."""
        return (self.op, self.ranks, self.nodes, self.ranks_per_node, float(self.bytes))


KERNEL_FIELDS = tuple(f.name for f in fields(KernelRow))


class KernelColumns(Sequence):
    """A table's kernel rows as columns (``KERNEL_FIELDS`` -> a list each), as the parsed-table cache keeps them
    (``select.py``): unpickling a few thousand row objects took 5-8 ms of every run's start, building the lookup
    from them as long again. The lookup reads the columns (``lookup.KernelLookup``); the rows themselves are
    made where something asks for them (writing, calibrating), once."""

    def __init__(self, columns: dict[str, list]):
        self.columns = columns
        self._rows: list[KernelRow] | None = None

    @classmethod
    def of(cls, rows) -> KernelColumns:
        return (
            rows
            if isinstance(rows, KernelColumns)
            else cls({f: [getattr(r, f) for r in rows] for f in KERNEL_FIELDS})
        )

    @property
    def rows(self) -> list[KernelRow]:
        if self._rows is None:
            self._rows = [KernelRow(*v) for v in zip(*(self.columns[f] for f in KERNEL_FIELDS), strict=True)]
        return self._rows

    def __len__(self) -> int:
        return len(self.columns["op"])

    def __getitem__(self, i):
        return self.rows[i]

    def __iter__(self):
        return iter(self.rows)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __reduce__(self):  # pickled as its columns
        return (KernelColumns, (self.columns,))


class _Meta(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class DeviceInfo(_Meta):
    model: str = Field("", description="GPU (or CPU) model as the driver names it.")
    memory_gib: float | None = None
    clocks: str = Field("", description="SM / memory clocks if known (locked or boost).")
    driver: str = ""
    cuda: str = ""
    pytorch: str = ""
    nccl: str = ""


class SystemInfo(_Meta):
    """The machine the collective rows were measured on. Collective rows are used only on a cluster that
    matches every field given here (a what-if with other NICs or links falls back to the model)."""

    topology: str | None = None
    intra_node: str | None = Field(None, description="nvswitch | pcie")
    nvlink_bandwidth_GBps: float | None = None
    nics_per_node: int | None = None
    nic_bandwidth_gbps: float | None = None
    nic_kind: str | None = None


class SourceInfo(_Meta):
    rows: str = Field(..., description="Which rows: kernels, collectives, or a subset.")
    source: str
    licence: str
    url: str = ""


class TableMeta(_Meta):
    name: str
    gpu: str | None = Field(
        None,
        description="GPU catalogue name (simulator/hardware/gpus) the table describes; 'cpu' for CPU runs.",
    )
    description: str = ""
    device: DeviceInfo = Field(default_factory=DeviceInfo)
    system: SystemInfo = Field(default_factory=SystemInfo)
    date: str = ""
    method: str = Field("", description="How the numbers were measured (timer, warm-up, repeats, L2 flush).")
    sources: tuple[SourceInfo, ...] = ()
    covers: str = Field("", description="What the rows cover, and what they do not.")
    notes: str = ""


@dataclass(eq=False)
class CostTable:
    meta: TableMeta
    kernels: list[KernelRow] | KernelColumns
    collectives: list[CollectiveRow]
    path: Path | None = None
    lookups: dict = field(default_factory=dict, repr=False)  # built from the rows, per GPU / cluster (api.py)

    @property
    def label(self) -> str:
        return self.meta.name if self.path is None or self.path.parent == SHIPPED_DIR else str(self.path)
