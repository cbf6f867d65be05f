"""The scenario: what the user asked for, validated once.

Four sections, as in Calculon's model / system / execution split and in the vocabulary of Megatron-LM and
DeepSpeed, each in its own module: ``model``, ``cluster``, ``training``, ``parallelism`` (and ``memory``). A
section checks its own fields; checks across sections live here (divisibility, combinations a framework
refuses); checks that need the topology file (GPU count) live in ``resolve.py``. Every message names the field
and shows the arithmetic.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from simulator.scenario.cluster import ClusterConfig
from simulator.scenario.memory import MemoryConfig
from simulator.scenario.model import ModelConfig
from simulator.scenario.parallelism import (
    DEEPSPEED_VERSION,
    AioConfig,
    DdpConfig,
    FsdpConfig,
    OffloadOptimizerConfig,
    OffloadParamConfig,
    ParallelismConfig,
    ZeroConfig,
)
from simulator.scenario.section import MAX_GPUS, MAX_MICROBATCHES, MAX_STAGE_MICROBATCHES, Section
from simulator.scenario.training import OneBitConfig, TrainingConfig

__all__ = [
    "DEEPSPEED_VERSION",
    "MAX_GPUS",
    "MAX_MICROBATCHES",
    "MAX_STAGE_MICROBATCHES",
    "AioConfig",
    "ClusterConfig",
    "DdpConfig",
    "FsdpConfig",
    "MemoryConfig",
    "ModelConfig",
    "OffloadOptimizerConfig",
    "OffloadParamConfig",
    "OneBitConfig",
    "ParallelismConfig",
    "Scenario",
    "TrainingConfig",
    "ZeroConfig",
]


class Scenario(Section):
    name: str = "scenario"
    model: ModelConfig
    cluster: ClusterConfig
    training: TrainingConfig
    parallelism: ParallelismConfig = ParallelismConfig()
    memory: MemoryConfig = MemoryConfig()
    framework: str = Field(
        "auto",
        description="Framework-generation profile (simulator/frameworks/*.yaml): kernel efficiency, extra kernels, "
        "host dispatch. 'auto' = the realistic profile for the scenario's stack and GPU (Megatron, PyTorch FSDP or "
        "eager PyTorch); 'ideal' = the hardware's upper bound.",
    )
    deepspeed_config: str | None = Field(
        None,
        description="A DeepSpeed JSON config whose batch, precision, optimizer and ZeRO settings fill this scenario.",
    )
    kernels: str = Field(
        "auto",
        description="Measured kernel and collective costs (docs/calibration.md): 'auto' = the shipped table of the "
        "cluster's GPU where there is one, 'none' = the pure model, a shipped table's name, or a table directory.",
    )

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        m, p = self.model, self.parallelism
        tp = p.tensor_parallel
        if m.num_attention_heads % tp:
            raise ValueError(
                f"model.num_attention_heads ({m.num_attention_heads}) is not divisible by tensor_parallel ({tp})"
            )
        if m.query_groups % tp and tp % m.query_groups:
            raise ValueError(
                f"model.num_query_groups ({m.query_groups}) and tensor_parallel ({tp}) do not divide"
            )
        if m.ffn_size % tp:
            raise ValueError(
                f"model.ffn_hidden_size ({m.ffn_size}) is not divisible by tensor_parallel ({tp})"
            )
        if sorted(p.rank_order.split("-")) != ["cp", "dp", "pp", "tp"]:
            raise ValueError(
                f"parallelism.rank_order ({p.rank_order}) must name tp, cp, dp and pp once each, innermost first"
            )
        if p.tp_comm_overlap and p.tensor_parallel > 1 and not p.sequence_parallel:
            raise ValueError(
                "parallelism.tp_comm_overlap needs sequence_parallel: true (Megatron-Core overlaps the all-gather / "
                "reduce-scatter pairs of sequence parallelism)"
            )
        cp = p.context_parallel
        if cp > 1 and m.attention == "standard":
            raise ValueError(
                f"parallelism.context_parallel ({cp}) needs model.attention: flash (context parallelism runs ring "
                "attention on fused attention kernels, as in Megatron-Core and torchtitan)"
            )
        if cp > 1 and m.seq_length % (2 * cp):
            raise ValueError(
                f"model.seq_length ({m.seq_length}) is not divisible by 2 x context_parallel ({cp}) = {2 * cp} "
                "(causal load balancing gives each rank two chunks)"
            )
        z = p.zero
        zeropp = [k for k in ("zero_quantized_weights", "zero_quantized_gradients") if getattr(z, k)]
        if z.zero_hpz_partition_size > 1:
            zeropp.append("zero_hpz_partition_size")
        if zeropp and p.zero_stage != 3:
            raise ValueError(
                f"parallelism.zero: {', '.join(zeropp)} (ZeRO++) need zero_stage: 3 (got {p.zero_stage})"
            )
        opt_dev, param_dev = z.offload_optimizer.device, z.offload_param.device
        if opt_dev != "none" and p.zero_stage == 0:
            raise ValueError(
                f"parallelism.zero.offload_optimizer.device ({opt_dev}) needs zero_stage 1, 2 or 3 (got 0)"
            )
        if param_dev != "none" and p.zero_stage != 3:
            raise ValueError(
                f"parallelism.zero.offload_param.device ({param_dev}) needs zero_stage: 3 (got {p.zero_stage})"
            )
        if z.offload_optimizer.delayed_param_update and (opt_dev == "none" or p.zero_stage == 3):
            raise ValueError(
                "parallelism.zero.offload_optimizer.delayed_param_update is ZeRO-Offload's schedule: it needs "
                f"offload_optimizer.device cpu or nvme with zero_stage 1 or 2 (got device {opt_dev}, "
                f"zero_stage {p.zero_stage})"
            )
        if (opt_dev != "none" or param_dev != "none") and p.pipeline_parallel > 1:
            raise ValueError(
                f"parallelism.zero offload is modelled without pipeline parallelism (pipeline_parallel = "
                f"{p.pipeline_parallel}); DeepSpeed's pipeline engine supports ZeRO stage 1 only"
            )
        opt = self.training.optimizer
        if opt in ("onebit-adam", "zero-one-adam") and (p.zero_stage or p.fsdp or p.pipeline_parallel > 1):
            raise ValueError(
                f"training.optimizer {opt} compresses a data-parallel all-reduce: it needs zero_stage 0, no fsdp "
                f"and pipeline_parallel 1 (got zero_stage {p.zero_stage}, pipeline_parallel "
                f"{p.pipeline_parallel}); DeepSpeed's 1-bit optimizers do not support ZeRO-2/3"
            )
        if p.fsdp is not None and p.zero_stage:
            raise ValueError(
                f"parallelism: choose either fsdp (PyTorch) or zero_stage (DeepSpeed), not both "
                f"(zero_stage = {p.zero_stage})"
            )
        return self

    @property
    def gradient_accumulation_steps(self) -> int:
        dp = self.parallelism.data_parallel or 1
        return self.training.global_batch_size // (self.training.micro_batch_size * dp)
