"""Framework-generation profiles: how close a training framework of a given era gets to the hardware.

The GPU profile says what the silicon can do (best measured GEMM efficiency, HBM bandwidth); a framework profile
says how much of it a software generation reaches: multipliers on GEMM, attention and memory-bound kernel
efficiency, which kernels it launches beyond the model's own (``kernels``), and how its host thread issues work
(``host``: seconds per kernel launched from Python, where it synchronises with the GPU). One small profile per framework
generation, fitted with ``clustersim calibrate profile`` on named public runs, never per case. ``ideal`` (all 1,
no host cost) is the upper bound.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from simulator.hardware.gpus import Architecture
from simulator.scenario.files import load_named

PROFILE_DIR = Path(__file__).parent


class GpuFactors(BaseModel):
    """Factors of a framework generation on one GPU where it ran differently there (early kernels for a new
    architecture): each given one replaces the profile's own on that GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    gemm_efficiency: float | None = Field(None, gt=0, le=1.5)
    attention_efficiency: float | None = Field(None, gt=0, le=1.5)
    memory_efficiency: float | None = Field(None, gt=0, le=1.5)
    kernel_overhead_s: float | None = Field(None, ge=0)
    fitted: str = ""
    fit_params: tuple[str, ...] = Field((), description="The factors fitted (cross-validation refits them).")
    fit_cases: tuple[str, ...] = Field((), description="The published.yaml cases they were fitted on.")


class Syncs(BaseModel):
    """Where the host thread waits for the GPU (it cannot issue further work before the GPU catches up)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    microbatch: bool = Field(
        False, description="Each microbatch's forward starts with a blocking input copy or broadcast."
    )
    p2p: bool = Field(
        False, description="Every pipeline send/receive synchronises (Megatron: synchronize after batch p2p)."
    )
    optimizer: bool = Field(
        False, description="The step reads the overflow flag / gradient norm on the host (.item())."
    )
    layer_forward: int = Field(
        0,
        ge=0,
        le=16,
        description="Synchronising calls inside every layer's forward (and recompute), between attention and "
        "MLP: e.g. a device tensor made from a host scalar (torch.tensor(0.0, device=...)).",
    )


class DdpDefaults(BaseModel):
    """How the framework reduces gradients without sharding, where the scenario does not say."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    overlap_grad_reduce: bool = Field(True, description="Buckets all-reduced during backward.")
    bucket_cap_mb: float | None = Field(
        25.0, gt=0, description="Bucket size; null = the whole gradient buffer in one all-reduce."
    )
    gradient_as_bucket_view: bool = Field(
        False,
        description="The gradients are the reduction buckets (Megatron-Core's contiguous grad buffer; PyTorch DDP's "
        "gradient_as_bucket_view=True). False: PyTorch DDP's default, whose Reducer copies every gradient into bucket "
        "storage of its own, one more gradient-sized allocation (pytorch/pytorch#41954).",
    )


class HostProfile(BaseModel):
    """The host thread of one rank: what it costs to issue work in eager mode. All zero: the GPU never waits
    for the host (the ``ideal`` profile, or a fully captured CUDA graph)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    forward_kernel_s: float = Field(
        0.0, ge=0, le=1e-3, description="Host seconds to issue one kernel in forward (and recompute)."
    )
    backward_kernel_s: float = Field(
        0.0, ge=0, le=1e-3, description="Host seconds to issue one kernel in backward (autograd)."
    )
    collective_s: float = Field(
        0.0, ge=0, le=1e-3, description="Host seconds to issue one collective (torch.distributed call)."
    )
    sync_s: float = Field(
        0.0, ge=0, le=1e-3, description="Host seconds one synchronisation costs once the GPU is idle."
    )
    microbatch_s: float = Field(
        0.0,
        ge=0,
        le=1.0,
        description="Host seconds per microbatch outside the layers (data, masks, loss bookkeeping, schedule).",
    )
    optimizer_tensor_s: float = Field(
        0.0, ge=0, le=1e-2, description="Host seconds per parameter tensor in the optimizer step."
    )
    zero3_module_forward_s: float = Field(
        0.0,
        ge=0,
        le=1e-2,
        description="DeepSpeed ZeRO-3: host seconds of the hooks around one module's forward (fetch_sub_module, "
        "release_sub_module, the coordinator's bookkeeping), recomputation included.",
    )
    zero3_module_backward_s: float = Field(
        0.0,
        ge=0,
        le=1e-2,
        description="DeepSpeed ZeRO-3: host seconds per module in backward (its hooks and its parameters' "
        "gradient hooks into the reduce bucket).",
    )
    zero3_tensor_step_s: float = Field(
        0.0,
        ge=0,
        le=1e-2,
        description="DeepSpeed ZeRO-3: extra host seconds per parameter tensor at the step.",
    )
    library_kernel_s: float = Field(
        0.0,
        ge=0,
        le=1e-3,
        description="Host seconds per kernel a library call launches from C++ in a loop (Transformer Engine's "
        "grouped GEMM: one cuBLASLt GEMM per local expert), beside the call's own per-kernel cost.",
    )
    syncs: Syncs = Field(default_factory=Syncs)
    graph_launch_s: float = Field(
        1e-5,
        ge=0,
        le=1e-3,
        description="Host seconds to launch one captured CUDA graph (training.cuda_graphs).",
    )

    @property
    def active(self) -> bool:
        return bool(self.forward_kernel_s or self.backward_kernel_s or self.microbatch_s)


class CalibratedOn(BaseModel):
    """The measured step a profile was calibrated to (``clustersim calibrate step``): a run of it is filed by how
    far it is from this one, for the error bar (validation/one_run.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    gpu: str = Field(description="The GPU of the measured run (catalogue name or its base).")
    precision: str = Field(description="Its training precision (bf16, fp8, ...).")
    gpus: int = Field(ge=1, description="Its GPU count.")


class Framework(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
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
    cuda_context_gib: float = Field(
        0.4,
        ge=0,
        le=16,
        description="GPU memory of the CUDA context and the kernels it loads, outside PyTorch's allocator: about 400 "
        "MB with CUDA's lazy module loading (CUDA 11.7+, PyTorch's default since 1.13), 636 MiB and more before it "
        "(pytorch/pytorch#86509: 274 vs 636 MiB for one small tensor; #109888).",
    )
    fitted: str = Field("", description="How the numbers were obtained: cases, command, date.")
    accuracy: str = Field(
        "",
        max_length=400,
        description="What validation says of predictions on this profile, held out first (docs/validation.md): "
        "shown under plan's table.",
    )
    fit_params: tuple[str, ...] = Field(
        (),
        description="The parameters fitted on published.yaml cases (clustersim validate --cross-validate refits them).",
    )
    fit_cases: tuple[str, ...] = Field(
        (), description="The published.yaml cases those parameters were fitted on."
    )
    calibrated_on: CalibratedOn | None = Field(
        None,
        description="The one measured step this profile was calibrated to (clustersim calibrate step): its runs "
        "carry the one-run workflow's measured error (clustersim validate --one-run) by their distance from it.",
    )
    overlap_tp_grad_allreduce: bool = Field(
        False,
        description="The column-parallel input gradient's TP all-reduce runs alongside the weight-gradient GEMM "
        "(Megatron async_tensor_model_parallel_allreduce, since early 2022).",
    )
    overlap_p2p: bool = Field(
        False,
        description="Under interleaved 1F1B, pipeline sends and receives run on their own streams beside the next "
        "step's compute (Megatron-Core --overlap-p2p-communication, on by default since core_r0.3.0).",
    )
    ddp: DdpDefaults = Field(
        default_factory=DdpDefaults, description="Gradient reduction without sharding (PyTorch DDP)."
    )
    kernels: Literal["model", "megatron-legacy", "torch"] = Field(
        "model",
        description="Which kernels run beyond the model's own (simulator/workload/framework_kernels.py): 'model' "
        "= none (fused stacks, the ideal bound); 'megatron-legacy' = Megatron-LM's eager GPT layer; 'torch' = "
        "eager PyTorch modules (MPT): autograd's bias-gradient reductions and the fused QKV's gradient concatenation.",
    )
    attention: Literal["flash", "standard"] = Field(
        "flash",
        description="The attention a model with attention: auto runs: 'flash' (one fused kernel: PyTorch SDPA, "
        "FlashAttention, cuDNN) or 'standard' (Megatron-LM's unfused QK^T, softmax, dropout, context before "
        "--use-flash-attn, 2023).",
    )
    modules: Literal["megatron", "huggingface"] = Field(
        "huggingface",
        description="How the model's layers are split into nn.Modules, which DeepSpeed ZeRO-3 fetches one by one: "
        "'megatron' = query_key_value, dense, dense_h_to_4h, dense_4h_to_h; 'huggingface' = q/k/v/o_proj and "
        "gate/up/down_proj (or fc1/fc2).",
    )
    zero: Literal["deepspeed", "megatron"] = Field(
        "deepspeed",
        description="Who shards optimizer states for zero_stage 1: DeepSpeed's ZeRO (its gradient reduction by "
        "release) or Megatron-Core's distributed optimizer (reduce-scatter of gradient buckets).",
    )
    elementwise: Literal["fused", "eager"] = Field(
        "fused",
        description="How the layer's elementwise chains run (workload/elementwise.py): 'fused' = one kernel each "
        "(Transformer Engine / Megatron-Core fused RoPE and SwiGLU, or torch.compile); 'eager' = as PyTorch model "
        "code writes them (torchtitan, Hugging Face): RoPE in fp32 complex numbers, SiLU then multiply, autograd's "
        "residual-gradient sums. training.compile fuses all but the complex RoPE.",
    )
    attention_kernel: Literal["fused", "flash-attention-2", "triton-flash"] = Field(
        "fused",
        description="The FlashAttention kernel the stack runs: 'flash-attention-2' (PyTorch SDPA's flash backend, "
        "the flash-attn package): its rate follows the shape on Hopper as measured there (costs/attention_rate.py "
        "flash_shape_factor); 'triton-flash' (MPT's Triton FlashAttention, attn_impl: triton): the same curve at "
        "half the rate (KERNEL_RATE); 'fused' (cuDNN's fused attention, Transformer Engine): one rate for every "
        "shape before Blackwell. On Blackwell, whose files state cuDNN's measured rate, the fused and the "
        "FlashAttention-2 kernels follow cuDNN's published curve (costs/attention_rate.py CUDNN_BLACKWELL).",
    )
    context_parallel: Literal["fused", "torch"] = Field(
        "fused",
        description="How ring attention (context parallelism) merges each step's output and accumulates its "
        "gradients: 'fused' = inside the attention kernels' own launches (Transformer Engine), not costed apart; "
        "'torch' = torch 2.6's _templated_ring_attention: fp32 merges, copies and gradient sums as separate eager "
        "ops (workload/attention.py cp_merge_bytes), on K / V with their heads repeated to the query heads "
        "(torchtitan's repeat_kv before SDPA).",
    )
    tensor_parallel: Literal["megatron", "dtensor"] = Field(
        "megatron",
        description="What a tensor-parallel layer with sequence parallelism keeps of the input its column-parallel "
        "linear layers all-gather: 'megatron' = the sequence-sharded input, gathered again for the weight gradient "
        "(Megatron-Core's LinearWithGradAccumulationAndAsyncCommunication); 'dtensor' = the gathered input itself, "
        "the whole sequence, which autograd saves for the linear layer (torch's ColwiseParallel behind "
        "PrepareModuleInput, torchtitan's apply_tp).",
    )
    loss: Literal["megatron", "torch", "flash-attn"] = Field(
        "megatron",
        description="How the cross-entropy loss runs: 'megatron' = vocab_parallel_cross_entropy's separate max, "
        "subtract, exp, sum and divide passes on fp32 logits; 'torch' = F.cross_entropy (log-softmax + NLL) on "
        "an fp32 copy; 'flash-attn' = flash-attn's fused cross-entropy kernel on the 16-bit logits (MPT's "
        "fused_crossentropy).",
    )
    bf16_main_grads: Literal["bf16", "fp32"] = Field(
        "bf16",
        description="The gradient buffer and data-parallel reduction of bf16 training, where the framework "
        "itself reduces: 'fp32' = Megatron-LM's main_grad (megatron/arguments.py forces "
        "accumulate_allreduce_grads_in_fp32 for bf16). DeepSpeed and PyTorch FSDP reductions follow their own rules.",
    )
    fsdp_name: str = Field(
        "fsdp2",
        description="What outputs call the stack's FSDP: fsdp2 (torch's fully_shard), fsdp1 (torch's "
        "FullyShardedDataParallel with flat parameters: llm-foundry / Composer 2023).",
    )
    fsdp_copies: bool = Field(
        False,
        description="The stack shards with FSDP2's per-parameter fully_shard, which copies each all-gathered "
        "buffer out into the unit's parameters on the compute stream (_fsdp_collectives.py "
        "foreach_all_gather_copy_out) and each unit's gradients into the reduce-scatter input "
        "(foreach_reduce_scatter_copy_in): torchtitan. False: FSDP1's flat parameter, gathered into the buffer "
        "its parameters view and reduce-scattered from the flat gradient (llm-foundry / Composer 2023).",
    )
    fsdp_reduce_in_fp32: bool = Field(
        False,
        description="FSDP's reduce dtype: True = float32, torchtitan's mixed_precision_reduce (config_manager.py "
        "@9dec370: default and only choice 'float32') and Composer's FSDP mixed_precision DEFAULT (its default; "
        "PURE reduces in bf16); False = the 16-bit parameter dtype (FSDP2's reduce_dtype=None). FSDP1 casts "
        "each flat gradient to fp32 on the reduce-scatter's stream first. In fp32 the reduce-scatter moves 4 bytes per "
        "gradient (_fsdp_collectives.py foreach_reduce allocates its input in reduce_dtype), and gradients "
        "accumulated without a reduction (every micro-batch under pipelining) are kept unsharded in fp32 "
        "(_fsdp_param.py to_accumulated_grad_if_needed). parallelism.fsdp.reduce_in_fp32 overrides it.",
    )
    optimizer_step_bytes: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="Bytes an Adam step streams per parameter where the stack's optimizer is not one fused pass "
        "(default: 30, a fused Adam reading and writing fp32 weight, momentum and variance, reading the gradient "
        "and writing the 16-bit weight). Composer's DecoupledAdamW loops over parameters with eight elementwise "
        "ops (80 bytes) and FSDP's clip_grad_norm_ reads every gradient and scales it (12).",
    )
    checkpoint_early_stop: bool = Field(
        False,
        description="Activation checkpointing is torch's non-reentrant checkpoint (torch.utils.checkpoint, "
        "use_reentrant=False; FSDP's checkpoint_wrapper NO_REENTRANT), whose recomputation stops once every "
        "tensor the backward needs is recomputed (early_stop, default since torch 2.1): a layer's last linear "
        "layer saves its input before it multiplies, so its GEMM and what follows are not re-run. False: "
        "Megatron's and DeepSpeed's reentrant CheckpointFunction re-runs the whole forward.",
    )
    grad_accumulation_kernels: bool = Field(
        False,
        description="Each backward adds every parameter's gradient into a separate buffer with its own kernel "
        "(Megatron-LM's local DDP main_grad hooks without gradient-accumulation fusion).",
    )
    host: HostProfile = Field(
        default_factory=HostProfile, description="How the host thread issues work (eager mode)."
    )
    gpus: dict[str, GpuFactors] = Field(
        default_factory=dict,
        description="Per-GPU factors replacing those above, by architecture (hopper) or catalogue name (the name's "
        "over the architecture's).",
    )

    @property
    def fitted_on(self) -> frozenset[str]:
        """Every case its factors were fitted on: its own ``fit_cases`` and its per-GPU ones."""
        return frozenset(self.fit_cases).union(*(f.fit_cases for f in self.gpus.values()))

    def on_gpu(self, gpu: str, architecture: str | None = None) -> Framework:
        """The profile as it applies on ``gpu``: its architecture's factors (a ``gpus`` key such as ``hopper``),
        then the GPU's own (a catalogue name) over them. ``architecture``: the GPU's generation where the caller
        has the GPU (a GPU file of one's own has a name the catalogue does not know)."""
        entries = [self.gpus[gpu]] if gpu in self.gpus else []
        if architecture is not None:
            entries = ([self.gpus[architecture]] if architecture in self.gpus else []) + entries
        elif any(key in get_args(Architecture) for key in self.gpus):
            from simulator.errors import ScenarioError
            from simulator.hardware.gpus import get_gpu

            try:
                arch = get_gpu(gpu).architecture
            except ScenarioError:  # not a GPU the catalogue or a file names (a test's stand-in)
                arch = None
            entries = ([self.gpus[arch]] if arch in self.gpus else []) + entries
        if not entries:
            return self
        update: dict = {}
        for factors in entries:
            update.update({k: v for k, v in factors.model_dump(exclude={"fitted"}).items() if v is not None})
        return self.model_copy(update=update)


AUTO = "auto"


def default_framework(scenario, architecture: str) -> str:
    """The realistic profile for a scenario that names none: its stack and the GPU's era. Megatron (tensor,
    pipeline or context parallelism): Megatron-Core with Transformer Engine on Hopper, Megatron-LM's eager layer
    before; otherwise (PyTorch FSDP2, DDP, DeepSpeed ZeRO) eager PyTorch with torchtitan's FSDP2. llm-foundry-2023
    is MPT's own 2023 code (FSDP1, Triton attention, a fused loss): named, never picked. ``architecture``: the
    GPU's generation (a GPU file of one's own has a name the catalogue does not know)."""
    p = scenario.parallelism
    if p.tensor_parallel > 1 or p.pipeline_parallel > 1 or p.context_parallel > 1:
        return megatron_profile(architecture)
    return "pytorch-2024"


def megatron_profile(architecture: str) -> str:
    """Megatron's profile on a GPU generation: Megatron-Core with Transformer Engine on Hopper and later,
    Megatron-LM's eager layer before."""
    return (
        "megatron-core-2024" if architecture in ("hopper", "blackwell", "cdna3", "cdna4") else "megatron-2022"
    )


@cache
def get_framework(name: str) -> Framework:
    """A shipped profile by name (``megatron-2022``) or a profile file by path (``fitted/my-profile.yaml``, as
    ``clustersim calibrate profile --write`` writes)."""
    return load_named(name, PROFILE_DIR, "framework", "framework", Framework)
