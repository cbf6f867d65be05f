"""How an MoE layer's expert GEMMs run on one GPU: one GEMM over every local expert's rows (what a table row of
the total shape gives), PyTorch's grouped GEMM (``torch._grouped_mm``: CUTLASS grouped GEMM on Hopper, what
torchtitan's MoE calls), and a loop of one GEMM per expert (Megatron-Core's SequentialMLP, or TE's GroupedLinear
when it falls back to one cuBLAS call per expert), at the expert shapes of the shipped MoE models and a range of
rows per expert.

Prints one line per case and, with --json FILE, writes every timing. GPU time only (each sample queued behind a
GPU spin, as ``clustersim calibrate kernels`` times kernels): the loop's host launch gaps are not in it.

    python benchmarks/moe_grouped_gemm.py --json grouped.json        # on a GPU; a tiny smoke run on a CPU
"""

from __future__ import annotations

import sys

import torch
from gpu_results import main_of

from simulator.calibration.torch_ops import time_call

# (model, hidden, expert ffn width per rank (fc1 is 2x for SwiGLU), local experts)
MODELS = [
    ("mixtral-8x7b EP8", 4096, 14336, 1),
    ("qwen3-235b EP8 ETP4", 4096, 384, 16),
    ("qwen3-235b EP32 ETP1", 4096, 1536, 4),
    ("qwen3-30b EP8", 2048, 768, 16),
    ("deepseek-v3 EP64", 7168, 2048, 4),
    ("deepseek-v3 EP8", 7168, 2048, 32),
]
ROWS = [128, 512, 1024, 2048, 4096, 8192]


def cases(quick: bool):
    for model, h, f, experts in MODELS[:2] if quick else MODELS:
        for rows in ROWS[:2] if quick else ROWS:
            for gemm, k, n in (("fc1", h, 2 * f), ("fc2", f, h)):
                yield model, gemm, experts, rows, k, n


def variants(a, one, w, offs, parts):
    """The three ways to run the experts' GEMM: one GEMM of all rows, one grouped GEMM, a loop of GEMMs."""
    return (
        ("one_gemm", lambda: torch.mm(a, one)),
        ("grouped_mm", lambda: torch._grouped_mm(a, w, offs=offs)),
        ("loop", lambda: [torch.mm(p, w[i]) for i, p in enumerate(parts)]),
    )


def run(device: str, repeats: int, quick: bool) -> list[dict]:
    dt = torch.bfloat16
    out = []
    for model, gemm, experts, rows, k, n in cases(quick):
        if experts * rows * max(k, n) * 2 > 8 * 2**30:
            continue
        total = experts * rows
        a = torch.randn(total, k, device=device, dtype=dt)
        w = torch.randn(experts, n, k, device=device, dtype=dt).transpose(-2, -1)  # [E, k, n], column-major
        offs = torch.arange(1, experts + 1, device=device, dtype=torch.int32) * rows
        one = torch.randn(k, n, device=device, dtype=dt)
        parts = [a[i * rows : (i + 1) * rows] for i in range(experts)]
        flop = 2.0 * total * k * n
        row = {"model": model, "gemm": gemm, "experts": experts, "rows_per_expert": rows, "k": k, "n": n}
        for name, fn in variants(a, one, w, offs, parts):
            try:
                us = time_call(fn, device, repeats, flush=False)[0]
                row[name + "_us"] = us
                row[name + "_tflops"] = flop / us / 1e6
            except (RuntimeError, TypeError, ValueError) as e:
                row[name + "_error"] = str(e).splitlines()[0][:160]
        out.append(row)
        cells = "  ".join(
            f"{x} {row[x + '_us']:9.1f} us {row[x + '_tflops']:6.1f} TF/s" if x + "_us" in row else f"{x} n/a"
            for x in ("one_gemm", "grouped_mm", "loop")
        )
        print(f"{model:22s} {gemm} E={experts:2d} rows={rows:5d} k={k:5d} n={n:5d}  {cells}", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main_of(__doc__, run))
