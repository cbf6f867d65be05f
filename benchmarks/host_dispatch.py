"""Measure what the host thread costs an eager PyTorch transformer layer: the mechanism behind
``host:`` in the framework profiles (simulator/frameworks/*.yaml).

A GPT layer written the way Megatron-LM's legacy ``megatron/model/transformer.py`` runs it (linear layers as a
custom autograd Function with separate bias adds, unfused attention with a scaled causal softmax and dropout,
bias-GeLU, bias-dropout-add, the two ``torch.tensor(0.0, device=...)`` of Megatron-DeepSpeed's layer, full
activation recompute) is run here at two scales:

* tiny (hidden 256, 64 tokens): every kernel is shorter than its issue time, so the wall time is the host's.
  Dividing it by the number of kernels launched (counted with ``torch.profiler``) gives the host seconds per
  kernel in forward and in backward;
* the small-model regime of ../shared/validation/measured-a100-small.yaml (hidden 1024 and 2048, 1,024 tokens,
  micro-batch 1-8): wall time per layer and microbatch (forward, recompute, backward) against the GPU time of
  its kernels, which shows where the host sets the pace.

It also times a host-device synchronisation with the GPU idle, a device tensor made from a host scalar, and one
replay of a captured CUDA graph.

    python benchmarks/host_dispatch.py [--device cuda|cpu] [--json out.json]

Prints a table; with ``--json`` writes every number. Needs PyTorch (the ``calibrate`` extra).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time

import torch
import torch.nn.functional as F


class Linear(torch.autograd.Function):
    """Megatron's LinearWithGradAccumulationAndAsyncCommunication without communication: matmul, then a
    separate bias add; backward: input gradient, weight gradient, bias gradient as three kernels."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.use_bias = bias is not None
        out = torch.matmul(x, weight.t())
        if bias is not None:
            out = out + bias
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_input = grad.matmul(weight)
        g2 = grad.reshape(-1, grad.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        grad_weight = g2.t().matmul(x2)
        grad_bias = g2.sum(dim=0) if ctx.use_bias else None
        return grad_input, grad_weight, grad_bias


class Layer(torch.nn.Module):
    def __init__(self, h: int, heads: int, device, dtype, syncs: int = 2):
        super().__init__()

        def p(*shape):
            return torch.nn.Parameter(torch.randn(*shape, device=device, dtype=dtype) * 0.02)

        self.h, self.heads, self.syncs = h, heads, syncs
        self.ln1_w, self.ln1_b, self.ln2_w, self.ln2_b = p(h), p(h), p(h), p(h)
        self.qkv_w, self.qkv_b = p(3 * h, h), p(3 * h)
        self.proj_w, self.proj_b = p(h, h), p(h)
        self.fc1_w, self.fc1_b = p(4 * h, h), p(4 * h)
        self.fc2_w, self.fc2_b = p(h, 4 * h), p(h)

    def forward(self, x):  # x: [s, b, h]
        s, b, h = x.shape
        a, d = self.heads, h // self.heads
        y = F.layer_norm(x, (h,), self.ln1_w, self.ln1_b)
        qkv = Linear.apply(y, self.qkv_w, self.qkv_b).view(s, b, a, 3 * d)
        q, k, v = torch.split(qkv, d, dim=-1)
        q = q.reshape(s, b * a, d).transpose(0, 1)
        k = k.reshape(s, b * a, d).transpose(0, 1)
        v = v.reshape(s, b * a, d).transpose(0, 1)
        scores = torch.baddbmm(
            torch.empty(b * a, s, s, device=x.device, dtype=x.dtype),
            q,
            k.transpose(1, 2),
            beta=0.0,
            alpha=1.0 / math.sqrt(d),
        )
        mask = torch.ones(s, s, device=x.device, dtype=torch.bool).triu(1)
        probs = F.dropout(torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1), 0.1, True)
        ctx = torch.bmm(probs, v).transpose(0, 1).contiguous().view(s, b, h)
        attn = torch.matmul(ctx, self.proj_w.t())
        x = x + F.dropout(attn + self.proj_b, 0.1, True)
        y = F.layer_norm(x, (h,), self.ln2_w, self.ln2_b)
        for _ in range(self.syncs):  # Megatron-DeepSpeed: moe_loss and mlp_bias as device tensors
            torch.tensor(0.0, device=x.device, dtype=x.dtype)
        up = torch.matmul(y, self.fc1_w.t())
        mid = F.gelu(up + self.fc1_b, approximate="tanh")
        out = Linear.apply(mid, self.fc2_w, self.fc2_b)
        return x + F.dropout(out, 0.1, True)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def layer_step(layers, x, recompute: bool):
    """Forward (no graph kept, as activation checkpointing does), then per layer in reverse: recompute with
    a graph and backward. Returns nothing; the caller times it."""
    inputs = []
    with torch.no_grad():
        h = x
        for layer in layers:
            inputs.append(h)
            h = layer(h)
    grad = torch.ones_like(h)
    for layer, inp in zip(reversed(layers), reversed(inputs), strict=True):
        inp = inp.detach().requires_grad_(True)
        out = layer(inp) if recompute else layer(inp)
        out.backward(grad)
        grad = inp.grad


def count_kernels(fn, device) -> int:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        sync(device)
    if device.type == "cuda":
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)


def gpu_time_s(fn, device) -> float:
    """Sum of kernel durations of ``fn`` (CUDA) from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync(device)
    return sum(e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) * 1e-6


def wall_s(fn, device, repeats: int = 10) -> float:
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def host_costs(device, dtype, layers_n: int = 8) -> dict:
    """Host seconds per kernel in forward and in backward, with kernels far shorter than their issue."""
    h, heads, s, b = 256, 4, 64, 1
    layers = [Layer(h, heads, device, dtype, syncs=0) for _ in range(layers_n)]
    x = torch.randn(s, b, h, device=device, dtype=dtype)

    def fwd():
        with torch.no_grad():
            y = x
            for layer in layers:
                y = layer(y)

    xg = x.detach().requires_grad_(True)

    def fwd_graph():
        y = xg
        for layer in layers:
            y = layer(y)
        return y

    def bwd():
        y = fwd_graph()
        y.backward(torch.ones_like(y))

    t_fwd = wall_s(fwd, device)
    n_fwd = count_kernels(fwd, device)
    t_fg = wall_s(fwd_graph, device)  # forward recording the autograd graph (as recompute does)
    t_fb = wall_s(bwd, device)
    n_fb = count_kernels(bwd, device)
    t_bwd, n_bwd = t_fb - t_fg, n_fb - n_fwd
    return {
        "forward_kernels_per_layer": n_fwd / layers_n,
        "backward_kernels_per_layer": n_bwd / layers_n,
        "forward_kernel_s": t_fwd / n_fwd,
        "backward_kernel_s": t_bwd / n_bwd,
        "forward_layer_s": t_fwd / layers_n,
        "forward_with_graph_layer_s": t_fg / layers_n,
        "backward_layer_s": t_bwd / layers_n,
    }


def sync_costs(device, dtype) -> dict:
    out = {}
    if device.type != "cuda":
        return out
    reps = 200
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.cuda.synchronize()
    out["synchronize_idle_s"] = (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.tensor(0.0, device=device, dtype=dtype)
    out["device_tensor_from_scalar_s"] = (time.perf_counter() - t0) / reps
    # does it wait for the GPU? queue ~20 ms of GPU work, then time it: a sync takes the rest of that work
    torch.cuda._sleep(40_000_000)
    t0 = time.perf_counter()
    torch.tensor(0.0, device=device, dtype=dtype)
    out["device_tensor_from_scalar_behind_busy_gpu_s"] = time.perf_counter() - t0
    sync(device)
    torch.cuda._sleep(40_000_000)
    t0 = time.perf_counter()
    torch.empty(1, device=device, dtype=dtype)
    out["device_empty_behind_busy_gpu_s"] = time.perf_counter() - t0
    sync(device)
    # a graph of 100 small kernels: one replay's host time
    a = torch.randn(1024, device=device, dtype=dtype)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            b = a
            for _ in range(100):
                b = b * 1.0001
        with torch.cuda.graph(g):
            b = a
            for _ in range(100):
                b = b * 1.0001
    torch.cuda.current_stream().wait_stream(s)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        g.replay()
    out["graph_replay_host_s"] = (time.perf_counter() - t0) / reps
    sync(device)
    return out


def regime(device, dtype, h: int, b: int, layers_n: int = 4) -> dict:
    """Wall and GPU time per layer and microbatch (forward + recompute + backward) at a training size."""
    heads, s = 16, 1024
    layers = [Layer(h, heads, device, dtype, syncs=2) for _ in range(layers_n)]
    x = torch.randn(s, b, h, device=device, dtype=dtype)

    def step():
        layer_step(layers, x, recompute=True)

    wall = wall_s(step, device, repeats=5)
    gpu = gpu_time_s(step, device) if device.type == "cuda" else float("nan")
    return {
        "hidden": h,
        "micro_batch": b,
        "wall_per_layer_s": wall / layers_n,
        "gpu_per_layer_s": gpu / layers_n,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default=None, help="Write every figure to this JSON file.")
    ap.add_argument("--quick", action="store_true", help="Host costs only (no training-size regime).")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    info = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or "cpu",
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }
    host = host_costs(device, dtype)
    syncs = sync_costs(device, dtype)
    rows = []
    if not args.quick:
        for h in (1024, 2048):
            for b in (1, 2, 4, 8):
                rows.append(regime(device, dtype, h, b))
    print(f"# host dispatch on {info['device']} (PyTorch {info['torch']}, Python {info['python']})")
    print(
        f"forward : {host['forward_kernels_per_layer']:.0f} kernels/layer, "
        f"{host['forward_kernel_s'] * 1e6:.1f} us/kernel, {host['forward_layer_s'] * 1e6:.0f} us/layer"
    )
    print(
        f"backward: {host['backward_kernels_per_layer']:.0f} kernels/layer, "
        f"{host['backward_kernel_s'] * 1e6:.1f} us/kernel, {host['backward_layer_s'] * 1e6:.0f} us/layer"
    )
    for k, v in syncs.items():
        print(f"{k}: {v * 1e6:.1f} us")
    if rows:
        print("| hidden | micro-batch | wall per layer-microbatch (ms) | GPU kernels (ms) | GPU busy |")
        print("|---|---|---|---|---|")
        for r in rows:
            busy = r["gpu_per_layer_s"] / r["wall_per_layer_s"]
            print(
                f"| {r['hidden']} | {r['micro_batch']} | {r['wall_per_layer_s'] * 1e3:.2f} | "
                f"{r['gpu_per_layer_s'] * 1e3:.2f} | {busy:.0%} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "host": host, "syncs": syncs, "regime": rows}, f, indent=1)


if __name__ == "__main__":
    main()
