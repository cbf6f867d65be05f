"""``parallelism:``: the parallel degrees and schedule, and each framework's knobs in its own names: DeepSpeed
ZeRO (with offload and ZeRO++), PyTorch FSDP2, DDP / Megatron's gradient reduction."""

from __future__ import annotations

import sys
from typing import Literal

from pydantic import Field, PositiveInt, field_validator, model_validator

from simulator.scenario.section import Section


class OffloadOptimizerConfig(Section):
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


class OffloadParamConfig(Section):
    """DeepSpeed ``offload_param`` (ZeRO-3 only): the parameter shards live in host memory or on NVMe and are
    fetched before every all-gather."""

    device: Literal["none", "cpu", "nvme"] = "none"
    pin_memory: bool = False
    buffer_count: PositiveInt = Field(5, description="NVMe: prefetch buffers.")
    buffer_size: float = Field(1e8, gt=0, description="NVMe: elements per prefetch buffer.")
    max_in_cpu: float = Field(1e9, ge=0, description="NVMe: parameter elements also kept in host memory.")


class AioConfig(Section):
    """DeepSpeed ``aio`` (libaio) settings for NVMe offload. Each rank keeps ``thread_count`` x ``queue_depth``
    requests of ``block_size`` bytes in flight."""

    block_size: PositiveInt = 1048576
    queue_depth: PositiveInt = 8
    thread_count: PositiveInt = 1


# two model chunks a rank (strategy/schedules/dualpipe.py), with their names as DeepSeek writes them
DUAL_SCHEDULES = {"dualpipe": "DualPipe", "dualpipev": "DualPipeV"}
# Megatron-Core's flex dispatcher's backends (token_dispatcher.py MoEFlexTokenDispatcher): DeepEP's traffic both
FLEX_DISPATCHERS = ("deepep", "hybridep")


def path_stages(schedule: str, pp: int, v: int) -> int:
    """Model stages along one micro-batch's way through the pipeline: PP x v for Megatron's schedules, PP for
    DualPipe (two paths of PP stages), 2 PP for DualPipeV (one path in a V)."""
    return {"dualpipe": pp, "dualpipev": 2 * pp}.get(schedule, pp * v)


DEEPSPEED_VERSION = "0.16.4"  # the behaviour simulated when a scenario does not say (the newest release read)


class ZeroConfig(Section):
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
    offload_optimizer: OffloadOptimizerConfig = Field(default_factory=OffloadOptimizerConfig)
    offload_param: OffloadParamConfig = Field(default_factory=OffloadParamConfig)
    aio: AioConfig = Field(default_factory=AioConfig)


class FsdpConfig(Section):
    """PyTorch FSDP2 ``fully_shard`` per transformer block; hybrid_shard_size makes it HSDP."""

    reshard_after_forward: bool = True
    hybrid_shard_size: PositiveInt | None = Field(
        None, description="Shard within groups of this many ranks and replicate across them (HSDP)."
    )
    backward_prefetch: bool = True
    reduce_in_fp32: bool | None = Field(
        None,
        description="Reduce gradients in fp32 (MixedPrecisionPolicy(reduce_dtype=torch.float32)): the "
        "reduce-scatter moves 4 bytes per gradient, and under pipelining the accumulated gradients are kept "
        "unsharded in fp32. Default: the framework's (pytorch-2024: yes, torchtitan's mixed_precision_reduce).",
    )


class DdpConfig(Section):
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
    gradient_as_bucket_view: bool | None = Field(
        None,
        description="The gradients are views into the reduction buckets (PyTorch DDP's gradient_as_bucket_view=True; "
        "Megatron-Core's grad buffer always). False: PyTorch DDP's default, the buckets a second copy of the gradients "
        "in memory. Default: the framework's.",
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


class MoeParallelConfig(Section):
    """How a framework runs the MoE layers (Megatron-Core's ``--moe-*`` options; docs/moe.md)."""

    dispatcher: Literal["alltoall", "allgather", "deepep", "hybridep", "deepspeed"] = Field(
        "alltoall",
        description="Token dispatcher: all-to-all over the expert-parallel group (Megatron-Core's recommended choice "
        "with EP), all-gather of every token over ETP x EP (its default type), DeepEP (the flex dispatcher: each "
        "token sent once per destination rank, across nodes once per node over RDMA and forwarded over NVLink), "
        "HybridEP (the flex dispatcher's NVIDIA backend: DeepEP's traffic, the routing map taken as it is, the "
        "permutation in its own kernels, no host wait where the received counts are known: drop-and-pad), or "
        "DeepSpeed-MoE's (dense [tokens, experts, capacity] einsums around a capacity-padded all-to-all).",
    )
    grouped_gemm: bool = Field(
        True, description="The local experts' GEMMs as one grouped GEMM (--moe-grouped-gemm); false = a loop."
    )
    shared_expert_overlap: bool = Field(
        False,
        description="The shared expert on a side stream, beside the dispatch (--moe-shared-expert-overlap).",
    )
    overlap_a2a: bool = Field(
        False,
        description="Each micro-batch's dispatch and combine all-to-alls hidden behind another micro-batch's compute "
        "(Megatron-Core 0.14 --overlap-moe-expert-parallel-comm: combined 1F1B).",
    )
    router_fusion: bool = Field(
        False,
        description="The router's top-k and scores, the aux-loss scores and the aux loss as Transformer Engine fused "
        "kernels (Megatron-Core --moe-router-fusion, core_v0.14.0+, off by default); false: unfused PyTorch ops.",
    )
    fp8_dispatch: bool = Field(
        False,
        description="DeepEP dispatcher with precision fp8: tokens (forward) and the combine's output gradients "
        "(backward) cross in FP8 with a 4-byte scale per 128 elements, the combine and its gradient in BF16, as "
        "DeepSeek-V3 trained (its report Sec. 3.3.2; deepseek-ai/DeepEP README: FP8 dispatch, BF16 combine).",
    )
    dispatcher_sms: PositiveInt | None = Field(
        None,
        le=1024,
        description="SMs the DeepEP dispatcher's kernels hold while they run (Megatron-Core "
        "--moe-flex-dispatcher-num-sms; default DeepEP's Buffer.num_sms, 20): with overlap_a2a the compute-bound "
        "kernels beside its dispatch and combine run on the other SMs (cluster.nccl_sm_contention).",
    )
    fused_multihot: bool = Field(
        False,
        description="DeepEP dispatcher: the indices-to-multihot step as one Triton kernel (Megatron-Core "
        "--enable-experimental with --moe-permute-fusion); false (the default): boolean-mask indexing with three "
        "host synchronisations in forward and one in backward.",
    )

    fused_grouped_mlp: bool = Field(
        False,
        description="The routed experts on Transformer Engine's fused grouped MLP (Megatron-Core "
        "--use-transformer-engine-op-fuser with NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 and --moe-mlp-glu-interleave-size 32; "
        "Megatron-Bridge cutedsl_fused_grouped_mlp): fc1's grouped GEMM applies the GLU, the routing probability and "
        "the MXFP8 / NVFP4 quantization in its epilogue, fc2's dgrad the activation's gradient in its own "
        "(workload/fused_grouped_mlp.py). Blackwell, MXFP8 or NVFP4, a gated activation, expert_tensor_parallel 1.",
    )

    @model_validator(mode="after")
    def _dispatcher_sms(self) -> MoeParallelConfig:
        if self.dispatcher_sms is not None and self.dispatcher not in FLEX_DISPATCHERS:
            raise ValueError(
                "parallelism.moe.dispatcher_sms is the flex dispatcher's SM count: it needs dispatcher: deepep or "
                f"hybridep (got {self.dispatcher}; NCCL's collectives hold memory.nccl_channels SMs)"
            )
        return self


def _layout_stages(data: dict) -> dict:
    """Megatron infers the virtual stages from a layout (pipeline_parallel_layer_layout.py: ``len(layout) //
    pipeline_model_parallel_size``); a layout that does not parse or divide is left to the scenario's check."""
    from simulator.scenario.pipeline_layout import parse

    pp = data.get("pipeline_parallel", 1)
    if "virtual_pipeline_stages" in data or data.get("pipeline_schedule") in DUAL_SCHEDULES:
        return data
    try:
        n = len(parse(data["pipeline_layout"]))
    except ValueError:
        return data
    if isinstance(pp, int) and pp > 0 and n % pp == 0 and n // pp > 1:
        return {**data, "virtual_pipeline_stages": n // pp}
    return data


class ParallelismConfig(Section):
    tensor_parallel: PositiveInt = 1
    pipeline_parallel: PositiveInt = 1
    context_parallel: PositiveInt = 1
    data_parallel: PositiveInt | None = Field(
        None, description="Default: GPUs / (tensor x pipeline x context)."
    )
    sequence_parallel: bool = False
    tp_comm_overlap: bool | Literal["te", "async"] = Field(
        False,
        description="Tensor-parallel communication beside the GEMMs: true or 'te' = Megatron-Core --tp-comm-overlap "
        "(Transformer Engine userbuffers: each all-gather / reduce-scatter hidden behind the GEMM it feeds or "
        "follows); 'async' = PyTorch async TP (torchtitan enable_async_tensor_parallel, torch._micro_pipeline_tp: "
        "each GEMM split into TP chunks, a chunk's copy to or from a peer behind the next chunk's GEMM, "
        "workload/async_tp.py).",
    )

    overlap_p2p_comm: bool | None = Field(
        None,
        description="Interleaved 1F1B: pipeline sends / receives beside the next step's compute (Megatron-Core "
        "--overlap-p2p-communication). Default: the framework profile's.",
    )
    pipeline_schedule: Literal[
        "gpipe", "1f1b", "interleaved-1f1b", "pipedream-2bw", "zb-h1", "deepspeed", "dualpipe", "dualpipev"
    ] = Field(
        "1f1b",
        description="Megatron's schedules; 'deepspeed': DeepSpeed's PipelineEngine running TrainSchedule "
        "(lock-step stages, blocking send/recv between steps), as Megatron-DeepSpeed with --deepspeed runs; "
        "'dualpipe' / 'dualpipev': DeepSeek's bidirectional and V-shaped schedules (deepseek-ai/DualPipe), two "
        "model chunks a rank, a forward beside another micro-batch's backward.",
    )
    virtual_pipeline_stages: PositiveInt = 1
    zero_stage: Literal[0, 1, 2, 3] = 0
    zero: ZeroConfig = Field(default_factory=ZeroConfig)
    fsdp: FsdpConfig | None = None
    ddp: DdpConfig = Field(default_factory=DdpConfig)
    collective_algorithm: Literal["auto", "ring", "tree", "hierarchical", "nvls"] = "auto"
    rank_order: str = Field(
        "tp-cp-dp-pp",
        pattern=r"^(tp|cp|dp|pp)-(tp|cp|dp|pp)-(tp|cp|dp|pp)-(tp|cp|dp|pp)$",
        description="Parallel axes, innermost (adjacent GPUs) first, as Megatron-Core's order.",
    )
    pipeline_layout: str | None = Field(
        None,
        max_length=4096,
        description="What each virtual stage holds, as Megatron-Core's --pipeline-model-parallel-layout: "
        "'Et*3|(tt|)*29,m|L' (E embedding, t transformer layer, m multi-token prediction layer, L loss, | between "
        "stages in Megatron's order, virtual stage v of rank r at v x PP + r; DualPipe's along a micro-batch's "
        "path). Sets virtual_pipeline_stages to its stages / pipeline_parallel.",
    )
    first_pipeline_stage_layers: PositiveInt | None = Field(
        None, description="Layers on the first stage (Megatron --decoder-first-pipeline-num-layers)."
    )
    last_pipeline_stage_layers: PositiveInt | None = Field(
        None, description="Layers on the last stage (Megatron --decoder-last-pipeline-num-layers)."
    )
    expert_parallel: PositiveInt = Field(
        1, le=2**14, description="Ranks the routed experts of an MoE layer are split over (EP)."
    )
    expert_tensor_parallel: PositiveInt | None = Field(
        None,
        le=1024,
        description="Ranks each expert's MLP is split over (ETP). Default: tensor_parallel (Megatron-Core).",
    )
    moe: MoeParallelConfig = Field(default_factory=MoeParallelConfig)

    @model_validator(mode="before")
    @classmethod
    def _interleaved_when_virtual(cls, data):
        """Virtual stages without a schedule run interleaved 1F1B, as Megatron infers it: its
        get_forward_backward_func picks the interleaved schedule whenever virtual_pipeline_model_parallel_size is set
        (megatron/core/pipeline_parallel/schedules.py, core_v0.13.0). A schedule named beside them is kept (and
        checked)."""
        if isinstance(data, dict) and isinstance(data.get("pipeline_layout"), str):
            data = _layout_stages(data)
        if isinstance(data, dict) and data.get("pipeline_schedule") in DUAL_SCHEDULES:
            # DualPipe and DualPipeV hold two model chunks a rank (deepseek-ai/DualPipe: modules[0], modules[1])
            return {"virtual_pipeline_stages": 2, **data}
        if isinstance(data, dict) and "pipeline_schedule" not in data:
            v = data.get("virtual_pipeline_stages")
            if isinstance(v, int) and not isinstance(v, bool) and v > 1:
                return {**data, "pipeline_schedule": "interleaved-1f1b"}
        return data

    @field_validator("tp_comm_overlap", mode="before")
    @classmethod
    def _tp_comm_overlap(cls, value):
        """One line for a value that is none of them (the union would say why for each member)."""
        if isinstance(value, bool) or value in ("te", "async"):
            return value
        raise ValueError(f"must be true, false, te or async (got {value!r})")

    @property
    def path_stages(self) -> int:
        """Model stages along one micro-batch's way through the pipeline (``path_stages``)."""
        return path_stages(self.pipeline_schedule, self.pipeline_parallel, self.virtual_pipeline_stages)

    @property
    def layout_stages(self):
        """``pipeline_layout`` parsed: one ``pipeline_layout.Stage`` per virtual stage (None without one)."""
        from simulator.scenario.pipeline_layout import parse

        return None if self.pipeline_layout is None else parse(self.pipeline_layout)

    @property
    def etp(self) -> int:
        return self.expert_tensor_parallel or self.tensor_parallel
