"""``training:``: batch, precision, optimizer (with DeepSpeed's 1-bit optimizers' settings), activation
recompute and checkpointing, CUDA graphs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, PositiveInt, model_validator

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


SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_count(value: object) -> object:
    """``15T`` -> 1.5e13, ``300B`` -> 3e11 (decimal suffixes K, M, B or G, T, P); numbers pass through."""
    if isinstance(value, str):
        text = value.strip().replace(",", "").replace("_", "")
        scale = SUFFIXES.get(text[-1:].upper(), 1.0) if text else 1.0
        number = text[:-1] if scale != 1.0 else text
        try:
            return float(number) * scale
        except ValueError:
            raise ValueError(f"expected a number such as 15T or 3e11, got {value!r}") from None
    return value


TokenCount = Annotated[float, BeforeValidator(parse_count), Field(gt=0, le=1e18, allow_inf_nan=False)]

Fp8Recipe = Literal["delayed", "tensorwise", "mxfp8", "blockwise", "nvfp4"]


class Fp8Config(Section):
    """How ``precision: fp8`` runs (Transformer Engine v2.18 recipes and Megatron-Core core_v0.19.0's flags, or
    torchao v0.18.0's Float8Linear under FSDP2; docs/fp8.md). Weights, activations and gradients stay bf16; the
    linear layers' GEMMs (QKV, projection, MLP or expert FC1 / FC2) run in the recipe's format."""

    recipe: Literal["auto", "delayed", "tensorwise", "mxfp8", "blockwise", "nvfp4"] = Field(
        "auto",
        description="delayed (per-tensor scale from the amax history: Megatron --fp8-recipe delayed), tensorwise "
        "(per-tensor current scaling), mxfp8 (1x32 blocks, Blackwell), blockwise (DeepSeek-style 1x128 / 128x128), "
        "nvfp4 (FP4 with 16-element blocks, Blackwell; a what-if). auto: Transformer Engine's default, delayed on "
        "Hopper and mxfp8 on Blackwell; tensorwise with torchao.",
    )
    library: Literal["auto", "transformer-engine", "torchao"] = Field(
        "auto",
        description="Who casts: Transformer Engine (saves FP8 inputs for backward, caches FP8 weights) or torchao "
        "Float8Linear (saves bf16, casts again in backward). auto: torchao with FSDP, else Transformer Engine.",
    )
    param_gather: bool = Field(
        False,
        description="Weights kept and all-gathered in FP8 (Megatron --fp8-param-gather with the distributed "
        "optimizer; FSDP2 enable_fsdp_float8_all_gather): half the bf16 all-gather bytes, no bf16 weight copy.",
    )
    attention: bool = Field(
        False,
        description="Attention's fused kernel in FP8 too (Transformer Engine fp8_dpa; Megatron-Core "
        "TransformerConfig.fp8_dot_product_attention, no Megatron-LM flag; NeMo / MLPerf FP8_DPA=True): at the "
        "GPU's measured FP8 attention rate (flash_attention_fp8 in its file); refused on a GPU with none.",
    )
    op_fuser: bool = Field(
        False,
        description="Transformer Engine's operation fuser runs the MLP (Megatron-Core use_transformer_engine_op_fuser, "
        "--use-transformer-engine-op-fuser; NVIDIA's MLPerf USE_TE_OPS=True): its activation writes the next linear "
        "layer's quantized input and its gradient the previous one's (delayed scaling and MXFP8 fully, current "
        "scaling and NVFP4 with the amax taken in the same pass; TE activation.cpp). Transformer Engine only.",
    )
    bf16_layers: int = Field(
        0,
        ge=0,
        le=1024,
        description="Layers kept in bf16 at each end of the model (Megatron --first-last-layers-bf16 with "
        "--num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16); not with the delayed recipe.",
    )


class RecomputeConfig(Section):
    """Which layers activation recompute covers, as the frameworks state it."""

    method: Literal["uniform", "block"] | None = Field(
        None,
        description="Megatron --recompute-method with activation_recompute: full: uniform (checkpoint every "
        "num_layers layers as one group; all layers recomputed) or block (recompute only the first num_layers "
        "layers of each pipeline chunk). Default: every layer on its own (uniform, 1).",
    )
    num_layers: PositiveInt | None = Field(
        None, le=2**16, description="Megatron --recompute-num-layers (with method)."
    )
    every: PositiveInt = Field(
        2,
        le=2**16,
        description="selective-layer (torchtitan selective_ac_option: N): every N-th layer recomputed in full.",
    )
    modules: tuple[
        Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"], ...
    ] = Field(
        ("core_attn",),
        description="With activation_recompute: selective, Megatron-Core's --recompute-modules: core_attn "
        "(attention's core), moe_act (the experts' activation: its output not kept), layernorm (the norms not "
        "fused into a linear layer: an MoE layer's pre-MLP norm; its output not kept), mla_up_proj (multi-head "
        "latent attention's up-projections and rotary: queries, keys and values not kept), mlp (a dense layer's MLP: "
        "only its input kept, re-run whole), moe (an MoE layer's MLP, dispatch and combine included), "
        "shared_experts (the shared experts). Default: core_attn, Megatron-Core's (workload/recompute.py).",
    )


# DeepSpeed's compressed-communication optimizers (strategy/onebit.py builds their steps)
ONEBIT_OPTIMIZERS = ("onebit-adam", "zero-one-adam")


class TrainingConfig(Section):
    global_batch_size: PositiveInt = Field(le=2**40)
    micro_batch_size: PositiveInt = Field(1, le=2**20)
    precision: Literal["fp16", "bf16", "fp32", "fp8"] = "bf16"
    optimizer: Literal["adam", "adamw", "sgd", "onebit-adam", "zero-one-adam"] = "adam"
    onebit: OneBitConfig = Field(default_factory=OneBitConfig)
    optimizer_moments: Literal["fp32", "bf16", "fp16", "fp8"] = Field(
        "fp32",
        description="The dtype Adam keeps its two moments in (Megatron-LM --use-precision-aware-optimizer "
        "--exp-avg-dtype X --exp-avg-sq-dtype X, Transformer Engine's FusedAdam; DeepSeek-V3: bf16): optimizer "
        "states 4 + 2 x its bytes per parameter beside the fp32 master weights, and the step streams fewer bytes.",
    )
    activation_fp8_input_store: bool = Field(
        False,
        description="SwiGLU keeps its input for backward in FP8, one byte an element, cast back before its backward "
        "(Megatron-Core --activation-func-fp8-input-store, TransformerConfig.activation_func_fp8_input_store: dense "
        "MLPs, routed and shared experts; DeepSeek-V3 caches its MoE SwiGLU inputs in FP8).",
    )
    fp8: Fp8Config = Field(
        default_factory=Fp8Config, description="How precision: fp8 runs (ignored otherwise)."
    )
    total_tokens: TokenCount | None = Field(
        None,
        description="Tokens the whole training run sees (15T, 300B or a number): time, GPU-hours and cost to train.",
    )
    activation_recompute: Literal["none", "selective", "full", "selective-op", "selective-layer"] = Field(
        "none",
        description="none; selective (Korthikanti et al.: attention's core); full (every layer from its input; "
        "recompute: narrows it as Megatron's --recompute-method / --recompute-num-layers); selective-op (torchtitan "
        "per-op: every other matmul and the elementwise kernels recomputed, attention and the rest saved); "
        "selective-layer (torchtitan: every recompute.every-th layer in full).",
    )
    recompute: RecomputeConfig = Field(default_factory=RecomputeConfig)
    partition_activations: bool = Field(
        False,
        description="DeepSpeed activation checkpointing: split each checkpoint across the tensor-parallel ranks.",
    )
    cpu_checkpointing: bool = Field(
        False,
        description="DeepSpeed activation checkpointing: keep the (partitioned) checkpoints in host memory.",
    )
    compile: bool = Field(
        False,
        description="torch.compile of each transformer block (torchtitan --compile.enable, Inductor's default "
        "mode): an eager framework's elementwise chains run fused, except RoPE in complex numbers, which Inductor "
        "leaves to eager kernels (workload/elementwise.py).",
    )
    cross_entropy_fusion: Literal["none", "native", "te"] | None = Field(
        None,
        description="Megatron-Core's fused loss (--cross-entropy-loss-fusion --cross-entropy-fusion-impl; NeMo / "
        "MLPerf CE_FUSION_IMPL): 'native' = fused_cross_entropy.py's jit-fused passes on fp32 logits, 'te' = "
        "Transformer Engine's Triton parallel_cross_entropy (an online-softmax pass and one that writes the "
        "gradient in place), 'none' = vocab_parallel_cross_entropy's separate passes. Default: the framework's.",
    )
    compile_loss: bool = Field(
        True,
        description="With compile: the loss compiled too, its fp32 upcast fused into log_softmax (torchtitan "
        "train.py; off from 2024-12-18, e8977b0, to 2025-04-02, bbb1b61, so its December 2024 benchmarks ran "
        "the loss eager).",
    )
    activation_offload_layers: int = Field(
        0,
        ge=0,
        le=2**16,
        description="Megatron-Core --cpu-offloading --cpu-offloading-num-layers N (Transformer Engine's CPU offload "
        "context): the first N layers' activations go to pinned host memory during the forward, each copy beside "
        "the next layer's compute, and come back one layer ahead in the backward (workload/offload.py).",
    )
    cuda_graphs: bool = Field(
        False,
        description="Forward and backward steps captured as CUDA graphs: one launch per step instead of one host "
        "dispatch per kernel (Megatron-Core --enable-cuda-graph, torch.compile mode='reduce-overhead').",
    )
    cuda_graph_modules: tuple[Literal["attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"], ...] = (
        Field(
            (),
            description="With cuda_graphs: capture only these modules of each layer (Megatron-Core --cuda-graph-modules, "
            "formerly --cuda-graph-scope, with --cuda-graph-impl transformer_engine or local): their kernels go out in "
            "one launch each, everything else (the embedding, the loss, an MoE layer's dispatch, experts and combine "
            "unless 'moe') is issued kernel by kernel, and the host waits outside them stay; each graphed layer keeps "
            "static inputs per micro-batch in flight (docs/memory.md). Empty: every layer whole.",
        )
    )

    @property
    def graph_capture(self) -> bool | frozenset[str]:
        """What CUDA graphs capture: nothing (False), every layer whole (True), or these modules of each layer."""
        if not self.cuda_graphs:
            return False
        return frozenset(self.cuda_graph_modules) or True

    @model_validator(mode="after")
    def _check(self) -> TrainingConfig:
        mods = self.cuda_graph_modules
        if mods and not self.cuda_graphs:
            raise ValueError("training.cuda_graph_modules needs training.cuda_graphs: true")
        if "moe_preprocess" in mods and "moe_router" not in mods:
            # megatron/core/transformer/enums.py CudaGraphModule: "moe_preprocess ... (requires moe_router)"
            raise ValueError(
                "training.cuda_graph_modules: moe_preprocess needs moe_router (as Megatron-Core)"
            )
        if self.optimizer_moments != "fp32" and self.optimizer not in ("adam", "adamw"):
            raise ValueError(
                f"training.optimizer_moments ({self.optimizer_moments}) is Adam's moments' dtype: it needs optimizer "
                f"adam or adamw (got {self.optimizer})"
            )
        rc = self.recompute
        if rc.modules != ("core_attn",) and self.activation_recompute != "selective":
            raise ValueError(
                f"training.recompute.modules ({', '.join(rc.modules) or 'none'}) is Megatron's selective recompute: "
                f"it needs activation_recompute: selective (got {self.activation_recompute})"
            )
        if rc.method is not None and self.activation_recompute != "full":
            raise ValueError(
                f"training.recompute.method ({rc.method}) is Megatron's way to narrow full recompute: it needs "
                f"activation_recompute: full (got {self.activation_recompute})"
            )
        if (rc.method is None) != (rc.num_layers is None):
            raise ValueError(
                "training.recompute: method and num_layers go together (Megatron --recompute-method block "
                "--recompute-num-layers 4)"
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

    @property
    def dtype(self) -> str:
        """The type of weights, activations and gradients: the precision, except FP8 training, which keeps them in
        bf16 and runs the linear layers' GEMMs in FP8."""
        return "bf16" if self.precision == "fp8" else self.precision
