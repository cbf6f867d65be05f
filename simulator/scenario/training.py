"""``training:``: batch, precision, optimizer (with DeepSpeed's 1-bit optimizers' settings), activation
recompute and checkpointing, CUDA graphs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from simulator.scenario.section import Section


class OneBitConfig(Section):
    """DeepSpeed's communication-compressed optimizers, with their parameter names and defaults.

    1-bit Adam (Tang et al. 2021): ``freeze_step`` full-precision warm-up steps, then error-compensated 1-bit
    all-reduce of the momentum. 0/1 Adam (Lu et al. 2022): the variance is updated (full-precision all-reduce)
    at intervals that double every ``var_update_scaler`` updates until ``var_freeze_step``; other steps use
    1-bit all-reduce, and after ``var_freeze_step`` only every k-th step synchronises, k doubling every
    ``local_step_scaler`` steps up to ``local_step_clipper``.
    """

    freeze_step: PositiveInt = Field(100000, description="1-bit Adam: full-precision warm-up steps.")
    var_freeze_step: PositiveInt = Field(100000, description="0/1 Adam: last step that updates the variance.")
    var_update_scaler: PositiveInt = Field(
        16, description="0/1 Adam: variance updates per interval doubling."
    )
    local_step_scaler: PositiveInt = Field(32678, description="0/1 Adam: steps per local-interval doubling.")
    local_step_clipper: PositiveInt = Field(16, description="0/1 Adam: largest interval between syncs.")
    total_steps: PositiveInt | None = Field(
        None, description="Training steps the amortised iteration time averages over."
    )


class TrainingConfig(Section):
    global_batch_size: PositiveInt = Field(le=2**40)
    micro_batch_size: PositiveInt = Field(1, le=2**20)
    precision: Literal["fp16", "bf16", "fp32", "fp8"] = "bf16"
    optimizer: Literal["adam", "adamw", "sgd", "onebit-adam", "zero-one-adam"] = "adam"
    onebit: OneBitConfig = OneBitConfig()
    activation_recompute: Literal["none", "selective", "full"] = "none"
    partition_activations: bool = Field(
        False,
        description="DeepSpeed activation checkpointing: split each checkpoint across the tensor-parallel ranks.",
    )
    cpu_checkpointing: bool = Field(
        False,
        description="DeepSpeed activation checkpointing: keep the (partitioned) checkpoints in host memory.",
    )
    cuda_graphs: bool = Field(
        False,
        description="Forward and backward steps captured as CUDA graphs: one launch per step instead of one host "
        "dispatch per kernel (Megatron-Core --enable-cuda-graph, torch.compile mode='reduce-overhead').",
    )

    @model_validator(mode="after")
    def _check(self) -> TrainingConfig:
        if self.precision == "fp8":
            raise ValueError(
                "training.precision fp8 is not modelled: Transformer Engine's FP8 GEMM efficiencies, its cast and "
                "amax-history kernels and its extra weight copies are not measured here, and a guess would be "
                "reported as a prediction; use bf16 (the FP8 peak is in the H100 / H200 GPU files)"
            )
        for key in ("partition_activations", "cpu_checkpointing"):
            if getattr(self, key) and self.activation_recompute != "full":
                raise ValueError(
                    f"training.{key} applies to activation checkpoints: it needs activation_recompute: full "
                    f"(got {self.activation_recompute})"
                )
        if self.cpu_checkpointing and not self.partition_activations:
            raise ValueError(
                "training.cpu_checkpointing offloads partitioned checkpoints: it needs partition_activations: true "
                "(as in DeepSpeed)"
            )
        return self
