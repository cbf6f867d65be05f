"""The scenario: what the user asked for, validated once.

Four sections, as in Calculon's model / system / execution split and in the vocabulary of Megatron-LM and
DeepSpeed, each in its own module: ``model``, ``cluster``, ``training``, ``parallelism`` (and ``memory``). A
section checks its own fields; checks across sections live here (divisibility, combinations a framework
refuses); checks that need the topology file (GPU count) live in ``resolve.py``. Every message names the field
and shows the arithmetic.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from simulator.scenario import pipeline_layout
from simulator.scenario.cluster import ClusterConfig
from simulator.scenario.memory import MemoryConfig
from simulator.scenario.model import ModelConfig
from simulator.scenario.parallelism import (
    DEEPSPEED_VERSION,
    DUAL_SCHEDULES,
    FLEX_DISPATCHERS,
    AioConfig,
    DdpConfig,
    FsdpConfig,
    MoeParallelConfig,
    OffloadOptimizerConfig,
    OffloadParamConfig,
    ParallelismConfig,
    ZeroConfig,
    path_stages,  # noqa: F401  (the pipeline's stage count, for the strategies: schedules/__init__.py)
)
from simulator.scenario.section import MAX_GPUS, MAX_MICROBATCHES, MAX_STAGE_MICROBATCHES, Section
from simulator.scenario.training import ONEBIT_OPTIMIZERS, OneBitConfig, TrainingConfig

__all__ = [
    "DEEPSPEED_VERSION",
    "MAX_GPUS",
    "MAX_MICROBATCHES",
    "MAX_STAGE_MICROBATCHES",
    "ONEBIT_OPTIMIZERS",
    "AioConfig",
    "ClusterConfig",
    "DdpConfig",
    "FsdpConfig",
    "MemoryConfig",
    "ModelConfig",
    "MoeParallelConfig",
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
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
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
    torchtitan_config: str | None = Field(
        None,
        description="A torchtitan TOML job config whose batch, sequence, parallelism, activation checkpointing and "
        "compile settings fill this scenario (scenario/torchtitan.py).",
    )
    megatron_args: str | None = Field(
        None,
        description="A Megatron-LM launch command line (a shell script or the text plan --emit megatron writes) whose "
        "flags fill this scenario, Megatron's defaults where a flag is absent (scenario/megatron_args.py).",
    )
    kernels: str = Field(
        "auto",
        description="Measured kernel and collective costs (docs/calibration.md): 'auto' = the shipped table of the "
        "cluster's GPU where there is one, 'none' = the pure model, a shipped table's name, or a table directory "
        "(layered over the shipped table of the cluster's GPU: its rows first, the shipped rows where it has none).",
    )
    note: str | None = Field(
        None,
        max_length=2000,
        description="What a reader of this scenario's results should know (printed under run's table): e.g. why "
        "the simulated MFU differs from a published one.",
    )
    kernels_only: bool = Field(
        False,
        description="A table directory in kernels: alone, without the shipped table beneath it (rows it lacks are "
        "modelled).",
    )

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        m, p = self.model, self.parallelism
        tp = p.tensor_parallel
        if p.pipeline_layout is not None:
            self._check_layout()
        if "mla_up_proj" in self.training.recompute.modules and m.mla is None:
            # Megatron-Core transformer_config.py (d98e8a64): "mla_up_proj in recompute_modules is only supported
            # with multi-latent attention"
            raise ValueError(
                "training.recompute.modules: mla_up_proj needs multi-head latent attention (model.mla)"
            )
        if self.training.activation_fp8_input_store and m.activation != "swiglu":
            # Megatron-Core transformer_config.py: "Storing activation input in FP8 is supported only for SwiGLU."
            raise ValueError(
                f"training.activation_fp8_input_store needs model.activation swiglu (got {m.activation}): "
                "Megatron-Core stores only SwiGLU's input in FP8"
            )
        n = self.training.activation_offload_layers
        if n:
            # Megatron-LM arguments.py: num_layers_per_offload < num_layers; no pipeline parallelism with it
            if n >= m.num_layers:
                raise ValueError(
                    f"training.activation_offload_layers ({n}) must be below model.num_layers ({m.num_layers}): "
                    "the last layers' backward comes too soon to reload them (Megatron-LM's own check)"
                )
            if p.pipeline_parallel > 1:
                raise ValueError(
                    "training.activation_offload_layers is replayed without pipeline parallelism only "
                    f"(pipeline_parallel {p.pipeline_parallel})"
                )
            if self.training.activation_recompute == "full" or p.fsdp is not None or p.zero_stage == 3:
                raise ValueError(
                    "training.activation_offload_layers is not replayed with full recompute, FSDP or ZeRO-3"
                )
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
        # Megatron pads the vocabulary to a multiple of 128 x TP: one below TP is a typo, not a model
        if m.vocab_size < tp:
            raise ValueError(
                f"model.vocab_size ({m.vocab_size}) is smaller than tensor_parallel ({tp}): a rank's share of the "
                "embedding and output layer would be empty"
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
        self._check_moe()
        if "moe" in self.training.cuda_graph_modules and m.moe is not None and not m.moe.pad_to_capacity:
            # megatron/core/transformer/enums.py CudaGraphModule.moe: "drop-and-pad MoE layers only"
            raise ValueError(
                "training.cuda_graph_modules: moe captures drop-and-pad MoE layers only (model.moe.capacity_factor "
                "and pad_to_capacity); a dropless layer's sizes are known only on the GPU: use moe_router and "
                "moe_preprocess"
            )
        if m.hybrid_pattern is not None:
            self._check_hybrid()
        if m.mtp_layers and (p.fsdp is not None or p.zero_stage == 3):
            raise ValueError(
                f"model.mtp_layers ({m.mtp_layers}) is not modelled with fsdp or zero_stage 3 (their per-module "
                "replay does not know the multi-token prediction module)"
            )
        if p.fsdp is not None and p.zero_stage:
            raise ValueError(
                f"parallelism: choose either fsdp (PyTorch) or zero_stage (DeepSpeed), not both "
                f"(zero_stage = {p.zero_stage})"
            )
        return self

    def _check_layout(self) -> None:
        """Megatron-Core's layout string: what it parses, and validate_layer_layout's conditions."""
        p, m = self.parallelism, self.model
        if p.first_pipeline_stage_layers or p.last_pipeline_stage_layers:
            raise ValueError(
                "parallelism.pipeline_layout states every stage: leave first_pipeline_stage_layers and "
                "last_pipeline_stage_layers unset (Megatron refuses them together)"
            )
        if p.pipeline_parallel == 1 or p.pipeline_schedule == "deepspeed":
            raise ValueError(
                "parallelism.pipeline_layout is Megatron-Core's: it needs pipeline_parallel > 1 and a Megatron or "
                "DualPipe schedule"
            )
        pipeline_layout.check(p.pipeline_layout, p.layout_stages, m.num_layers, m.mtp_layers, p.path_stages)

    def _check_hybrid(self) -> None:
        """What the simulator does not model of a hybrid stack (model.hybrid_pattern), refused by name."""
        p, tr = self.parallelism, self.training
        if p.context_parallel > 1:
            raise ValueError(
                "parallelism.context_parallel with model.hybrid_pattern is not modelled (Megatron's Mamba mixers "
                "exchange heads for sequence with all-to-alls: mamba_context_parallel.py)"
            )
        if p.zero_stage == 3 or p.fsdp is not None:
            raise ValueError(
                "model.hybrid_pattern with zero_stage 3 or fsdp is not modelled (their per-module replay knows "
                "transformer layers only)"
            )
        if tr.activation_recompute == "selective-op":
            raise ValueError(
                "training.activation_recompute selective-op (torchtitan's) with model.hybrid_pattern"
            )
        if (
            self.model.mamba_heads % p.tensor_parallel
            or self.model.mamba_config.num_groups % p.tensor_parallel
        ):
            raise ValueError(
                f"parallelism.tensor_parallel ({p.tensor_parallel}) must divide the Mamba heads "
                f"({self.model.mamba_heads}) and groups ({self.model.mamba_config.num_groups}), as MambaMixer asserts"
            )

    def _check_moe(self) -> None:
        """Expert parallelism against the model and the layouts the frameworks accept (Megatron-Core
        ``parallel_state.initialize_model_parallel`` and ``moe_layer.py``, core_v0.13.0; DeepSpeed refuses ZeRO-3)."""
        m, p = self.model, self.parallelism
        ep, etp = p.expert_parallel, p.expert_tensor_parallel
        if m.moe is None:
            if ep > 1 or etp is not None:
                raise ValueError(
                    f"parallelism: expert_parallel ({ep}) / expert_tensor_parallel need a mixture-of-experts model "
                    "(model.moe)"
                )
            return
        e = m.moe.num_experts
        if e % ep:
            raise ValueError(
                f"parallelism.expert_parallel ({ep}) does not divide model.moe.num_experts ({e})"
            )
        if not m.moe_layers:
            raise ValueError(
                f"model.moe makes no layer a mixture of experts: num_layers ({m.num_layers}), first_dense_layers "
                f"({m.moe.first_dense_layers}) and layer_freq ({m.moe.layer_freq}) leave every layer dense"
            )
        # Megatron-Core splits each expert's MLP over ETP and the shared experts' over TP with divide(), which
        # asserts an exact split (megatron/core/utils.py divide; moe/experts.py, moe/shared_experts.py)
        width = m.expert_ffn_size
        if width % p.etp:
            raise ValueError(
                f"model.moe.ffn_hidden_size ({width}, one routed expert's MLP) is not divisible by "
                f"expert_tensor_parallel ({p.etp})"
            )
        shared = m.moe.shared_expert_ffn_hidden_size
        if shared and shared % p.tensor_parallel:
            raise ValueError(
                f"model.moe.shared_expert_ffn_hidden_size ({shared}) is not divisible by tensor_parallel "
                f"({p.tensor_parallel})"
            )
        if p.tensor_parallel > 1 and not p.sequence_parallel:
            raise ValueError(
                f"parallelism: MoE layers with tensor_parallel ({p.tensor_parallel}) need sequence_parallel: true "
                "(Megatron-Core refuses MoE training with TP and without SP)"
            )
        if (
            (ep > 1 or p.etp != p.tensor_parallel)
            and p.pipeline_parallel > 1
            and not p.rank_order.endswith("pp")
        ):
            raise ValueError(
                f"parallelism.rank_order ({p.rank_order}): expert parallelism folds over each pipeline stage's ranks, "
                "so pp must be outermost (the order must end in pp)"
            )
        if p.fsdp is not None or p.zero_stage == 3:
            raise ValueError(
                "parallelism: fsdp and zero_stage 3 are not modelled with model.moe (DeepSpeed refuses ZeRO-3 with MoE; "
                "FSDP with expert parallelism is not replayed yet): use zero_stage 0-2"
            )
        if self.training.optimizer in ("onebit-adam", "zero-one-adam"):
            raise ValueError(f"training.optimizer {self.training.optimizer} is not modelled with model.moe")
        z = p.zero
        if z.offload_optimizer.device != "none" or z.offload_param.device != "none":
            raise ValueError("parallelism.zero offload is not modelled with model.moe")
        if p.pipeline_schedule == "pipedream-2bw":
            raise ValueError("parallelism.pipeline_schedule pipedream-2bw is not modelled with model.moe")
        if p.moe.fp8_dispatch and p.moe.dispatcher == "hybridep":
            # Megatron-LM fused_a2a.py: "HybridEP dispatcher does not support fp8 dispatch now"
            raise ValueError(
                "parallelism.moe.fp8_dispatch: HybridEP does not support FP8 dispatch (Megatron-LM)"
            )
        if p.moe.fp8_dispatch and (p.moe.dispatcher != "deepep" or self.training.precision != "fp8"):
            raise ValueError(
                "parallelism.moe.fp8_dispatch is DeepEP's FP8 dispatch: it needs dispatcher: deepep and training."
                f"precision: fp8 (got {p.moe.dispatcher}, {self.training.precision})"
            )
        if p.moe.dispatcher == "deepspeed":
            if m.moe.capacity_factor is None:
                raise ValueError(
                    "parallelism.moe.dispatcher deepspeed drops tokens at a capacity: set model.moe.capacity_factor "
                    "(DeepSpeed-MoE's default is 1.0)"
                )
            if p.etp > 1:
                raise ValueError(
                    f"parallelism.moe.dispatcher deepspeed is replayed without expert tensor parallelism "
                    f"(expert_tensor_parallel {p.etp}); set it to 1"
                )
        if p.moe.overlap_a2a:
            # Megatron-Core's own checks (transformer_config.py, core_v0.14.0) and what is replayed here
            if p.expert_parallel < 2:
                raise ValueError(
                    "parallelism.moe.overlap_a2a needs expert_parallel > 1 (Megatron-Core asserts it)"
                )
            if p.moe.dispatcher not in ("alltoall", *FLEX_DISPATCHERS):
                raise ValueError(
                    f"parallelism.moe.overlap_a2a works with the alltoall and the flex (deepep, hybridep) dispatchers, not "
                    f"{p.moe.dispatcher}"
                )
            if self.training.activation_recompute == "full":
                raise ValueError(
                    "parallelism.moe.overlap_a2a cannot run with activation_recompute: full (Megatron-Core)"
                )
            if p.pipeline_parallel == 1 and p.zero_stage > 1:
                raise ValueError(
                    f"parallelism.moe.overlap_a2a is Megatron-Core's: with zero_stage {p.zero_stage} every micro-batch "
                    "reduces its gradients, which the combined 1F1B does not replay; use zero_stage 0 or 1 (the "
                    "distributed optimizer)"
                )
            if (
                p.pipeline_parallel > 1
                and p.pipeline_schedule not in DUAL_SCHEDULES
                and (p.pipeline_schedule != "interleaved-1f1b" or p.virtual_pipeline_stages < 2)
            ):
                raise ValueError(
                    "parallelism.moe.overlap_a2a with pipeline_parallel > 1 needs pipeline_schedule: interleaved-1f1b "
                    "with virtual_pipeline_stages >= 2 (Megatron-Core asserts virtual stages), or dualpipe / dualpipev"
                )
        if p.pipeline_schedule == "deepspeed":
            raise ValueError(
                "parallelism.pipeline_schedule deepspeed is not modelled with model.moe (DeepSpeed-MoE runs without "
                "its pipeline engine here); use a Megatron schedule"
            )

    @property
    def gradient_accumulation_steps(self) -> int:
        dp = self.parallelism.data_parallel or 1
        return self.training.global_batch_size // (self.training.micro_batch_size * dp)
