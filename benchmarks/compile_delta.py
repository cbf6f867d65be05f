"""What torch.compile changes in one Llama decoder layer's training step on one GPU (issue 31 item 6): the layer's
forward + backward in eager mode, compiled (``torch.compile``, default mode, as torchtitan's ``compile`` applies it
per block), and with its memory-bound work left out (RMSNorm, RoPE, SiLU x up, residual adds as identities), so
that eager - bare is the eager memory-bound time and compiled - bare what is left of it after fusion.

    python benchmarks/compile_delta.py --json compile.json          # on a GPU; a tiny smoke run on a CPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from gpu_results import save
from torch import nn

# Llama 3 8B (hidden, heads, kv heads, ffn) at sequence 8192, micro-batch 1; Llama 3 70B's layer at TP 8; a
# 1B-size layer at sequence 1,024, where the host's launches set the pace
CONFIGS = [
    ("llama3-8b", 4096, 32, 8, 14336, 8192),
    ("llama3-70b TP8 shard", 8192, 8, 1, 3584, 8192),
    ("1b-size", 2048, 16, 8, 8192, 1024),
]
VARIANTS = ("eager", "compiled", "bare", "no_rope")


class Layer(nn.Module):
    def __init__(self, h: int, heads: int, kv: int, ffn: int, bare: bool, rope: bool = True):
        super().__init__()
        self.h, self.heads, self.kv, self.d, self.bare, self.use_rope = h, heads, kv, 128, bare, rope
        self.wqkv = nn.Linear(h, (heads + 2 * kv) * self.d, bias=False)
        self.wo = nn.Linear(heads * self.d, h, bias=False)
        self.w13 = nn.Linear(h, 2 * ffn, bias=False)
        self.w2 = nn.Linear(ffn, h, bias=False)
        self.n1, self.n2 = nn.RMSNorm(h), nn.RMSNorm(h)

    def rope(self, x, freqs):
        """torchtitan's apply_rotary_emb (torchtitan/models/llama3/model.py): pairs as complex numbers in fp32,
        multiplied by the rotation, back to the input's type."""
        if self.bare or not self.use_rope:
            return x
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs).flatten(3).type_as(x)

    def forward(self, x, freqs):
        b, s, _ = x.shape
        y = x if self.bare else self.n1(x)
        q, k, v = self.wqkv(y).split([self.heads * self.d, self.kv * self.d, self.kv * self.d], dim=-1)
        q = self.rope(q.view(b, s, self.heads, self.d), freqs).transpose(1, 2)
        k = self.rope(k.view(b, s, self.kv, self.d), freqs).transpose(1, 2)
        v = v.view(b, s, self.kv, self.d).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        o = self.wo(o.transpose(1, 2).reshape(b, s, -1))
        x = o if self.bare else x + o
        y = x if self.bare else self.n2(x)
        a, g = self.w13(y).chunk(2, dim=-1)
        m = self.w2(a if self.bare else F.silu(a) * g)
        return m if self.bare else x + m


def step_time(layer, x, freqs, iters: int, sync) -> list[float]:
    times = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        out = layer(x, freqs)
        out.backward(torch.ones_like(out))
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def kernels_per_step(fn, x, freqs, cuda: bool) -> int:
    """GPU kernels (CPU ops on a CPU) one forward + backward launches, counted by the PyTorch profiler."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        out = fn(x, freqs)
        out.backward(torch.ones_like(out))
        if cuda:
            torch.cuda.synchronize()
    x.grad = None
    if cuda:
        return sum(1 for e in prof.events() if e.device_type.name == "CUDA")
    return sum(1 for e in prof.events() if e.name.startswith("aten::"))


def run(device: str, quick: bool, seqs: list[int] | None = None) -> list[dict]:
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dt = torch.bfloat16
    rows = []
    configs = [(n, h, a, kv, f, q) for n, h, a, kv, f, _ in CONFIGS for q in seqs] if seqs else CONFIGS
    for name, h, heads, kv, ffn, seq in configs:
        if quick:
            h, heads, kv, ffn, seq = 256, 2, 1, 512, 128
        angles = torch.randn(seq, 64, device=device)
        freqs = torch.polar(torch.ones_like(angles), angles).view(1, seq, 1, 64)
        x = torch.randn(1, seq, h, device=device, dtype=dt, requires_grad=True)
        row = {"config": name, "hidden": h, "heads": heads, "kv_heads": kv, "ffn": ffn, "seq": seq}
        for variant in VARIANTS:
            torch.manual_seed(0)
            layer = Layer(h, heads, kv, ffn, bare=variant == "bare", rope=variant != "no_rope").to(device, dt)
            fn = layer
            t0 = time.perf_counter()
            if variant == "compiled":
                fn = torch.compile(layer)
            warm = step_time(fn, x, freqs, 3, sync)
            if variant == "compiled":
                row["compile_s"] = round(time.perf_counter() - t0 - sum(warm[1:]) / 1e3, 1)
            ms = statistics.median(step_time(fn, x, freqs, 3 if quick else 20, sync))
            row[variant + "_ms"] = ms
            if variant in ("eager", "compiled"):
                row[variant + "_kernels"] = kernels_per_step(fn, x, freqs, cuda)
            x.grad = None
        mem_eager = row["eager_ms"] - row["bare_ms"]
        mem_comp = row["compiled_ms"] - row["bare_ms"]
        row["memory_bound_left"] = mem_comp / mem_eager if mem_eager > 0 else None
        rows.append(row)
        print(
            f"{name:22s} s={seq:5d} kernels eager {row['eager_kernels']} compiled {row['compiled_kernels']}  "
            f"without RoPE {row['no_rope_ms']:.3f} ms  eager {row['eager_ms']:.3f} ms  compiled {row['compiled_ms']:.3f} ms  "
            f"(compile {row['compile_s']} s)  GEMMs+attention only {row['bare_ms']:.3f} ms  "
            f"saved {100 * (1 - row['compiled_ms'] / row['eager_ms']):.1f}%  "
            f"memory-bound time left after fusion {row['memory_bound_left']}",
            flush=True,
        )
        if quick:
            break
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the timings to this file")
    ap.add_argument("--seq", help="sequence lengths, comma-separated (default: 8192)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    seqs = [int(x) for x in args.seq.split(",")] if args.seq else None
    rows = run("cuda" if cuda else "cpu", quick=not cuda, seqs=seqs)
    save(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
