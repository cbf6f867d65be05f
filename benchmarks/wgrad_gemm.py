"""Weight-gradient GEMMs, the regime where split-K decides: a small output (hidden x hidden ... hidden x 4 hidden)
reduced over every token of the micro-batch. dW = X^T dY for the four linear layers of a GPT layer of hidden
768-4096, over 8k-128k tokens, bf16, each timed as ``clustersim calibrate kernels`` times kernels (queued behind
a GPU spin).

Prints one line per GEMM with its TFLOP/s and, with --json FILE, writes every timing; costs/compute.py's
gemm_efficiency is checked against them (docs/calibration.md).

    python benchmarks/wgrad_gemm.py --json wgrad.json        # on a GPU; a tiny smoke run on a CPU
"""

from __future__ import annotations

import sys

import torch
from gpu_results import main_of

from simulator.calibration.torch_ops import time_call

HIDDEN = (768, 1024, 2048, 4096)
TOKENS = (8192, 32768, 131072)


def shapes(h: int):
    """(name, m, n) of each linear layer's weight gradient: m x n output, reduced over the tokens."""
    return (("qkv", h, 3 * h), ("proj", h, h), ("fc1", h, 4 * h), ("fc2", 4 * h, h))


def run(device: str, repeats: int, quick: bool) -> list[dict]:
    out = []
    for h in HIDDEN[:1] if quick else HIDDEN:
        for tokens in TOKENS[:1] if quick else TOKENS:
            k = 512 if quick else tokens
            for name, m, n in shapes(h):
                x = torch.randn(k, m, device=device, dtype=torch.bfloat16)  # activations, tokens x in
                dy = torch.randn(k, n, device=device, dtype=torch.bfloat16)  # output gradient, tokens x out
                w = torch.empty(m, n, device=device, dtype=torch.bfloat16)
                row = {"hidden": h, "tokens": k, "gemm": name, "m": m, "n": n, "k": k}
                try:
                    fn = lambda x=x, dy=dy, w=w: torch.mm(x.t(), dy, out=w)  # noqa: E731
                    row["us"] = time_call(fn, device, repeats, flush=False)[0]
                except (RuntimeError, TypeError, ValueError) as e:
                    row["error"] = str(e).splitlines()[0][:160]
                out.append(row)
                if "us" in row:
                    tflops = 2.0 * m * n * k / row["us"] / 1e6
                    print(
                        f"h={h:5d} tokens={k:6d} {name:4s} {m:5d}x{n:5d}x{k:6d} {row['us']:9.1f} us {tflops:5.0f} TF/s"
                    )
    return out


if __name__ == "__main__":
    sys.exit(main_of(__doc__, run))
