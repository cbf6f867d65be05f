"""How long a kernel takes on a GPU: a roofline whose compute roof depends on the GEMM's shape.

    time = max(FLOPs / (peak x efficiency(shape)), bytes / (HBM bandwidth x memory efficiency)) + launch

GEMM efficiency = best large-GEMM efficiency (measured, per GPU) x wave quantization x reduction depth:
  * wave quantization: the output is cut into tiles; ceil(tiles / SMs) waves run, the last one partly idle
    (NVIDIA "Matrix Multiplication Background User's Guide", sections "Tile quantization" / "Wave quantization");
    the best of the GPU's tile shapes is taken, each with its own relative efficiency.
  * reduction depth: short K leaves too little work per tile to hide loads: k / (k + k_half).
Every number comes from the GPU's data file (``simulator/hardware/gpus/*.yaml``). Where a calibration table
(``simulator/calibration/``) measured the kernel, or shapes around it, its time replaces the roofline.
In a job of many GPUs the compute-bound kernels (GEMMs, FlashAttention) then take as long as on the job's slowest
GPU (``costs/variability.py``); memory-bound kernels keep their time (HBM bandwidth is not what power
management trims).
"""

from __future__ import annotations

from functools import lru_cache, partial

import numpy as np

from simulator.costs.attention_rate import KERNEL_RATE, attention_factor, flash_direction_rate
from simulator.costs.variability import slowest_gpu_factor
from simulator.frameworks import Framework
from simulator.hardware.gpus import GPU
from simulator.tables.format import DTYPE_BYTES
from simulator.tables.lookup import GEMMS, INTERPOLATED, MODELLED, SHAPED, KernelLookup, work
from simulator.workload.ops import Op

# the most slices a GEMM's reduction dimension is split into to fill the SMs (split-K / stream-K)
MAX_SPLIT_K = 8
SPLITS = np.arange(1, MAX_SPLIT_K + 1)


def gemm_efficiency(gpu: GPU, m, n, k, batch=1):
    """Fraction of peak FLOP/s a (batched) GEMM reaches on ``gpu``: of one shape (ints), or of many at once
    (integer arrays: a cost table's rows, ``tables/lookup.py``), with the same arithmetic.

    A GEMM with fewer output tiles than SMs splits its reduction (K) into s slices, each tile's slices on
    different SMs (cuBLAS's split-K heuristics; CUTLASS 3's Hopper stream-K scheduler,
    include/cutlass/gemm/kernel/sm90_tile_scheduler_stream_k.hpp): s times the tiles, each K / s deep. The best
    tile shape and s (1 to MAX_SPLIT_K) is taken. Timed on an H200 (docs/calibration.md): weight-gradient GEMMs
    (a hidden x hidden ... 4 hidden output reduced over 8k-128k tokens) ran at 500-830 TFLOP/s where whole
    tiles alone fill a few of the SMs; with split-K the spread of log(measured / modelled) over those 48 shapes
    fell from 0.22 to 0.08, and over 144 TP GEMMs and their chunks from 0.115 to 0.073
    (docs/measurements/h200-wgrad-gemm.json, h200-tp-split-gemm.json)."""
    one = not isinstance(m, np.ndarray)
    best, pick = 0.0, max if one else np.maximum
    half = gpu.gemm.k_half
    for tm, tn, tile_eff in gpu.gemm.tiles:
        tiles = -(-m // tm) * -(-n // tn) * batch  # ceil(m / tm) x ceil(n / tn), exact for integers
        fill = (m * n * batch) / (tm * tn)
        if not one:  # a table's rows: every slice count at once, one row per count
            s = SPLITS[:, None]
            waves = -(-(tiles * s) // gpu.sm_count)
            best = pick(
                best, (tile_eff * s * fill / (waves * gpu.sm_count) * (k / (k + s * half))).max(axis=0)
            )
            continue
        for s in range(1, MAX_SPLIT_K + 1):
            depth = k / (k + s * half)
            if tile_eff * depth <= best:  # no more slices can beat it: depth only falls with s
                break
            waves = -(-(tiles * s) // gpu.sm_count)
            best = pick(best, tile_eff * s * fill / (waves * gpu.sm_count) * depth)
    return gpu.gemm.max_efficiency * best


def memory_time_s(gpu: GPU, nbytes: float, kind: str = "", direction: str = "forward") -> float:
    """Bandwidth-bound time: bytes / (HBM bandwidth x the fraction a kernel of this kind reaches)."""
    return nbytes / (gpu.hbm_bytes_per_s * gpu.memory_fraction(kind, direction))


# kernels whose time follows the SM clock, and so the slowest GPU of the job (costs/variability.py)
COMPUTE_BOUND = ("gemm", "flash_attention")

# no memory-bound kernel streams faster than this share of the HBM peak (a device-to-device copy reaches ~0.90 on
# H100 and ~0.88 on A100), whatever framework factor multiplies its kind's efficiency
MAX_MEMORY_FRACTION = 0.92


def gemm_floor_s(gpu: GPU, flops: float, peak: float, dtype: str = "bf16") -> float:
    """No GEMM runs faster than the best measured large matmul of its type on the GPU (MAMF)."""
    return flops / (peak * gpu.best_efficiency(dtype))


def gemm_bytes(dtype: str, m: int, n: int, k: int, batch: int) -> float:
    """HBM bytes of a GEMM: both inputs in ``dtype``, the output at least 16-bit (an FP8 GEMM writes bf16)."""
    width = DTYPE_BYTES.get(dtype, 2)
    return batch * (width * (m * k + k * n) + max(width, 2) * m * n)


def shape_roofline_s(gpu: GPU, op: str, direction: str, dtype: str, m, n, k, batch):
    """The roofline of a shaped kernel (GEMM, batched GEMM, FlashAttention) from its shape alone, without any
    framework factor: the reference that measured rows are interpolated relative to (tables/lookup.py). A GEMM of
    another tensor-core type (FP8) runs at that type's peak x the shape's efficiency x the ratio of the two types'
    best measured matmuls (``GPU.dtype_efficiency``). Of one shape (ints: seconds), or of a table's rows of one
    kernel at once (integer arrays: an array of seconds, the same numbers)."""
    peak = gpu.peak_tflops.get(dtype, max(gpu.peak_tflops.values())) * 1e12
    flops = work(op, direction, m, n, k, batch)
    if op == "flash_attention":
        shape = attention_factor(gpu, direction, m, n, batch, k)
        rate = flash_direction_rate(gpu, direction, dtype)  # FP8 attention: its measured rate over 16 bits'
        base = gpu.peak_tflops.get("bf16", peak / 1e12) * 1e12 if dtype in ("fp8", "fp4") else peak
        return flops / (base * gpu.flash_attention_efficiency * shape * rate)
    eff = gemm_efficiency(gpu, m, n, k, batch) * gpu.dtype_efficiency(dtype)
    pick = np.maximum if isinstance(m, np.ndarray) else max
    return pick(flops / (peak * eff), memory_time_s(gpu, gemm_bytes(dtype, m, n, k, batch)))


class ComputeModel:
    """Kernel times for one GPU type and precision, cached per operation: a calibration table's measured or
    interpolated time where it has one (``kernels``), else the roofline above. Framework factors apply to
    either (a framework generation's kernels relative to the reference the table or the roofline gives).

    ``gpus`` is the job's GPU count: its compute-bound kernels run at the pace of the slowest of them, whose
    speed is ``speed_sd`` (default: the GPU profile's) standard deviations times E[max of ``gpus`` normals]
    below the typical GPU's (``costs/variability.py``). One GPU, or ``speed_sd`` 0, gives the typical GPU; a
    power-capped part (``GPU.clock_scale``) runs them slower still.

    A GEMM whose ``dtype`` is not ``precision`` (FP8 linear layers) runs at its type's peak; where the table has
    no row of that type it takes the 16-bit row of its shape scaled by the two rooflines' ratio (the measured
    shape's efficiency carried over), and ``low_precision_scale`` (the recipe's block-scaled kernels relative to
    per-tensor FP8, ``workload/fp8.py``) on top."""

    def __init__(
        self,
        gpu: GPU,
        precision: str,
        framework: Framework | None = None,
        kernels: KernelLookup | None = None,
        gpus: int = 1,
        speed_sd: float | None = None,
        low_precision_scale: float = 1.0,
    ):
        self.gpu = gpu
        self.precision = precision
        self.peak = gpu.peak_flops(precision)
        self.framework = (framework or Framework(name="ideal")).on_gpu(gpu.lineage, gpu.architecture)
        self.kernels = kernels
        sd = gpu.speed_sd if speed_sd is None else speed_sd
        self.slowest = slowest_gpu_factor(sd, gpus) / gpu.clock_scale
        self.low_precision_scale = low_precision_scale
        self.op_cost = lru_cache(maxsize=None)(self._op_cost)
        # per shape: ops of one shape recur under other names (a layer's GEMMs in each workload a plan builds)
        self.roofline_s = lru_cache(maxsize=None)(partial(shape_roofline_s, gpu))

    def op_time_s(self, op: Op) -> float:
        return self.op_cost(op)[0]

    def _op_cost(self, op: Op) -> tuple[float, str]:
        """Seconds and source (measured | interpolated | modelled) of one kernel."""
        g, f = self.gpu, self.framework
        if op.kind in ("host", "sync"):  # host work: no GPU time
            return 0.0, MODELLED
        if op.whole and op.kernel in SHAPED:
            return self._chunk_s(op)
        if self.kernels is not None and op.kernel:
            hit = self._table_s(op)
            if hit is not None:
                seconds = hit[0] / self._factor(op.kernel)
                if op.kind == "gemm":
                    dtype = op.dtype or self.precision
                    seconds = max(seconds, gemm_floor_s(g, op.flops, self._peak(dtype), dtype))
                if op.kind in COMPUTE_BOUND:
                    seconds *= self.slowest
                return seconds + g.kernel_launch_s + f.kernel_overhead_s, hit[1]
        return self._modelled_s(op), MODELLED

    def _chunk_s(self, op: Op) -> tuple[float, str]:
        """A chunk of a split GEMM (TP overlap): the whole GEMM's time (a table's, where it has one) x the shape
        model's ratio of the chunk to the whole, plus its own launch. A table measures the whole GEMMs of a layer;
        its rows of a chunk's narrow shape carry the table's own error there (Vidur's H100 rows of GEMMs 1,280-3,072
        wide take 1.15-1.5x what this project timed, docs/calibration.md), while the shape model's ratio of a
        split to its whole matched 192 splits of 96 TP GEMMs timed on an H200 at the median, 0.94-1.07 for 80% of
        them (docs/measurements/h200-tp-split-gemm.json)."""
        m, n, k = op.whole
        scale = (m * n * k) / (op.m * op.n * op.k)
        whole = op.evolve(m=m, n=n, k=k, flops=op.flops * scale, bytes=op.bytes * scale, whole=())
        seconds, source = self.op_cost(whole)
        launch = op.launches * (self.gpu.kernel_launch_s + self.framework.kernel_overhead_s)
        dtype = op.dtype or self.precision
        ratio = self.roofline_s(op.kernel, op.direction, dtype, op.m, op.n, op.k, op.batch)
        ratio /= self.roofline_s(op.kernel, op.direction, dtype, m, n, k, op.batch)
        return (seconds - launch) * ratio + launch, source

    def _peak(self, dtype: str) -> float:
        """Dense peak FLOP/s of ``dtype`` GEMMs (a low-precision type at its recipe's share)."""
        if dtype == self.precision:
            return self.peak
        return self.gpu.peak_flops(dtype) * self.low_precision_scale

    def _table_s(self, op: Op) -> tuple[float, str] | None:
        """The table's time for ``op`` (None where it has none); a GEMM of a type the table lacks from its
        16-bit row, scaled by the rooflines' ratio."""
        dtype = op.dtype or self.precision
        shape = (op.kernel, op.direction, dtype, op.m, op.n, op.k, op.batch)
        roof = self.roofline_s(*shape) if op.kernel in SHAPED else 0.0
        hit = self.kernels.cost(*shape, roof)
        if hit is None and dtype != self.precision and op.kernel in SHAPED:
            base = (op.kernel, op.direction, self.precision, op.m, op.n, op.k, op.batch)
            base_roof = self.roofline_s(*base)
            hit = self.kernels.cost(*base, base_roof)
            if hit is not None:
                # the recipe's GEMM kernels' share
                scale = self.low_precision_scale if op.kernel in GEMMS else 1.0
                hit = hit[0] * roof / base_roof / scale, INTERPOLATED
        if op.kernel == "flash_attention" and hit is not None and op.flops > 0:
            # a row is the whole kernel of its shape; an attention op may be part of one (a ring step, the share of
            # the layers that run it) or do other work than its head dim says (multi-latent attention's values are
            # narrower than its queries and keys: 192 + 128 per pair, not 2 x 192): its time is in proportion
            hit = hit[0] * op.flops / work(op.kernel, op.direction, op.m, op.n, op.k, op.batch), hit[1]
        return hit

    def _factor(self, kernel: str) -> float:
        f = self.framework
        if kernel in GEMMS:
            return f.gemm_efficiency
        if kernel == "flash_attention":
            return f.attention_efficiency * KERNEL_RATE[f.attention_kernel]
        return f.memory_efficiency

    def _modelled_s(self, op: Op) -> float:
        g, f = self.gpu, self.framework
        fraction = min(g.memory_fraction(op.kernel, op.direction) * f.memory_efficiency, MAX_MEMORY_FRACTION)
        mem = op.bytes / (g.hbm_bytes_per_s * fraction)
        if op.kind == "gemm":
            dtype = op.dtype or self.precision
            peak = self._peak(dtype)
            eff = gemm_efficiency(g, op.m, op.n, op.k, op.batch) * g.dtype_efficiency(dtype)
            comp = op.flops / (peak * eff * f.gemm_efficiency)
            comp = max(comp, gemm_floor_s(g, op.flops, peak, dtype))
        elif op.kind == "flash_attention":
            shape = attention_factor(
                g, op.direction, op.m, op.n, op.batch, op.k, f.attention_kernel, op.window
            )
            shape *= flash_direction_rate(g, op.direction, op.dtype)
            comp = op.flops / (
                self.peak * g.flash_attention_efficiency * shape * self._factor("flash_attention")
            )
        else:
            comp = 0.0
        if op.kind in COMPUTE_BOUND:
            comp *= self.slowest
        return max(comp, mem) + op.launches * (g.kernel_launch_s + f.kernel_overhead_s)

    def ops_time_s(self, ops: tuple[Op, ...]) -> float:
        return sum(self.op_time_s(op) for op in ops)
