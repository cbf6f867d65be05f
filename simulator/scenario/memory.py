"""``memory:``: GPU memory outside what the model's tensors take (docs/memory.md)."""

from __future__ import annotations

from pydantic import Field, PositiveInt

from simulator.scenario.section import Section


class MemoryConfig(Section):
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
        description="NCCL channels per communicator: each holds 9.19 MiB of protocol buffers and, while a collective "
        "runs, one SM (cluster.nccl_sm_contention) (NCCL_DEBUG=INFO prints 'Channel xx/NN'; NCCL_MIN_NCHANNELS / "
        "NCCL_MAX_NCHANNELS bound it).",
    )
    allocator_fragmentation: float = Field(
        0.0,
        ge=0,
        le=1,
        description="What PyTorch's caching allocator reserves beyond its peak allocation, as a fraction of it "
        "(torch.cuda.max_memory_reserved / max_memory_allocated - 1 of your runs).",
    )
