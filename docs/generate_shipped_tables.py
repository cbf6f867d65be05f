"""Build the shipped calibration tables (simulator/tables/shipped/) from Vidur's public profiling data.

    python docs/generate_shipped_tables.py --vidur PATH_TO_A_CHECKOUT_OF_microsoft/vidur

Vidur (Agrawal et al., MLSys 2024; https://github.com/microsoft/vidur, MIT licence) measured, on an A100 80GB
DGX and an H100 DGX, the kernels of one transformer layer (fp16, Kineto / CUPTI GPU time, median of 20 timed
forward passes after 2 warm-ups) for 8 Llama-family models at tensor-parallel degrees 1-8 and 1 to 32,768
tokens, and NCCL all-reduce and send/recv (torch.distributed, median NCCL kernel time) from 2 KB to 128 MB.
This script turns their CSVs into this project's table format, unchanged except for:

* GEMM shapes: each layer op's (m, n, k) from the model's dimensions and the TP degree (attn_pre_proj = QKV,
  attn_post_proj = attention output, mlp_up_proj, mlp_down_proj); token counts thinned to 1, 2, 3, 4, 6, 8, ...
  (powers of 2 and 1.5 x powers of 2); repeated shapes merged as the median.
* Memory-bound kernels: input / post-attention RMSNorm -> rmsnorm, mlp_act -> swiglu (gelu for phi-2),
  add -> residual_add, emb -> embedding; rotary embedding left out (not in the simulated workload).
* Collectives: rows measured inside one node only (the 2-node rows ran over an unnamed network); the ~1,000
  sizes per group are merged into quarter-octave bins (median bytes, median time) to tame run-to-run noise.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path

from simulator.tables.format import (
    SHIPPED_DIR,
    CollectiveRow,
    CostTable,
    DeviceInfo,
    KernelRow,
    SourceInfo,
    SystemInfo,
    TableMeta,
)
from simulator.tables.io import write_table

VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
NICE_TOKENS = {c * 2**p for p in range(16) for c in (1, 3) if c * 2**p <= 32768}
GPUS = {
    "a100": (
        "a100-sxm4-80gb",
        "NVIDIA A100-SXM4-80GB (Vidur: 'A100 80GB DGX')",
        80,
        "a100_dgx",
        "dgx-a100",
        300,
    ),
    "h100": ("h100-sxm5-80gb", "NVIDIA H100-SXM5-80GB (Vidur: 'H100 DGX')", 80, "h100_dgx", "dgx-h100", 450),
}


def spread_pct(values: list[float]) -> float:
    mid = statistics.median(values)
    return 100.0 * (max(values) - min(values)) / mid if mid > 0 else 0.0


def kernel_rows(root: Path, gpu: str) -> list[KernelRow]:
    # (op, m, n, k) -> [(median us, min us, max us, source name)]
    found: dict[tuple, list[tuple[float, float, float, str]]] = defaultdict(list)
    for path in sorted(root.glob(f"data/profiling/compute/{gpu}/*/*/mlp.csv")):
        model = path.parent.name
        with open(path, newline="") as f:
            for x in csv.DictReader(f):
                tokens, tp = int(x["num_tokens"]), int(x["num_tensor_parallel_workers"])
                if tokens not in NICE_TOKENS:
                    continue
                h, ffn = int(x["n_embd"]), int(x["n_expanded_embd"])
                heads, kv = int(x["n_head"]), int(x["n_kv_head"])
                gated, d, vocab = x["use_gated_mlp"] == "True", h // heads, int(x["vocab_size"])
                ops = {
                    "attn_pre_proj": ("gemm", tokens, (heads + 2 * kv) * d // tp, h),
                    "attn_post_proj": ("gemm", tokens, h, h // tp),
                    "mlp_up_proj": ("gemm", tokens, (2 if gated else 1) * ffn // tp, h),
                    "mlp_down_proj": ("gemm", tokens, h, ffn // tp),
                    "input_layernorm": ("rmsnorm", tokens, h, 0),
                    "post_attention_layernorm": ("rmsnorm", tokens, h, 0),
                    "mlp_act": ("swiglu" if gated else "gelu", tokens, ffn // tp, 0),
                    "add": ("residual_add", tokens, h, 0),
                    "emb": ("embedding", tokens, h, vocab // tp),
                }
                for name, key in ops.items():
                    cells = [x.get(f"time_stats.{name}.{s}") for s in ("median", "min", "max")]
                    if any(c in (None, "") for c in cells):
                        continue
                    med, lo, hi = (float(c) * 1e3 for c in cells)  # ms -> us
                    found[key].append((med, lo, hi, f"{name} ({model}, tp {tp})"))
    rows = []
    for (op, m, n, k), ms in sorted(found.items()):
        medians = [t[0] for t in ms]
        rows.append(
            KernelRow(
                op=op,
                dtype="fp16",
                m=m,
                n=n,
                k=k,
                median_us=statistics.median(medians),
                repeats=20 * len(ms),
                spread_pct=round(
                    100.0 * (max(t[2] for t in ms) - min(t[1] for t in ms)) / statistics.median(medians), 1
                ),
                name=ms[0][3] + (f" and {len(ms) - 1} more" if len(ms) > 1 else ""),
            )
        )
    return rows


def collective_rows(root: Path, system: str) -> list[CollectiveRow]:
    rows = []
    for op in ("all_reduce", "send_recv"):
        path = root / f"data/profiling/network/{system}/{op}.csv"
        groups: dict[tuple[int, int], dict[int, list[tuple[int, float]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        with open(path, newline="") as f:
            for x in csv.DictReader(f):
                ranks, per_node = int(x["num_workers"]), int(x["devices_per_node"])
                if per_node != ranks:
                    continue  # across nodes: the network is not described
                size = int(x["size"])  # bytes (Vidur writes 2 x the fp16 element count)
                groups[(ranks, per_node)][round(4 * math.log2(size))].append(
                    (size, float(x[f"time_stats.{op}.median"]) * 1e3)
                )
        for (ranks, per_node), bins in sorted(groups.items()):
            for _, points in sorted(bins.items()):
                times = [t for _, t in points]
                rows.append(
                    CollectiveRow(
                        op=op,
                        ranks=ranks,
                        nodes=ranks // per_node,
                        ranks_per_node=per_node,
                        bytes=float(statistics.median(s for s, _ in points)),
                        median_us=statistics.median(times),
                        repeats=3 * len(points),
                        spread_pct=round(spread_pct(times), 1),
                        dtype="fp16",
                    )
                )
    return rows


def build(root: Path, gpu: str) -> CostTable:
    name, model, memory, system, topology, nvlink = GPUS[gpu]
    kernels, colls = kernel_rows(root, gpu), collective_rows(root, system)
    source = f"microsoft/vidur data/profiling ({gpu} compute, {system} network) at commit {VIDUR_COMMIT}"
    meta = TableMeta(
        name=name,
        gpu=name,
        description=f"{model}: transformer-layer kernels and NCCL collectives inside one node, measured by Vidur.",
        device=DeviceInfo(model=model, memory_gib=memory),
        system=SystemInfo(topology=topology, intra_node="nvswitch", nvlink_bandwidth_GBps=nvlink),
        date="2024-05 to 2024-07 (Vidur's profiling commits)",
        method=(
            "Vidur profiling (Agrawal et al., MLSys 2024, Sec. 4): kernels of one transformer layer in fp16, PyTorch "
            "with Kineto (CUPTI) GPU time, 2 warm-up + 20 timed forward passes per (model, TP degree, tokens), "
            "median per op; collectives through torch.distributed (NCCL), median NCCL kernel time over 3 x 11 "
            "launches after a barrier. Converted by docs/generate_shipped_tables.py (shapes derived from each model's "
            "dimensions; collective sizes merged into quarter-octave bins)."
        ),
        sources=(
            SourceInfo(
                rows="kernels and collectives",
                source=source,
                licence="MIT (Copyright (c) Microsoft Corporation)",
                url="https://github.com/microsoft/vidur",
            ),
        ),
        covers=(
            f"{len(kernels)} kernel rows: forward GEMMs of Llama-family layers (hidden 2,560-8,192, 1-32,768 tokens, "
            "TP 1-8), RMSNorm, SwiGLU / GeLU, residual add and embedding lookup, fp16, forward only. "
            f"{len(colls)} collective rows: all-reduce on 2, 4 and 8 GPUs and send/recv between 2 GPUs of one node, "
            "2 KB to 128 MB. Not covered (modelled): backward-only kernels (norm, activation and FlashAttention "
            "backward), LayerNorm, softmax, dropout, cross-entropy, the optimizer step, unfused attention's "
            "batched GEMMs, FlashAttention, all-gather / reduce-scatter / all-to-all, anything across nodes."
        ),
    )
    return CostTable(meta, kernels, colls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vidur", type=Path, required=True, help="a checkout of github.com/microsoft/vidur")
    ap.add_argument("--out", type=Path, default=SHIPPED_DIR)
    args = ap.parse_args()
    for gpu in GPUS:
        table = build(args.vidur, gpu)
        path = write_table(args.out / table.meta.name, table)
        # the MIT licence asks for its notice to travel with substantial portions of the data
        (path / "LICENSE.vidur").write_text((args.vidur / "LICENSE").read_text())
        print(f"{path}: {len(table.kernels)} kernel rows, {len(table.collectives)} collective rows")


if __name__ == "__main__":
    main()
