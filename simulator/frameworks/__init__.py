"""Framework-generation profiles: how close a training framework of a given era gets to the hardware.

The GPU profile says what the silicon can do (best measured GEMM efficiency, HBM bandwidth); a framework profile
says how much of it a software generation reaches: multipliers on GEMM, attention and memory-bound kernel
efficiency, and a per-kernel overhead (launch gaps, Python dispatch, hooks). One small profile per framework
generation, fitted with ``clustersim calibrate`` on named cases, never per case. ``ideal`` (all 1, no
overhead) is the default.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from simulator.errors import ScenarioError

PROFILE_DIR = Path(__file__).parent


class GpuFactors(BaseModel):
    """Factors of a framework generation on one GPU where it ran differently there (early kernels for a new
    architecture): each given one replaces the profile's own on that GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    gemm_efficiency: float | None = Field(None, gt=0, le=1.5)
    attention_efficiency: float | None = Field(None, gt=0, le=1.5)
    memory_efficiency: float | None = Field(None, gt=0, le=1.5)
    kernel_overhead_s: float | None = Field(None, ge=0)
    fitted: str = ""


class Framework(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    description: str = ""
    gemm_efficiency: float = Field(1.0, gt=0, le=1.5, description="Multiplier on the GPU's GEMM efficiency.")
    attention_efficiency: float = Field(
        1.0, gt=0, le=1.5, description="Multiplier on FlashAttention efficiency."
    )
    memory_efficiency: float = Field(
        1.0, gt=0, le=1.5, description="Multiplier on memory-bound kernel efficiency."
    )
    kernel_overhead_s: float = Field(
        0.0, ge=0, description="Extra seconds per kernel (launch gaps, dispatch)."
    )
    fitted: str = Field("", description="How the numbers were obtained: cases, command, date.")
    gpus: dict[str, GpuFactors] = Field(
        default_factory=dict, description="Per-GPU factors (catalogue name -> factors) replacing those above."
    )

    def on_gpu(self, gpu: str) -> Framework:
        """The profile as it applies on ``gpu``."""
        factors = self.gpus.get(gpu)
        if factors is None:
            return self
        return self.model_copy(
            update={k: v for k, v in factors.model_dump(exclude={"fitted"}).items() if v is not None}
        )


def available_frameworks() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


@cache
def get_framework(name: str) -> Framework:
    path = PROFILE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ScenarioError(
            f"framework: unknown framework '{name}'; available: {', '.join(available_frameworks())}"
        )
    return Framework.model_validate(yaml.safe_load(path.read_text()))
