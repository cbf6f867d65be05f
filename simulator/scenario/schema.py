"""The scenario: what the user asked for, validated once.

Four sections, as in Calculon's model / system / execution split and in the vocabulary of Megatron-LM and
DeepSpeed: ``model``, ``cluster``, ``training``, ``parallelism``. Checks that need only the scenario itself live
here (divisibility, batch arithmetic); checks that need the topology file (GPU count) live in ``loader.py``.
Every message names the field and shows the arithmetic.
"""

from __future__ import annotations

import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationInfo, model_validator

from simulator.scenario.presets import expand_model_section


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# What one simulation can hold: every GPU of the cluster is placed and every micro-batch of the iteration is
# simulated (loader.py checks the products). 131,072 H100 simulate in about 13 s (benchmarks/bench_scale.py).
MAX_GPUS = 2**17
MAX_MICROBATCHES = 2**16  # per iteration and data-parallel rank (gradient accumulation steps)
MAX_STAGE_MICROBATCHES = 2**20  # micro-batches x pipeline stages x virtual stages: about 15 s


class ModelConfig(_Section):
    """A decoder-only transformer, in Megatron-LM's argument names."""

    name: str = Field("custom", description="Preset name or a label for reports.")
    num_layers: PositiveInt = Field(le=4096)
    hidden_size: PositiveInt = Field(le=2**18)
    num_attention_heads: PositiveInt = Field(le=2**12)
    num_query_groups: PositiveInt | None = Field(
        None, description="Key/value heads (grouped-query attention). Default: num_attention_heads."
    )
    ffn_hidden_size: PositiveInt | None = Field(
        None,
        le=2**20,
        description="MLP width. Default: 4 x hidden_size (gelu), 8/3 x hidden_size rounded up to 64 (swiglu).",
    )
    activation: Literal["gelu", "swiglu", "relu", "squared-relu"] = "gelu"
    seq_length: PositiveInt = Field(le=2**24)
    vocab_size: PositiveInt = Field(le=2**22)
    tied_embeddings: bool = Field(
        True, description="Share input embedding and output layer (Megatron default)."
    )
    attention: Literal["auto", "standard", "flash"] = Field(
        "auto",
        description="standard = unfused QK^T, softmax, dropout, context; flash = one fused kernel; auto = what the "
        "framework profile runs by default (FlashAttention in PyTorch SDPA, llm-foundry and Megatron-Core; the "
        "unfused layer in Megatron-LM before 2023); standard on GPUs without FlashAttention (V100).",
    )
    position_embedding: Literal["learned", "rope", "alibi"] = "learned"
    normalization: Literal["layernorm", "rmsnorm"] = "layernorm"
    add_bias_linear: bool = True

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data, info: ValidationInfo):
        return expand_model_section(data, (info.context or {}).get("base_dir"))

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        a, g = self.num_attention_heads, self.query_groups
        if self.hidden_size % a:
            raise ValueError(
                f"model.hidden_size ({self.hidden_size}) is not divisible by num_attention_heads ({a})"
            )
        if a % g:
            raise ValueError(f"model.num_attention_heads ({a}) is not divisible by num_query_groups ({g})")
        return self

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        if self.ffn_hidden_size:
            return self.ffn_hidden_size
        if self.activation == "swiglu":  # Llama convention: 2/3 of 4h, rounded up to a multiple of 64
            return -(-int(8 * self.hidden_size / 3) // 64) * 64
        return 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class ClusterConfig(_Section):
    """Which topology file, how many nodes, and what-if overrides of its hardware."""

    topology: str = Field(..., description="Name of a file in topologies/ (without .yaml) or a path to one.")
    num_nodes: PositiveInt = Field(1, le=MAX_GPUS)
    gpus_per_node: PositiveInt | None = Field(None, description="Use only this many GPUs of each node.")
    gpu: str | None = Field(None, description="Replace the topology's GPU with another from the catalogue.")
    nics_per_node: PositiveInt | None = Field(None, le=64)
    nic_bandwidth_gbps: float | None = Field(None, gt=0, le=1e5, description="Per NIC, gigabits per second.")
    oversubscription: float | None = Field(
        None, ge=1, le=1000, description="Leaf-to-spine oversubscription ratio."
    )
    pcie_bandwidth_GBps: float | None = Field(
        None, gt=0, le=1e5, description="Per PCIe link, per direction, GB/s."
    )
    nvme_drives: int | None = Field(None, ge=0, le=64, description="NVMe drives per node (striped).")
    nvme_bandwidth_GBps: float | None = Field(None, gt=0, le=1e5, description="Per NVMe drive, GB/s.")
    cpu_optimizer_params_per_s: float | None = Field(
        None, gt=0, le=1e13, description="CPU-Adam throughput of one host, parameters per second."
    )
    gpu_speed_sd: float | None = Field(
        None,
        ge=0,
        le=0.5,
        description="Spread of sustained speed across the GPUs (standard deviation, fraction of the typical GPU's): "
        "compute-bound kernels run at the slowest GPU's speed. Default: the GPU profile's (0.015); 0 turns it off.",
    )


class OneBitConfig(_Section):
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


class TrainingConfig(_Section):
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


class OffloadOptimizerConfig(_Section):
    """DeepSpeed ``offload_optimizer``: optimizer states (and the step) on the host CPU, states in host memory
    (``cpu``) or on NVMe (``nvme``, ZeRO-Infinity)."""

    device: Literal["none", "cpu", "nvme"] = "none"
    pin_memory: bool = Field(False, description="Page-locked host buffers (unpinned copies are staged).")
    buffer_count: PositiveInt = Field(
        4, description="NVMe: swap buffers (Adam swaps 4 tensors per parameter)."
    )
    buffer_size: float = Field(1e8, gt=0, description="NVMe: elements per swap buffer.")
    pipeline_read: bool = Field(False, description="NVMe: read the next tile while the CPU steps this one.")
    pipeline_write: bool = Field(False, description="NVMe: write the previous tile while the CPU steps.")
    delayed_param_update: bool = Field(
        False,
        description="ZeRO-Offload DPU (Ren et al. 2021 Sec. 4.2): the CPU step and parameter upload of one "
        "iteration overlap the next iteration's forward and backward (parameters one step stale).",
    )


class OffloadParamConfig(_Section):
    """DeepSpeed ``offload_param`` (ZeRO-3 only): the parameter shards live in host memory or on NVMe and are
    fetched before every all-gather."""

    device: Literal["none", "cpu", "nvme"] = "none"
    pin_memory: bool = False
    buffer_count: PositiveInt = Field(5, description="NVMe: prefetch buffers.")
    buffer_size: float = Field(1e8, gt=0, description="NVMe: elements per prefetch buffer.")
    max_in_cpu: float = Field(1e9, ge=0, description="NVMe: parameter elements also kept in host memory.")


class AioConfig(_Section):
    """DeepSpeed ``aio`` (libaio) settings for NVMe offload. Each rank keeps ``thread_count`` x ``queue_depth``
    requests of ``block_size`` bytes in flight."""

    block_size: PositiveInt = 1048576
    queue_depth: PositiveInt = 8
    thread_count: PositiveInt = 1


DEEPSPEED_VERSION = "0.16.4"  # the behaviour simulated when a scenario does not say (the newest release read)


class ZeroConfig(_Section):
    """DeepSpeed ``zero_optimization`` knobs, DeepSpeed's names and defaults (elements, not bytes)."""

    deepspeed_version: str = Field(
        DEEPSPEED_VERSION,
        pattern=r"^\d+\.\d+(\.\d+)?$",
        description="The DeepSpeed release whose behaviour is simulated where releases differ (ZeRO-1/2 "
        "gradient reduction changed in 0.12.4). Not part of a DeepSpeed JSON config.",
    )
    reduce_scatter: bool = Field(
        True, description="ZeRO-1/2: reduce each rank's gradient slice; false = all-reduce every gradient."
    )
    use_multi_rank_bucket_allreduce: bool | None = Field(
        None,
        description="ZeRO-1/2 with reduce_scatter: all-reduce each gradient bucket and keep the rank's slice "
        "(DeepSpeed >= 0.12.4, where it is the default) instead of one reduce per owning rank. Default: by "
        "deepspeed_version.",
    )
    grad_accum_dtype: Literal["fp32", "fp16", "bf16"] | None = Field(
        None,
        description="DeepSpeed's data_types.grad_accum_dtype. With bf16 it picks the optimizer wrapper: fp32 "
        "(the default without ZeRO) runs BF16_Optimizer, which accumulates and all-reduces gradients in fp32. "
        "Default: as DeepSpeed (fp32 for bf16 without ZeRO, else the training precision).",
    )
    reduce_bucket_size: float = Field(5e8, gt=0)
    allgather_bucket_size: float = Field(5e8, gt=0)
    contiguous_gradients: bool = Field(
        True, description="Copy gradients into a flat bucket of reduce_bucket_size elements (GPU memory)."
    )
    sub_group_size: float = Field(
        1e9, gt=0, description="ZeRO-3: the optimizer steps this many elements of the partition at a time."
    )
    overlap_comm: bool | None = Field(
        None, description="Default: False for stage 1-2, True for stage 3 (DeepSpeed)."
    )
    stage3_prefetch_bucket_size: float = Field(5e7, ge=0)
    stage3_max_live_parameters: float = Field(1e9, gt=0)
    stage3_param_persistence_threshold: float = Field(
        1e5,
        ge=0,
        description="Parameters of at most this many elements stay whole on every rank (never fetched).",
    )
    stage3_model_persistence_threshold: float = Field(
        float(sys.maxsize),
        ge=0,
        description="Cap on the elements of all persistent parameters together (DeepSpeed's default: sys.maxsize).",
    )
    zero_quantized_weights: bool = Field(
        False, description="ZeRO++ qwZ: forward all-gathers in block-quantized INT8."
    )
    zero_hpz_partition_size: PositiveInt = Field(
        1,
        description="ZeRO++ hpZ: secondary weight shard in groups of this many ranks (usually GPUs per node).",
    )
    zero_quantized_gradients: bool = Field(
        False,
        description="ZeRO++ qgZ: gradient reduce-scatter as INT4 all-to-all, intra-node then inter-node.",
    )
    stage3_max_reuse_distance: float = Field(
        1e9, ge=0, description="Parameters reused within this many fetched parameters are not released."
    )
    offload_optimizer: OffloadOptimizerConfig = OffloadOptimizerConfig()
    offload_param: OffloadParamConfig = OffloadParamConfig()
    aio: AioConfig = AioConfig()


class FsdpConfig(_Section):
    """PyTorch FSDP2 ``fully_shard`` per transformer block; hybrid_shard_size makes it HSDP."""

    reshard_after_forward: bool = True
    hybrid_shard_size: PositiveInt | None = Field(
        None, description="Shard within groups of this many ranks and replicate across them (HSDP)."
    )
    backward_prefetch: bool = True


class DdpConfig(_Section):
    """Data-parallel gradient reduction without sharding (PyTorch DDP, Megatron's DDP, ZeRO stage 0). Unset
    knobs take the framework's behaviour (``simulator/frameworks/*.yaml``, ``ddp:``)."""

    bucket_cap_mb: float | None = Field(
        None, gt=0, description="Gradient bucket size. Default: the framework's (PyTorch DDP: 25 MB)."
    )
    overlap_grad_reduce: bool | None = Field(
        None,
        description="Reduce buckets during backward. Default: the framework's (PyTorch DDP: yes; Megatron-LM's "
        "local DDP before Megatron-Core: one all-reduce after backward).",
    )
    overlap_param_gather: bool = Field(
        False,
        description="Megatron-Core: all-gather the distributed optimizer's weights under the next forward.",
    )
    grad_reduce_in_fp32: bool | None = Field(
        None,
        description="bf16 under Megatron's DDP: keep and reduce gradients in fp32 (Megatron-LM's default for bf16, "
        "--accumulate-allreduce-grads-in-fp32; false = --grad-reduce-in-bf16). Default: the framework's.",
    )


class ParallelismConfig(_Section):
    tensor_parallel: PositiveInt = 1
    pipeline_parallel: PositiveInt = 1
    context_parallel: PositiveInt = 1
    data_parallel: PositiveInt | None = Field(
        None, description="Default: GPUs / (tensor x pipeline x context)."
    )
    sequence_parallel: bool = False
    tp_comm_overlap: bool = Field(
        False,
        description="Megatron-Core --tp-comm-overlap: TP all-gathers / reduce-scatters run alongside GEMMs.",
    )
    pipeline_schedule: Literal["gpipe", "1f1b", "interleaved-1f1b", "pipedream-2bw", "zb-h1", "deepspeed"] = (
        Field(
            "1f1b",
            description="Megatron's schedules, or 'deepspeed': DeepSpeed's PipelineEngine running TrainSchedule "
            "(lock-step stages, blocking send/recv between steps), as Megatron-DeepSpeed with --deepspeed runs.",
        )
    )
    virtual_pipeline_stages: PositiveInt = 1
    zero_stage: Literal[0, 1, 2, 3] = 0
    zero: ZeroConfig = ZeroConfig()
    fsdp: FsdpConfig | None = None
    ddp: DdpConfig = DdpConfig()
    collective_algorithm: Literal["auto", "ring", "tree", "hierarchical"] = "auto"
    rank_order: str = Field(
        "tp-cp-dp-pp",
        pattern=r"^(tp|cp|dp|pp)-(tp|cp|dp|pp)-(tp|cp|dp|pp)-(tp|cp|dp|pp)$",
        description="Parallel axes, innermost (adjacent GPUs) first, as Megatron-Core's order.",
    )
    first_pipeline_stage_layers: PositiveInt | None = Field(
        None, description="Layers on the first stage (Megatron --decoder-first-pipeline-num-layers)."
    )
    last_pipeline_stage_layers: PositiveInt | None = Field(
        None, description="Layers on the last stage (Megatron --decoder-last-pipeline-num-layers)."
    )


class MemoryConfig(_Section):
    """GPU memory outside what the model's tensors take (docs/memory.md): counted in each GPU's device total,
    which must fit; the peak allocation (``torch.cuda.max_memory_allocated``) leaves them out."""

    cuda_context_gib: float | None = Field(
        None,
        ge=0,
        le=16,
        description="CUDA context, driver state and loaded kernels per GPU. Default: the framework profile's (0.4 "
        "GiB with CUDA's lazy module loading, PyTorch 1.13 and later; 0.62 before it).",
    )
    nccl_channels: PositiveInt = Field(
        16,
        le=64,
        description="NCCL channels per communicator: each holds 9.19 MiB of protocol buffers (NCCL_DEBUG=INFO prints "
        "'Channel xx/NN'; NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS bound it).",
    )
    allocator_fragmentation: float = Field(
        0.0,
        ge=0,
        le=1,
        description="What PyTorch's caching allocator reserves beyond its peak allocation, as a fraction of it "
        "(torch.cuda.max_memory_reserved / max_memory_allocated - 1 of your runs).",
    )


class Scenario(_Section):
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
