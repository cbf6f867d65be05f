"""FlashAttention's and cuDNN's fused attention's rate by shape, head dimension and direction, relative to the
rate the GPU files state (``flash_attention_efficiency``, ``flash_attention_backward``, ``flash_attention_fp8``)
at their reference shape: pure functions of the shape, each fitted on the measurements its comment names."""

from __future__ import annotations

import numpy as np

from simulator.hardware.gpus import GPU
from simulator.scenario.model import windowed_keys

# FlashAttention's rate by shape, relative to the shape the GPU files' flash_attention_efficiency describes (16k
# tokens, 16 heads of 128, causal: Dao 2023 Fig. 4 on A100, Shah et al. 2024 Fig. 5 on H100). A thread block takes
# 128 queries of one (sample, head) and walks the key blocks they see (FlashAttention-2 Algorithm 1; the backward
# walks the query blocks of each key block): its fixed work (loading its block, the final rescale and write) is
# worth FLASH_OVERHEAD key blocks of the walk, and a grid of few blocks leaves SMs idle behind the longest causal
# rows (FLASH_FILL thread blocks per SM give half the rate). Fitted on torch's FlashAttention-2 measured on one
# H100 80GB (benchmarks/flash_shapes.py, docs/measurements/flash_shapes_h100.json, 2026-11-26: 19 causal shapes
# of head dim 128 each way, 512-16k tokens, 16-512 sample-heads; rms 4.4% forward, 2.2% backward).
FLASH_BLOCK = 128
FLASH_OVERHEAD = {"forward": 1.91, "backward": 4.47}
FLASH_FILL = {"forward": 272 / 132, "backward": 139 / 132}
FLASH_REFERENCE = (16384, 16384, 16)  # queries, keys, sample-heads
FLASH_BACKWARD = 0.935  # the backward's rate at the reference shape relative to the forward's (the same fit)


# the architectures the shape factor was measured on; others keep one rate for every shape
FLASH_SHAPED = ("hopper",)

# cuDNN's fused attention on Blackwell (Transformer Engine's backend there, and the rate the Blackwell GPU files
# state at 2 x 16k causal tokens of 64 heads: 128 sample-heads) follows the same form: a thread block's fixed work
# worth ``overhead`` key blocks of its walk, ``fill`` blocks per SM for half the rate. Fitted on cuDNN 9.22's
# published GB200 rows (NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training @3929da2, MIT: Llama 3.1, DeepSeek-V3
# and Kimi K2.6 shapes, 2k-32k tokens, causal and full, head dims 128, 192 and 256; 35 forward and 30 backward rows,
# docs/measurements/cudnn-sdpa-blackwell.json): rms 5.0% forward, 6.5% backward, where one rate for every shape was
# 18% / 23% off (2k causal tokens run at 0.64 of the 16k rate). Held out: the same rows on GB300, rms 7.0% / 5.5%
# (15% / 25% with one rate); cuDNN 9.13.1's B200 rows (0b1577c8) fall faster below 4k tokens (tests/
# test_blackwell_kernels.py). Backward at head dim 192 (MLA's queries and keys) runs at 0.826 of 128's rate (20 rows);
# the forward keeps its rate at 192 and 256.
CUDNN_BLACKWELL = {"overhead": {"forward": 5.3, "backward": 3.0}, "fill": {"forward": 0.1, "backward": 0.2}}
CUDNN_REFERENCE = (16384, 16384, 128)  # queries, keys, sample-heads of the Blackwell files' measured rate
CUDNN_WIDE_BACKWARD = (192, 0.826)  # head dim, backward rate relative to 128's (linear between, kept above)
# the profiles' kernels the Blackwell files price at cuDNN's measured rate, and so on its curve: the fused attention,
# and a FlashAttention-2 stack's (no Blackwell measurement of FlashAttention-2 itself is used)
CUDNN_KERNELS = ("fused", "flash-attention-2")


def _cudnn_curve(gpu: GPU, kernel: str) -> bool:
    """Does ``kernel`` follow cuDNN's measured Blackwell curve on ``gpu`` (CUDNN_KERNELS on Blackwell)?"""
    return gpu.architecture == "blackwell" and kernel in CUDNN_KERNELS


def _causal_walk(k):
    """Key blocks a block of queries walks over ``k`` causal keys, on average (half of them, and the diagonal)."""
    return k / (2 * FLASH_BLOCK) + 0.5


def _grid_share(q, bh, fill: float):
    """The share of the grid (``bh`` sample-heads x blocks of ``q`` queries) the SMs run at once."""
    blocks = bh * -(-q // FLASH_BLOCK)
    return blocks / (blocks + fill)


def _tile_rate(q, k, bh, overhead: float, fill: float):
    """The share of a walk's time spent on its key blocks, times the share of the grid the SMs run at once."""
    seen = _causal_walk(k)
    return seen / (seen + overhead) * _grid_share(q, bh, fill)


def _walk_constants(gpu: GPU, direction: str, kernel: str) -> tuple[float, float, tuple[int, int, int]]:
    """(fixed work in key blocks, blocks per SM for half the rate, reference shape) of the tile curve a kernel
    follows on ``gpu``: cuDNN's on Blackwell (its fused kernel and a FlashAttention-2 stack's), FlashAttention-2's
    H100 fit otherwise."""
    if _cudnn_curve(gpu, kernel):
        return (
            CUDNN_BLACKWELL["overhead"][direction],
            CUDNN_BLACKWELL["fill"][direction] * gpu.sm_count,
            CUDNN_REFERENCE,
        )
    return FLASH_OVERHEAD[direction], FLASH_FILL[direction] * gpu.sm_count, FLASH_REFERENCE


# Attention kernels priced relative to FlashAttention-2 at the same shape. MPT's Triton FlashAttention
# (mosaicml/llm-foundry llmfoundry/models/layers/flash_attn_triton.py @beb8dee, attn_impl: triton: flash-attn's
# flash_attn_triton.py on Triton's pre-MLIR backend) says of itself "Overall Triton forward + backward is slightly
# slower than CUDA forward + backward", CUDA being FlashAttention-1, and FlashAttention-2 gives "around 2x speedup
# compared to FlashAttention" (Dao 2023, abstract): half FlashAttention-2's rate. It tiles as FlashAttention-2
# does (128-query blocks walking the key blocks, a grid of query blocks x sample-heads), so it follows the same
# shape curve.
KERNEL_RATE = {"flash-attention-2": 1.0, "fused": 1.0, "triton-flash": 0.5}


def flash_shape_factor(
    gpu: GPU, direction: str, queries: int, keys: int, heads: int, kernel: str = "flash-attention-2"
) -> float:
    """FlashAttention-2's rate at ``queries`` x ``keys`` (causal; each query sees half the keys on average, as
    with context parallelism's load balancing) over ``heads`` (sample, head) pairs, relative to the reference
    shape's, on the architectures it was measured on: on A100 the kernel's fixed work weighs less against slower
    tensor cores (Dao 2023 Fig. 4 shows a flatter curve). On Blackwell, where the files state cuDNN's measured
    rate, cuDNN's curve (CUDNN_BLACKWELL) for the fused and the FlashAttention-2 kernels alike; on Hopper cuDNN's
    fused attention, measured beside FlashAttention-2, follows none (its heuristics pick kernels by shape:
    docs/measurements/cudnn_shapes_h100.json), so one rate."""
    cudnn = _cudnn_curve(gpu, kernel)
    if not (cudnn or _flash2_shaped(gpu, kernel)):
        return 1.0
    c, fill, reference = _walk_constants(gpu, direction, kernel)
    relative = _tile_rate(queries, keys, heads, c, fill) / _tile_rate(*reference, c, fill)
    return relative * FLASH_BACKWARD if direction == "backward" and not cudnn else relative


def _flash2_shaped(gpu: GPU, kernel: str) -> bool:
    """A FlashAttention-2-like kernel on an architecture its shape curve was measured on."""
    return kernel in ("flash-attention-2", "triton-flash") and gpu.architecture in FLASH_SHAPED


# FlashAttention-2's rate by head dimension. Per (query, key) pair the kernel does 4d FLOPs of matmul and a
# softmax step (exponent, running max, rescale) whose cost does not grow with d, so below d = 128 that step weighs
# more: the rate at d relative to d = 128 is (d / (d + x)) / (128 / (128 + x)), x the softmax step in units of d.
# Fitted on torch's FlashAttention-2 measured on one H100 80GB at head dims 64 and 128 over the same causal
# shapes (docs/measurements/flash_shapes_h100.json, 2026-11-26: the 12 shapes of 2k-16k tokens and 32-512
# sample-heads; d = 64 runs at 0.85 of d = 128's rate forward, 0.87 backward; rms 8.5% / 3.2% in log). Only
# 64 and 128 were measured: above 128 the rate is kept at 128's.
FLASH_HEAD_DIM_X = {"forward": 27.6, "backward": 21.7}
# The softmax step runs on the SFUs (16 exponentials per SM per clock on compute capability 8.0, 9.0 and 10.0:
# CUDA C++ Programming Guide, arithmetic instruction throughput), the matmul on the tensor cores, whose dense
# 16-bit rate per SM and clock doubled from Ampere to Hopper (H100 whitepaper: "2x the MMA rate clock-for-clock
# per SM") and again to Blackwell: x in proportion, Hopper's measured
FLASH_TENSOR_PER_SFU = {"ampere": 0.5, "hopper": 1.0, "blackwell": 2.0}


def flash_direction_rate(gpu: GPU, direction: str, dtype: str = "") -> float:
    """The backward's rate relative to the forward's where the GPU file states it (``flash_attention_backward``:
    cuDNN's fused attention measured on Blackwell), 1.0 for the forward; an FP8 attention (``dtype`` fp8) at the
    file's measured FP8 rate over BF16's (``flash_attention_fp8``)."""
    rate = gpu.flash_attention_backward if direction == "backward" else 1.0
    if dtype == "fp8" and gpu.flash_attention_fp8 is not None:
        rate *= getattr(gpu.flash_attention_fp8, "backward" if direction == "backward" else "forward")
    return rate


def flash_head_dim_factor(
    gpu: GPU, direction: str, head_dim: int, kernel: str = "flash-attention-2"
) -> float:
    """FlashAttention-2's rate at ``head_dim`` relative to head dim 128 (above: 1.0); other kernels keep one
    rate: cuDNN's and FlashAttention-3 overlap the softmax with the matmuls, and MPT's Triton kernel was not
    measured (MosaicML's 350M runs, head dim 64, show no such penalty beside their 760M-70B ones, head dim 128).
    On Blackwell both the fused and the FlashAttention-2 kernels take cuDNN's (CUDNN_KERNELS): one rate forward,
    CUDNN_WIDE_BACKWARD's backward above head dim 128."""
    if _cudnn_curve(gpu, kernel):
        if direction != "backward":
            return 1.0
        wide, rate = CUDNN_WIDE_BACKWARD
        over = np.clip((np.asarray(head_dim) - 128) / (wide - 128), 0.0, 1.0)
        factor = 1.0 + (rate - 1.0) * over
        return factor if isinstance(head_dim, np.ndarray) else float(factor)
    scale = FLASH_TENSOR_PER_SFU.get(gpu.architecture)
    if kernel != "flash-attention-2" or scale is None:
        return 1.0
    x = FLASH_HEAD_DIM_X[direction] * scale
    if isinstance(head_dim, np.ndarray):  # a cost table's rows at once
        return np.where(
            (head_dim > 0) & (head_dim < 128), (head_dim / (head_dim + x)) / (128 / (128 + x)), 1.0
        )
    return (head_dim / (head_dim + x)) / (128 / (128 + x)) if 0 < head_dim < 128 else 1.0


def block_cost(gpu: GPU, direction: str, head_dim):
    """A 128 x 128 block's time at ``head_dim`` relative to head dim 128's: its matmuls in proportion to the head
    dim, its softmax step not (FLASH_HEAD_DIM_X, in units of head dim, times FLASH_TENSOR_PER_SFU's ratio of tensor
    to SFU rate on the architecture): (d + x) / (128 + x)."""
    x = FLASH_HEAD_DIM_X[direction] * FLASH_TENSOR_PER_SFU.get(gpu.architecture, 1.0)
    return (head_dim + x) / (128 + x)


def _narrow_heads(gpu: GPU, direction: str, keys, head_dim):
    """cuDNN's rate on Blackwell below head dim 128 relative to 128's at the same causal walk: a thread block's
    fixed work (CUDNN_BLACKWELL's overhead, in head-dim-128 blocks) does not shrink with the head dim, each block
    of the walk shrinks as ``block_cost`` says, the FLOPs as the head dim: the walk window_factor prices, which
    cuDNN's head-dim-64 sliding-window timings check (their short walks weigh the fixed work most; no causal
    head-dim-64 timing on Blackwell is published); 1.0 from head dim 128 on."""
    c = CUDNN_BLACKWELL["overhead"][direction]
    seen = _causal_walk(np.asarray(keys))
    d = np.asarray(head_dim, dtype=float)
    narrow = (d / 128 * seen / (seen * block_cost(gpu, direction, d) + c)) / (seen / (seen + c))
    factor = np.where(d < 128, narrow, 1.0)
    return factor if isinstance(head_dim, np.ndarray) or isinstance(keys, np.ndarray) else float(factor)


def window_walk(queries: int, window: int) -> tuple[float, float]:
    """(key blocks walked, keys attended / FLASH_BLOCK) per block of FLASH_BLOCK queries, averaged over the
    ``queries``, of a causal sliding window of ``window`` keys: query i sees keys max(0, i - w + 1) .. i, and its
    block reaches back ceil((w - 1) / 128) blocks before its own (every one walked whole, the partial ones masked)."""
    nq = -(-queries // FLASH_BLOCK)
    reach = -(-(window - 1) // FLASH_BLOCK) + 1
    walked = (nq + 1) / 2 if nq <= reach else (reach * (reach + 1) / 2 + (nq - reach) * reach) / nq
    return walked, windowed_keys(queries, min(window, queries)) / queries / FLASH_BLOCK


def window_factor(
    gpu: GPU, direction: str, queries: int, window: int, heads: int, head_dim: int, kernel: str = "fused"
) -> float:
    """A sliding-window attention kernel's rate per FLOP of the keys it attends to, relative to the GPU file's
    reference rate (head dim 128, a long causal walk): each block of 128 queries walks ``window_walk``'s blocks at
    ``block_cost`` each, plus its fixed work, for the FLOPs of the keys in the window. The fixed work and grid fill
    are the architecture's fitted ones (cuDNN's on Blackwell, FlashAttention-2's on H100 otherwise); nothing is
    fitted to windows. Against cuDNN's published sliding-window timings (NVIDIA/cudnn-frontend benchmark/
    sdpa_benchmark_training, MIT: GPT-OSS's shape, head dim 64, windows of 128 and 1,024 tokens, 2k-32k tokens;
    docs/measurements/cudnn-sdpa-window.json) on GB200, GB300 and H200: tests/test_window_attention.py. Before, the
    windowed layers were priced as causal attention over the average keys at the full kernel's rate, 38-59% fast."""
    c, fill, reference = _walk_constants(gpu, direction, kernel)
    backward = FLASH_BACKWARD if _flash2_shaped(gpu, kernel) and direction == "backward" else 1.0
    walked, useful = window_walk(queries, window)
    per_block = walked * block_cost(gpu, direction, head_dim) + c  # in head-dim-128 blocks of the walk
    rate = useful * head_dim / 128 / per_block * _grid_share(queries, heads, fill)
    return rate / _tile_rate(*reference, c, fill) * backward


def attention_factor(
    gpu: GPU,
    direction: str,
    queries,
    keys,
    heads,
    head_dim,
    kernel: str = "flash-attention-2",
    window: int = 0,
):
    """The attention kernel's rate relative to the GPU file's reference rate: by shape (flash_shape_factor) and head
    dim (flash_head_dim_factor; on Blackwell, below 128, _narrow_heads), or a sliding window's (window_factor)."""
    if window:
        return window_factor(gpu, direction, queries, window, heads, head_dim, kernel)
    factor = flash_shape_factor(gpu, direction, queries, keys, heads, kernel)
    factor = factor * flash_head_dim_factor(gpu, direction, head_dim, kernel)
    if _cudnn_curve(gpu, kernel):
        factor = factor * _narrow_heads(gpu, direction, keys, head_dim)
    return factor
