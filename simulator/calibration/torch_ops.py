"""Each table kernel as PyTorch runs it, and the timer: public PyTorch APIs (and ``torch.cuda._sleep`` for a GPU
spin), so the same code runs on a CPU, an A100 or an H100 node.

Timing (per shape): 3 warm-up calls, then ``repeats`` timed calls; the row keeps the median and the spread
(max - min) / median. On CUDA each sample is 5 calls queued behind a GPU spin and timed with CUDA events (kernel
time without the host's launch gap), memory-bound kernels after a write of twice the L2 cache (so the first
call reads from HBM); the CPU time to issue one call is kept as the kernel's host time. On the CPU, wall time (``time.perf_counter``). Backward rows time the backward of the op
alone (its forward ran once before), as autograd runs it in training.

Collectives run in one process per rank, started here (``torch.multiprocessing``, gloo on the CPU, NCCL on
GPUs): after a barrier, each call is timed on every rank and the slowest rank's time is kept (a collective
ends when its last rank does).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

WARMUP = 3
CALLS = 5  # calls per timed sample on CUDA
HOLD_CYCLES = 400_000  # ~0.2 ms at 2 GHz: the shortest GPU spin before a sample
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
MEMORY_BOUND = {
    "softmax",
    "dropout",
    "layernorm",
    "rmsnorm",
    "gelu",
    "swiglu",
    "relu",
    "squared_relu",
    "bias_dropout_add",
    "residual_add",
    "elementwise",
    "embedding",
    "cross_entropy",
    "adam_step",
    "sgd_step",
}


def kernel_call(
    op: str, direction: str, dtype: str, m: int, n: int, k: int, batch: int, device: str
) -> Callable:
    """A closure running one kernel of this shape once (its backward alone, for backward rows)."""
    dt = TORCH_DTYPES.get(dtype, torch.float32)
    grad = direction == "backward"

    def t(*shape, dtype=dt, requires_grad=grad):
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=requires_grad)

    if op == "gemm" and dtype == "fp8":
        return _fp8_gemm(m, n, k, device)
    if op == "gemm":
        a, b = t(m, k, requires_grad=False), t(k, n, requires_grad=False)
        return lambda: torch.matmul(a, b)
    if op == "batched_gemm":
        a, b = t(batch, m, k, requires_grad=False), t(batch, k, n, requires_grad=False)
        return lambda: torch.bmm(a, b)
    if op == "grouped_gemm":
        return _grouped_gemm(m, n, k, batch, dtype, t, device)
    if op in ("adam_step", "sgd_step"):
        p = torch.zeros(m, device=device, dtype=torch.float32, requires_grad=True)
        p.grad = torch.randn_like(p)
        fused = {"fused": True} if device.startswith("cuda") else {"foreach": False}
        opt = torch.optim.AdamW([p], lr=1e-4, **fused) if op == "adam_step" else torch.optim.SGD([p], lr=1e-4)
        return opt.step
    inputs, forward = _forward(op, m, n, k, batch, t, device)
    if not grad:
        return lambda: forward(*inputs)
    out = forward(*inputs)
    g = torch.randn_like(out)
    leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    return lambda: torch.autograd.grad(out, leaves, g, retain_graph=True)


def _fp8_gemm(m: int, n: int, k: int, device: str) -> Callable:
    """An FP8 GEMM as Transformer Engine runs a linear layer's: E4M3 operands, per-tensor scales, bf16 output,
    through cuBLASLt (torch._scaled_mm; the second operand column-major, as cuBLASLt's FP8 GEMMs take it on
    Hopper)."""
    if not device.startswith("cuda"):
        raise RuntimeError("FP8 GEMMs need a CUDA GPU with FP8 tensor cores")
    e4m3 = torch.float8_e4m3fn
    a = torch.randn(m, k, device=device).to(e4m3)
    b = torch.randn(n, k, device=device).to(e4m3).t()
    one = torch.ones((), device=device)
    return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def _grouped_gemm(m: int, n: int, k: int, batch: int, dtype: str, t, device: str) -> Callable:
    """One grouped GEMM over ``batch`` experts of ``m`` rows each (torch._grouped_mm: CUTLASS's grouped GEMM on
    Hopper, what torchtitan's MoE runs; the weights column-major as it takes them). FP8 grouped GEMMs are not
    timed: their kernels (TE's, DeepGEMM's) are not PyTorch's."""
    if dtype == "fp8" or not hasattr(torch, "_grouped_mm"):
        raise ValueError("no PyTorch grouped GEMM for this type in this PyTorch")
    a = t(batch * m, k, requires_grad=False)
    w = t(batch, n, k, requires_grad=False).transpose(-2, -1)
    offs = torch.arange(1, batch + 1, device=device, dtype=torch.int32) * m
    return lambda: torch._grouped_mm(a, w, offs=offs)


def _forward(op: str, m: int, n: int, k: int, batch: int, t, device: str):
    """(inputs, function) of a memory-bound kernel or of FlashAttention."""
    if op == "flash_attention":  # (samples x heads) = batch; m queries, n keys, head dim k; causal
        q, kk, v = t(1, batch, m, k), t(1, batch, n, k), t(1, batch, n, k)
        return (q, kk, v), lambda q, kk, v: F.scaled_dot_product_attention(q, kk, v, is_causal=True)
    if op == "softmax":
        return (t(m, n),), lambda x: torch.softmax(x, dim=-1)
    if op == "dropout":
        return (t(m, n),), lambda x: F.dropout(x, 0.1, training=True)
    if op == "layernorm":
        return (t(m, n), t(n), t(n)), lambda x, w, b: F.layer_norm(x, (n,), w, b)
    if op == "rmsnorm":
        return (t(m, n), t(n)), lambda x, w: F.rms_norm(x, (n,), w)
    if op == "gelu":
        return (t(m, n),), lambda x: F.gelu(x, approximate="tanh")
    if op == "swiglu":  # reads m x 2n, writes m x n

        def swiglu(x):
            a, b = x.chunk(2, dim=-1)
            return F.silu(a) * b

        return (t(m, 2 * n),), swiglu
    if op == "relu":
        return (t(m, n),), F.relu
    if op == "squared_relu":
        return (t(m, n),), lambda x: F.relu(x).square()
    if op == "bias_dropout_add":  # Megatron's bias-dropout-add
        return (t(m, n), t(n), t(m, n)), lambda x, b, r: F.dropout(x + b, 0.1, training=True) + r
    if op == "residual_add":
        return (t(m, n), t(m, n)), torch.add
    if op == "elementwise":
        return (t(m, n), t(m, n)), torch.mul
    if op == "embedding":
        rows = max(k, 1)
        idx = torch.randint(0, rows, (m,), device=device)
        return (idx, t(rows, n)), lambda i, w: F.embedding(i, w)
    if op == "cross_entropy":
        target = torch.randint(0, n, (m,), device=device)
        return (t(m, n), target), lambda x, y: F.cross_entropy(x.float(), y)
    raise ValueError(f"no PyTorch kernel for '{op}'")


def time_call(fn: Callable, device: str, repeats: int, flush: bool) -> tuple[float, float, float | None, int]:
    """(median us, spread %, host us or None, samples) of ``repeats`` samples of ``fn`` after warm-up; Ctrl-C
    after a sample raises Interrupted with what the samples so far give.

    On CUDA a sample is ``CALLS`` calls queued back to back behind a GPU spin longer than their issue (so the
    events time the kernels, not the host), divided by ``CALLS``: the kernel's time in a stream of kernels,
    without the host's launch gap, which the cost model adds itself (``GPU.kernel_launch_s``)."""
    cuda = device.startswith("cuda")
    scratch = None
    if cuda and flush:
        l2 = getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 50 * 2**20)
        scratch = torch.empty(2 * l2, dtype=torch.uint8, device=device)
    warm = []
    for _ in range(WARMUP):
        h0 = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - h0)
    calls = CALLS if cuda else 1
    # spin ~3x the time the host needs to issue the calls, at an assumed 2 GHz (a slower clock spins longer)
    hold = int(min(max(3 * calls * max(warm) * 2e9, HOLD_CYCLES), 200 * HOLD_CYCLES))
    if cuda:
        torch.cuda.synchronize(device)
    times, host = [], []
    try:
        _samples(fn, cuda, scratch, hold, calls, repeats, times, host)
    except KeyboardInterrupt:  # Ctrl-C: the samples taken so far are a row too (with fewer repeats)
        if not times:
            raise
        raise Interrupted(_summary(times, host)) from None
    return _summary(times, host)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C inside a shape's timing, with what its finished samples give: (median us, spread %, host us or
    None, samples)."""

    def __init__(self, partial: tuple[float, float, float | None, int]):
        super().__init__()
        self.partial = partial


def _summary(times: list[float], host: list[float]) -> tuple[float, float, float | None, int]:
    mid = statistics.median(times)
    spread = 100.0 * (max(times) - min(times)) / mid if mid > 0 else 0.0
    return mid, spread, statistics.median(host) if host else None, len(times)


def _samples(fn, cuda: bool, scratch, hold: int, calls: int, repeats: int, times: list, host: list) -> None:
    for _ in range(repeats):
        if cuda:
            if scratch is not None:
                scratch.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(hold)  # spins cycles on the GPU: the calls below queue up behind it
            start.record()
            h0 = time.perf_counter()
            for _ in range(calls):
                fn()
            host.append((time.perf_counter() - h0) * 1e6 / calls)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / calls)  # ms -> us
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)


# -- collectives ------------------------------------------------------------------------------------------------
def _collective(op: str, nbytes: float, n: int, rank: int, dt, device: str) -> Callable:
    import torch.distributed as dist

    itemsize = torch.tensor([], dtype=dt).element_size()
    count = max(int(nbytes // itemsize) // n * n, n)  # a whole number of elements per rank
    if op == "all_reduce":
        buf = torch.ones(count, dtype=dt, device=device)
        return lambda: dist.all_reduce(buf)
    if op == "broadcast":
        buf = torch.ones(count, dtype=dt, device=device)
        return lambda: dist.broadcast(buf, src=0)
    if op == "all_gather":
        out, inp = (
            torch.empty(count, dtype=dt, device=device),
            torch.ones(count // n, dtype=dt, device=device),
        )
        return lambda: dist.all_gather_into_tensor(out, inp)
    if op == "reduce_scatter":
        out, inp = (
            torch.empty(count // n, dtype=dt, device=device),
            torch.ones(count, dtype=dt, device=device),
        )
        return lambda: dist.reduce_scatter_tensor(out, inp)
    if op == "all_to_all":
        out, inp = torch.empty(count, dtype=dt, device=device), torch.ones(count, dtype=dt, device=device)
        return lambda: dist.all_to_all_single(out, inp)
    if op == "send_recv":  # rank 0 sends the message to rank 1
        buf = torch.ones(count, dtype=dt, device=device)
        return (lambda: dist.send(buf, 1)) if rank == 0 else (lambda: dist.recv(buf, 0))
    raise ValueError(op)


def collective_worker(
    rank: int, n: int, port: int, device: str, dtype: str, shapes: list, repeats: int, results
) -> None:
    """One rank: time every (op, bytes) of ``shapes`` and put (key, median us, spread %, error) on ``results``
    (rank 0 only)."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = device == "cuda"
    dev = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=n)
    dt = TORCH_DTYPES.get(dtype, torch.float32) if cuda else torch.float32
    try:
        for key, op, nbytes in shapes:
            try:
                fn = _collective(op, nbytes, n, rank, dt, dev)
                times = []
                for i in range(WARMUP + repeats):
                    dist.barrier()
                    if cuda:
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fn()
                    if cuda:
                        torch.cuda.synchronize()
                    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
                    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time
                    if i >= WARMUP:
                        times.append(float(elapsed) * 1e6)
                mid = statistics.median(times)
                result = (key, mid, 100.0 * (max(times) - min(times)) / mid, "")
            except (RuntimeError, ValueError) as e:  # e.g. gloo has no reduce-scatter
                result = (key, 0.0, 0.0, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
            if rank == 0:
                results.put(result)
    finally:
        dist.destroy_process_group()
