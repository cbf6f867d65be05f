"""What splitting a tensor-parallel GEMM costs, as Transformer Engine's userbuffers overlap splits it
(``tp_comm_overlap: te``): the local GEMM of a TP layer whole, in TP chunks of its rows (ring exchange: one
chunk per peer's shard), in 4 chunks of rows or of output features (``split4n``: the pipelined reduce-scatter's
``num_splits``, as TE cuts it), and whole or in 4 chunks of rows with 16 SMs left to the communication kernel
(cuBLASLt's SM count target, ``torch._C._set_sm_carveout_experimental``, as TE's ``set_sm_margin`` does).

Prints one line per GEMM and, with --json FILE, writes every timing. GPU time only: each sample is queued behind a
GPU spin (as ``clustersim calibrate kernels`` times kernels), so a chunk's host launch is not in it.

    python benchmarks/tp_split_gemm.py --json split.json        # on a GPU; a tiny smoke run on a CPU
"""

from __future__ import annotations

import sys
from itertools import product

import torch
from gpu_results import main_of

from simulator.calibration.torch_ops import time_call

# (model, hidden, query + key/value width, ffn width (fc1 doubled when gated), gated, tokens per micro-batch)
MODELS = [
    ("gpt3-175b", 12288, 3 * 12288, 49152, False, 2048),
    ("nemotron4-340b", 18432, 18432 + 2 * 8 * 192, 73728, False, 4096),
    ("llama3-70b", 8192, 8192 + 2 * 8 * 128, 28672, True, 8192),
    ("llama3-8b", 4096, 4096 + 2 * 8 * 128, 14336, True, 8192),
]
TPS = (2, 4, 8)
# the Megatron-Core H100 table's runs (simulator/validation/published.yaml MCORE-H100-*): GeLU MLPs, full attention,
# 4,096 tokens per micro-batch, each at its own TP
MCORE = [
    (f"mcore-{name}", h, 3 * h, 4 * h, False, 4096, tp)
    for name, h, tp in (("7.1b", 4096, 2), ("16b", 6144, 4), ("32b", 7168, 8), ("70b", 8192, 8), ("119b", 10240, 8),
                        ("177b", 12288, 8), ("314b", 16384, 8), ("462b", 18432, 8))
]  # fmt: skip
SPLITS = 4  # TE's pipelined reduce-scatter: num_splits (initialize_ub's default)
CARVE = 16  # SMs TE leaves to its communication kernel (num_sm)
ONE: dict = {}


def gemms(h: int, qkv: int, ffn: int, gated: bool, t: int):
    """The four TP GEMMs of a layer, (name, k, n) of the local weight: column-parallel after an all-gather,
    row-parallel before a reduce-scatter."""
    return (
        ("qkv", h, qkv // t),
        ("proj", h // t, h),
        ("fc1", h, (2 if gated else 1) * ffn // t),
        ("fc2", ffn // t, h),
    )


def mm(x, w, y):
    """y = x w: a bf16 GEMM, or an FP8 one as Transformer Engine runs it (E4M3 operands, per-tensor scales, bf16
    output; torch._scaled_mm through cuBLASLt)."""
    if x.dtype == torch.bfloat16:
        return torch.mm(x, w, out=y)
    # the scale made once: a fill per call would be timed
    one = ONE.setdefault(x.device, torch.ones((), device=x.device))
    return torch._scaled_mm(x, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, out=y)


def chunked(a, w, out, parts: int):
    rows = a.shape[0] // parts
    pieces = [(a[i * rows : (i + 1) * rows], out[i * rows : (i + 1) * rows]) for i in range(parts)]

    def run():
        for x, y in pieces:
            mm(x, w, y)

    return run


def column_chunked(a, w, parts: int):
    """The GEMM in ``parts`` chunks of its output features, as TE's pipelined reduce-scatter runs it (each chunk's
    output its own buffer)."""
    cols = w.shape[1] // parts
    pieces = [
        (
            w[:, i * cols : (i + 1) * cols],
            torch.empty(a.shape[0], cols, device=a.device, dtype=torch.bfloat16),
        )
        for i in range(parts)
    ]

    def run():
        for wi, y in pieces:
            mm(a, wi, y)

    return run


def carved(fn, sms: int):
    set_carve = getattr(torch._C, "_set_sm_carveout_experimental", None)
    if set_carve is None:
        return None

    def run():
        set_carve(sms)
        try:
            fn()
        finally:
            set_carve(None)

    return run


def run(
    device: str, repeats: int, quick: bool, only: set[str] | None = None, mcore: bool = False
) -> list[dict]:
    out = []
    dtypes = ("bf16", "fp8") if device.startswith("cuda") and not mcore else ("bf16",)
    models = MCORE if mcore else [(*x, 0) for x in MODELS]
    for (model, h, qkv, ffn, gated, tokens, own_tp), dtype in product(
        models[:1] if quick else models, dtypes
    ):
        m = 256 if quick else tokens
        for t in (own_tp,) if own_tp else TPS[:1] if quick else TPS:
            for name, k, n in gemms(h, qkv, ffn, gated, t):
                if quick:
                    k, n = k // 64, n // 64
                dt = torch.bfloat16 if dtype == "bf16" else torch.float8_e4m3fn
                a = torch.randn(m, k, device=device).to(dt)
                w = torch.randn(n, k, device=device).to(dt).t()  # the weight column-major, as nn.Linear's
                c = torch.empty(m, n, device=device, dtype=torch.bfloat16)
                row = {"model": model, "dtype": dtype, "tp": t, "gemm": name, "m": m, "k": k, "n": n}
                cases = {
                    "whole": chunked(a, w, c, 1),
                    "ring": chunked(a, w, c, t),
                    "split4": chunked(a, w, c, SPLITS),
                    "split4n": column_chunked(a, w, SPLITS),
                }
                if device.startswith("cuda"):
                    cases["whole_carve16"] = carved(cases["whole"], CARVE)
                    cases["split4_carve16"] = carved(cases["split4"], CARVE)
                for case, fn in cases.items():
                    if only and case != "whole" and case not in only:
                        continue
                    if fn is None:
                        row[case + "_error"] = "no torch._C._set_sm_carveout_experimental"
                        continue
                    try:
                        row[case + "_us"] = time_call(fn, device, repeats, flush=False)[0]
                    except (RuntimeError, TypeError, ValueError) as e:
                        row[case + "_error"] = str(e).splitlines()[0][:160]
                out.append(row)
                base = row.get("whole_us")
                cells = "  ".join(
                    f"{x} {row[x + '_us'] / base:5.3f}" for x in cases if x + "_us" in row and x != "whole"
                )
                tflops = 2.0 * m * k * n / base / 1e6 if base else float("nan")
                print(
                    f"{model:15s} {dtype} TP{t} {name:4s} {m:5d}x{k:5d}x{n:5d} whole {base:8.1f} us "
                    f"{tflops:5.0f} TF/s  {cells}",
                    flush=True,
                )
    return out


if __name__ == "__main__":
    sys.exit(
        main_of(
            __doc__,
            run,
            {
                "--only": {
                    "type": lambda v: set(v.split(",")),
                    "help": "comma-separated cases to time beside the whole GEMM (default: all)",
                },
                "--mcore": {
                    "action": "store_true",
                    "help": "the Megatron-Core H100 table's layers, bf16, at their TP",
                },
            },
        )
    )
