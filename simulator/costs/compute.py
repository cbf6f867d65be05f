"""How long a kernel takes on a GPU: a roofline whose compute roof depends on the GEMM's shape.

    time = max(FLOPs / (peak x efficiency(shape)), bytes / (HBM bandwidth x memory efficiency)) + launch

GEMM efficiency = best large-GEMM efficiency (measured, per GPU) x wave quantization x reduction depth:
  * wave quantization: the output is cut into tiles; ceil(tiles / SMs) waves run, the last one partly idle
    (NVIDIA "Matrix Multiplication Background User's Guide", sections "Tile quantization" / "Wave quantization");
    the best of the GPU's tile shapes is taken, each with its own relative efficiency.
  * reduction depth: short K leaves too little work per tile to hide loads: k / (k + k_half).
Every number comes from the GPU's data file (``simulator/hardware/gpus/*.yaml``).
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil

from simulator.frameworks import Framework
from simulator.hardware.gpus import GPU
from simulator.workload.transformer import Op


def gemm_efficiency(gpu: GPU, m: int, n: int, k: int, batch: int = 1) -> float:
    """Fraction of peak FLOP/s a (batched) GEMM reaches on ``gpu``."""
    best = 0.0
    for tm, tn, tile_eff in gpu.gemm.tiles:
        tiles = ceil(m / tm) * ceil(n / tn) * batch
        waves = ceil(tiles / gpu.sm_count)
        useful = (m * n * batch) / (waves * gpu.sm_count * tm * tn)
        best = max(best, tile_eff * useful)
    return gpu.gemm.max_efficiency * best * k / (k + gpu.gemm.k_half)


def memory_time_s(gpu: GPU, nbytes: float) -> float:
    """Bandwidth-bound time: bytes / (HBM bandwidth x achievable fraction)."""
    return nbytes / (gpu.hbm_bytes_per_s * gpu.memory_efficiency)


class ComputeModel:
    """Kernel times for one GPU type and precision, cached per operation."""

    def __init__(self, gpu: GPU, precision: str, framework: Framework | None = None):
        self.gpu = gpu
        self.peak = gpu.peak_flops(precision)
        self.framework = framework or Framework(name="ideal")
        self.op_time_s = lru_cache(maxsize=None)(self._op_time_s)

    def _op_time_s(self, op: Op) -> float:
        g, f = self.gpu, self.framework
        mem = memory_time_s(g, op.bytes) / f.memory_efficiency
        if op.kind == "gemm":
            comp = op.flops / (self.peak * gemm_efficiency(g, op.m, op.n, op.k, op.batch) * f.gemm_efficiency)
        elif op.kind == "flash_attention":
            comp = op.flops / (self.peak * g.flash_attention_efficiency * f.attention_efficiency)
        else:
            comp = 0.0
        return max(comp, mem) + g.kernel_launch_s + f.kernel_overhead_s

    def ops_time_s(self, ops: tuple[Op, ...]) -> float:
        return sum(self.op_time_s(op) for op in ops)
