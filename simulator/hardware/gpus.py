"""The GPU catalogue: one YAML data file per GPU in ``gpus/``, with the sources of its numbers."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict

from simulator.errors import ScenarioError

_GPU_DIR = Path(__file__).parent / "gpus"

# Spread of sustained compute speed across GPUs of one SKU (standard deviation, fraction of the typical GPU's;
# simulator/costs/variability.py says what it costs). Sinha et al. (SC22, arXiv 2208.11035) measured 8% average
# variation, read as the range between the box plot's whiskers (Q1 - 1.5 IQR to Q3 + 1.5 IQR, outliers excluded):
# for a normal distribution that range is 2 x 2.698 sd, so sd = 0.08 / 5.40. Their clusters are V100 and
# MI50/MI60; no per-SKU figure for A100 or H100 is published, so every GPU file uses this one unless it says
# ``speed_sd`` (``cluster.gpu_speed_sd`` overrides per scenario).
DEFAULT_SPEED_SD = 0.015


class GemmProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    max_efficiency: float
    k_half: float
    tiles: tuple[tuple[int, int, float], ...]  # (tile_m, tile_n, relative efficiency of that tile shape)
    # the fastest any GEMM runs, as a fraction of peak: the best shape-searched large matmul measured on this
    # GPU (MAMF); no table row or framework factor makes a GEMM faster
    best_efficiency: float = 1.0


class KernelBandwidth(BaseModel):
    """Achieved HBM bandwidth of one memory-bound kernel kind, as a fraction of the HBM peak, for the bytes the
    workload counts for it (simulator/workload/)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    forward: float
    backward: float


class GPU(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    display_name: str
    peak_tflops: dict[str, float]
    hbm_gib: float
    hbm_bandwidth_GBps: float
    sm_count: int
    nvlink_bandwidth_GBps: float
    pcie_bandwidth_GBps: float
    gemm: GemmProfile
    memory_efficiency: float
    memory_kernels: dict[str, KernelBandwidth] = {}  # per kernel kind; others reach memory_efficiency
    # None: no FlashAttention kernel for this GPU (FlashAttention-1 needs sm75+, FlashAttention-2 sm80+;
    # Dao et al. 2022, Dao 2023, Dao-AILab/flash-attention README); ``attention: auto`` then runs standard attention
    flash_attention_efficiency: float | None = None
    kernel_launch_s: float
    sources: str
    # spread of sustained compute speed across GPUs of this SKU, standard deviation as a fraction of the
    # typical GPU's: a job's compute-bound kernels run at its slowest GPU's speed (simulator/costs/variability.py)
    speed_sd: float = DEFAULT_SPEED_SD

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for ``dtype``; a clear error if this GPU has no such tensor-core mode."""
        if dtype not in self.peak_tflops:
            raise ScenarioError(
                f"training.precision: {self.name} has no {dtype} peak (it supports {', '.join(self.peak_tflops)})"
            )
        return self.peak_tflops[dtype] * 1e12

    def memory_fraction(self, kind: str, direction: str) -> float:
        """Fraction of the HBM peak a memory-bound kernel of ``kind`` reaches in ``direction``."""
        bw = self.memory_kernels.get(kind)
        if bw is None:
            return self.memory_efficiency
        return bw.backward if direction == "backward" else bw.forward

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gib * 2**30

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_GBps * 1e9


@cache
def gpu_catalogue() -> dict[str, GPU]:
    return {
        p.stem: GPU.model_validate(yaml.safe_load(p.read_text())) for p in sorted(_GPU_DIR.glob("*.yaml"))
    }


def get_gpu(name: str, field: str = "cluster.gpu") -> GPU:
    catalogue = gpu_catalogue()
    if name not in catalogue:
        raise ScenarioError(f"{field}: unknown GPU '{name}'; available: {', '.join(catalogue)}")
    return catalogue[name]
