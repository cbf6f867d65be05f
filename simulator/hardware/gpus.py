"""The GPU catalogue: one YAML data file per GPU in ``gpus/``, with the sources of its numbers."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.errors import ScenarioError
from simulator.scenario.files import load_named

_GPU_DIR = Path(__file__).parent / "gpus"

# Spread of sustained compute speed across GPUs of one SKU (standard deviation, fraction of the typical GPU's;
# simulator/costs/variability.py says what it costs). Sinha et al. (SC22, arXiv 2208.11035) measured 8% average
# variation, read as the range between the box plot's whiskers (Q1 - 1.5 IQR to Q3 + 1.5 IQR, outliers excluded):
# for a normal distribution that range is 2 x 2.698 sd, so sd = 0.08 / 5.40. Their clusters are V100 and
# MI50/MI60; no per-SKU figure for A100 or H100 is published, so every GPU file uses this one unless it says
# ``speed_sd`` (``cluster.gpu_speed_sd`` overrides per scenario).
DEFAULT_SPEED_SD = 0.015


# The least fraction of a peak any efficiency may state: below it a kernel's time is no measurement but a typo
# (an efficiency of 5e-324 made times infinite and JSON output invalid), as for the topology's link efficiencies.
MIN_EFFICIENCY = 0.01
# The memory-bound kernel kinds a GPU file may give its own HBM fraction (memory_kernels), the workload's names
# for them (tables/format.py KERNEL_OPS less its GEMMs, attention and optimizer steps; tests/test_bad_input.py)
MEMORY_KERNEL_KINDS = (
    "softmax", "dropout", "layernorm", "rmsnorm", "gelu", "swiglu", "relu", "squared_relu", "bias_dropout_add",
    "residual_add", "elementwise", "embedding", "cross_entropy",
)  # fmt: skip


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, defer_build=True)


class GemmProfile(_Data):
    max_efficiency: float = Field(ge=MIN_EFFICIENCY, le=1)
    k_half: float = Field(ge=0, le=1e5)
    tiles: tuple[tuple[int, int, float], ...] = Field(
        min_length=1
    )  # (tile_m, tile_n, relative efficiency of that tile shape)
    # the fastest any GEMM runs, as a fraction of peak: the best shape-searched large matmul measured on this
    # GPU (MAMF); no table row or framework factor makes a GEMM faster
    best_efficiency: float = Field(1.0, ge=MIN_EFFICIENCY, le=1)
    # the same for other tensor-core types, as a fraction of that type's dense peak (MAMF of an FP8 matmul); a
    # GEMM of that type runs at its shape's efficiency x this / best_efficiency (the bf16 shape model, scaled)
    best_efficiency_by_dtype: dict[str, float] = {}

    @model_validator(mode="after")
    def _check(self) -> GemmProfile:
        for tm, tn, eff in self.tiles:
            if tm < 1 or tn < 1 or not MIN_EFFICIENCY <= eff <= 1:
                raise ValueError(
                    f"tiles: ({tm}, {tn}, {eff}): sizes must be >= 1 and efficiency in [{MIN_EFFICIENCY}, 1]"
                )
        for dtype, eff in self.best_efficiency_by_dtype.items():
            if not MIN_EFFICIENCY <= eff <= 1:
                raise ValueError(
                    f"best_efficiency_by_dtype.{dtype}: {eff} is not a fraction in [{MIN_EFFICIENCY}, 1]"
                )
        return self


class RateRatio(BaseModel):
    """A kernel's rate in one format over its rate in another, forward and backward, measured."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, defer_build=True)
    forward: float = Field(ge=MIN_EFFICIENCY, le=4)
    backward: float = Field(ge=MIN_EFFICIENCY, le=4)


class KernelBandwidth(BaseModel):
    """Achieved HBM bandwidth of one memory-bound kernel kind, as a fraction of the HBM peak, for the bytes the
    workload counts for it (simulator/workload/)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, defer_build=True)
    forward: float = Field(ge=MIN_EFFICIENCY, le=1)
    backward: float = Field(ge=MIN_EFFICIENCY, le=1)


# Tensor-core generations: which low-precision formats the GPU runs (Transformer Engine v2.18
# pytorch/quantization.py: FP8 needs SM 8.9+, MXFP8 and NVFP4 SM 10.0+; FP8 block scaling SM 9.0+) and whether an
# FP8 GEMM takes either operand layout (common/transformer_engine.cpp nvte_is_non_tn_fp8_gemm_supported: SM 10.x;
# Hopper is TN-only, so per-tensor FP8 keeps a transposed copy of every operand used column-wise)
Architecture = Literal["volta", "ampere", "hopper", "blackwell", "cdna3", "cdna4"]
FP8_ARCHITECTURES = ("hopper", "blackwell", "cdna3", "cdna4")
BLOCK_SCALED_ARCHITECTURES = ("blackwell", "cdna4")  # MXFP8 / NVFP4 (MX formats) in hardware
NON_TN_FP8_ARCHITECTURES = ("blackwell",)


class GPU(_Data):
    """One GPU model: what the silicon can do (dense peaks per tensor-core type, memory, links) and the measured
    efficiencies the roofline uses where no cost table has the kernel."""

    name: str = Field(min_length=1)
    display_name: str = Field(min_length=1)
    device_names: list[str] = Field(
        [],
        description="Names the driver reports (torch.cuda.get_device_name, nvidia-smi, nccl-tests' rank lines).",
    )
    architecture: Architecture
    vendor: Literal["nvidia", "amd"] = "nvidia"
    peak_tflops: dict[Literal["fp32", "tf32", "fp16", "bf16", "fp8", "fp4"], float] = Field(
        min_length=1, description="Dense (no 2:4 sparsity) peak TFLOP/s per tensor-core type."
    )
    hbm_gib: float = Field(ge=1, le=2**16, description="HBM capacity in GiB as the device reports it.")
    hbm_bandwidth_GBps: float = Field(ge=1, le=1e5)
    sm_count: int = Field(ge=1, le=4096, description="SMs (NVIDIA) or compute units (AMD).")
    nvlink_bandwidth_GBps: float = Field(
        ge=0, le=1e5, description="Scale-up link bandwidth per GPU per direction (0: none)."
    )
    pcie_bandwidth_GBps: float = Field(ge=0.01, le=1e4, description="Host link per direction.")
    power_w: float | None = Field(None, ge=1, le=1e4, description="Power limit (TDP) the numbers hold at.")
    # compute-bound kernels run at this fraction of the speed the peaks and efficiencies describe: a
    # power-capped or re-clocked part (sustained tensor clock / the clock the peak is quoted at)
    clock_scale: float = Field(1.0, ge=0.05, le=1.5)
    gemm: GemmProfile
    memory_efficiency: float = Field(ge=MIN_EFFICIENCY, le=1)
    memory_kernels: dict[
        Literal[MEMORY_KERNEL_KINDS], KernelBandwidth
    ] = {}  # per kind; others: memory_efficiency
    # None: no FlashAttention kernel for this GPU (FlashAttention-1 needs sm75+, FlashAttention-2 sm80+;
    # Dao et al. 2022, Dao 2023, Dao-AILab/flash-attention README); ``attention: auto`` then runs standard attention
    flash_attention_efficiency: float | None = Field(None, ge=MIN_EFFICIENCY, le=1)
    # the fused attention's backward rate (FLOPs counted as 2.5x the forward's) relative to its forward's at the
    # reference shape, where measured apart (cuDNN on Blackwell: about 0.78); 1.0: the forward's
    flash_attention_backward: float = Field(1.0, ge=MIN_EFFICIENCY, le=2)
    # cuDNN's FP8 fused attention (per-tensor scaled E4M3 Q, K, V, O, dO) over its BF16 rate at the reference shape,
    # measured; None: none measured (training.fp8.attention is refused)
    flash_attention_fp8: RateRatio | None = None
    kernel_launch_s: float = Field(ge=0, le=1e-3)
    sources: str = Field(min_length=1)
    notes: str = ""  # what is derived rather than published, and caveats (RCCL, unverified figures)
    # spread of sustained compute speed across GPUs of this SKU, standard deviation as a fraction of the
    # typical GPU's: a job's compute-bound kernels run at its slowest GPU's speed (simulator/costs/variability.py)
    speed_sd: float = Field(DEFAULT_SPEED_SD, ge=0, le=0.5)
    base: str | None = Field(
        None,
        description="A shipped GPU this file derives from: the base's numbers with this file's over them (a "
        "mapping such as gemm: or memory_kernels: key by key), and the base's cost table and per-GPU profile "
        "factors (docs/hardware.md).",
    )

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data):
        """``base: NAME``: the shipped GPU's fields, this file's over them."""
        if not isinstance(data, dict) or data.get("base") is None:
            return data
        base = data["base"]
        if not isinstance(base, str) or base not in _catalogue_names():
            raise ValueError(
                f"base: {base!r} is not a shipped GPU; one of {', '.join(sorted(_catalogue_names()))}"
            )
        merged = get_gpu(base).model_dump(exclude={"base"})
        for key, value in data.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        return merged

    @property
    def lineage(self) -> str:
        """The shipped GPU whose name-keyed data (its cost table, per-GPU profile factors) applies to this one: its
        ``base``; itself where it is shipped; a shipped GPU with the very same numbers (a copy under another name);
        else its own name, which nothing shipped is keyed by."""
        if self.base:  # derived from a shipped part (a shipped derived one too: h800-sxm5-80gb from the H100)
            return self.base
        if self.name in _catalogue_names():
            return self.name
        mine = self.model_dump(exclude=_IDENTITY)
        twin = next(
            (g.name for g in gpu_catalogue().values() if g.model_dump(exclude=_IDENTITY) == mine), None
        )
        return twin or self.name

    @model_validator(mode="after")
    def _check(self) -> GPU:
        peaks = self.peak_tflops
        for dtype, value in peaks.items():
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"peak_tflops.{dtype}: {value} must be a positive number")
        sixteen = peaks.get("bf16", peaks.get("fp16"))
        if sixteen is None:
            raise ValueError("peak_tflops: needs a bf16 or fp16 peak (the training types every model uses)")
        for low, high in (("fp8", sixteen), ("fp4", peaks.get("fp8", sixteen))):
            if low in peaks and peaks[low] < high:
                raise ValueError(
                    f"peak_tflops.{low}: {peaks[low]} is below the {high} of the wider type; a narrower "
                    "tensor-core type is never slower (a sparse figure in one place and a dense one in the other?)"
                )
        if "fp8" in peaks and self.architecture not in FP8_ARCHITECTURES:
            raise ValueError(f"peak_tflops.fp8: a {self.architecture} GPU has no FP8 tensor cores")
        for dtype in self.gemm.best_efficiency_by_dtype:
            if dtype not in peaks:
                raise ValueError(f"gemm.best_efficiency_by_dtype.{dtype}: no peak_tflops.{dtype} to scale")
        return self

    @property
    def has_fp8(self) -> bool:
        return "fp8" in self.peak_tflops

    @property
    def block_scaled_formats(self) -> bool:
        """MXFP8 / NVFP4 block-scaled GEMMs in hardware (Blackwell)."""
        return self.architecture in BLOCK_SCALED_ARCHITECTURES

    @property
    def fp8_any_layout(self) -> bool:
        """An FP8 GEMM takes either operand layout: no transposed FP8 copies (Blackwell)."""
        return self.architecture in NON_TN_FP8_ARCHITECTURES

    def best_efficiency(self, dtype: str) -> float:
        """The best measured matmul of ``dtype`` as a fraction of its peak (MAMF)."""
        return self.gemm.best_efficiency_by_dtype.get(dtype, self.gemm.best_efficiency)

    def dtype_efficiency(self, dtype: str) -> float:
        """A ``dtype`` GEMM's efficiency relative to the same shape in 16 bits (1.0 where unmeasured): the ratio of
        their best measured matmuls."""
        return self.best_efficiency(dtype) / self.gemm.best_efficiency

    def at_power(self, limit_w: float | None) -> GPU:
        """The part run at a power limit of ``limit_w`` (None: its own): below its ``power_w`` its compute-bound
        kernels run at ``power_capped_clock`` of their speed (``clock_scale``); HBM and links are unchanged."""
        if limit_w is None or self.power_w is None or limit_w >= self.power_w:
            return self
        scale = self.clock_scale * power_capped_clock(limit_w, self.power_w)
        return self.model_copy(update={"clock_scale": scale, "power_w": limit_w})

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


# what names and describes a GPU rather than what it does: a file that differs only in these is a copy
_IDENTITY = {"name", "display_name", "device_names", "sources", "notes", "base"}


@cache
def _catalogue_names() -> frozenset[str]:
    return frozenset(p.stem for p in _GPU_DIR.glob("*.yaml"))


@cache
def gpu_catalogue() -> dict[str, GPU]:
    """The shipped GPUs by name."""
    return {p.stem: get_gpu(p.stem, "simulator/hardware/gpus") for p in sorted(_GPU_DIR.glob("*.yaml"))}


# Sustained tensor clock under a power limit below the part's own (nvidia-smi -pl): (limit / power_w) ** this.
# The median over nine pairs of MLPerf Inference v4.0 runs of one DGX H100 at 700 W (MaxP) and at per-GPU limits of
# 300-450 W (MaxQ), mlcommons/inference_results_v4.0 @3c4a1cf, closed/NVIDIA/results/DGX-H100_H100-SXM-80GBx8_TRT
# [_MaxQ]/*/Offline/performance/run_1/mlperf_log_summary.txt: throughput ratios 0.67-0.82 at 0.43-0.64 of 700 W give
# exponents 0.23-0.49 (bert 0.48, resnet50 0.47, gptj 0.42, dlrm-v2 0.49, retinanet 0.49, SDXL 0.44, llama2-70b
# 0.49, 3d-unet 0.35, rnnt 0.23). The capped runs were also re-tuned, so the fit leans to the cap's benefit. A cap
# lowers the SM clock, not the memory clock: memory-bound kernels and links keep their speed (docs/hardware.md).
POWER_CAP_EXPONENT = 0.47


def power_capped_clock(limit_w: float, rated_w: float) -> float:
    """The sustained compute clock at ``limit_w`` as a fraction of the part's at its own ``rated_w``: 1 at or
    above it, (limit / rated) ** POWER_CAP_EXPONENT below (a 350 W limit on a 700 W H100: 0.5 ** 0.47 = 0.722)."""
    return min(1.0, (limit_w / rated_w) ** POWER_CAP_EXPONENT)


@cache
def get_gpu(name: str, field: str = "cluster.gpu") -> GPU:
    """A shipped GPU by name (``h100-sxm5-80gb``) or a GPU file by path (``my/gpu.yaml``); every problem is one
    message that starts with ``field``."""
    return load_named(name, _GPU_DIR, field, "GPU", GPU)
