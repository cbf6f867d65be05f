"""Blackwell cost tables from cuDNN's published attention timings: NVIDIA/cudnn-frontend's
benchmark/sdpa_benchmark_training CSVs, as docs/measurements/cudnn-sdpa-blackwell.json holds them (GB200 and GB300
at cuDNN 9.22.0, B200 at 9.13.1; BF16), written as the shipped tables of those GPUs (issue 60: "shipped Blackwell
tables with provenance for every row").

Rows kept: the causal ones whose value head is as wide as the query / key head (head dims 128 and 256); each as a
``flash_attention`` kernel row (m queries, n keys, k head dim, batch = samples x query heads), its time the CSV's
milliseconds per call. Left out: the unmasked rows (the workload's attention is causal) and multi-latent
attention's 192 / 128 rows (a key head wider than the value head, which the kernel vocabulary does not state).

    python benchmarks/cudnn_sdpa_tables.py      (rewrites simulator/tables/shipped/{gb200-186gb,gb300-288gb,b200-sxm-180gb})
"""

from __future__ import annotations

import json
from pathlib import Path

from simulator.tables.format import SHIPPED_DIR, CostTable, KernelRow, SourceInfo, TableMeta
from simulator.tables.io import write_table

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENTS = ROOT / "docs" / "measurements" / "cudnn-sdpa-blackwell.json"

GPUS = {  # the JSON's GPU -> (catalogue name, driver name, cuDNN, the CSVs' commit and path)
    "gb200": (
        "gb200-186gb",
        "NVIDIA GB200",
        "cuDNN backend 9.22.0, frontend 1.21.1",
        "3929da2ef4c1: benchmark/sdpa_benchmark_training/results/{llama3.1,qwen35}/gb200/*_20260424_*.csv",
    ),
    "gb300": (
        "gb300-288gb",
        "NVIDIA GB300",
        "cuDNN backend 9.22.0, frontend 1.21.1",
        "3929da2ef4c1: benchmark/sdpa_benchmark_training/results/{llama3.1,qwen35}/gb300/*_20260424_*.csv",
    ),
    "b200": (
        "b200-sxm-180gb",
        "NVIDIA B200",
        "cuDNN 9.13.1",
        "0b1577c8: benchmark/sdpa_benchmark_training/artifacts/sdpa_fp8_benchmark_results_NVIDIA_B200.csv (bf16 rows)",
    ),
}


# NVIDIA/cudnn-frontend LICENSE.txt (MIT), shipped beside the rows taken from its published results
LICENSE = """Copyright (c) 2020, NVIDIA CORPORATION. All rights reserved.

Permission is hereby granted, free of charge, to any person obtaining a
copy of this software and associated documentation files (the "Software"),
to deal in the Software without restriction, including without limitation
the rights to use, copy, modify, merge, publish, distribute, sublicense,
and/or sell copies of the Software, and to permit persons to whom the
Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in
all copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT.  IN NO EVENT SHALL
THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING
FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
DEALINGS IN THE SOFTWARE.
"""


def rows_of(gpu: str, rows: list[dict]) -> list[KernelRow]:
    out = []
    for r in rows:
        if r["gpu"] != gpu or r["mask"] != "causal" or r["head_dim"] != r["head_dim_v"]:
            continue
        out.append(
            KernelRow(
                "flash_attention",
                "bf16",
                r["queries"],
                r["keys"],
                r["head_dim"],
                r["batch"] * r["heads"],
                round(r["ms"] * 1000.0, 3),
                r["direction"],
                name=f"cuDNN SDPA {r['model']} causal: batch {r['batch']}, {r['heads']} heads "
                f"({r['kv_heads']} key/value), head dim {r['head_dim']}",
            )
        )
    return sorted(out, key=lambda k: (k.direction, k.k, k.m))


def main() -> None:
    data = json.loads(MEASUREMENTS.read_text())
    for gpu, (name, model, cudnn, where) in GPUS.items():
        kernels = rows_of(gpu, data["rows"])
        meta = TableMeta(
            name=name,
            gpu=name,
            description=f"Causal BF16 attention (cuDNN's fused SDPA) on one {model}, as NVIDIA publishes it in "
            "cudnn-frontend's sdpa_benchmark_training results; no GEMM, memory-bound or collective rows (the model "
            "prices those).",
            device={"model": model, "cuda": cudnn},
            date="2026-12-07",
            method="NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training (its own timer and repeats; milliseconds "
            "per call as its CSVs give them), converted by benchmarks/cudnn_sdpa_tables.py from "
            "docs/measurements/cudnn-sdpa-blackwell.json: causal rows (top_left mask) whose value head equals the "
            "query head, batch = samples x query heads.",
            sources=(
                SourceInfo(
                    rows="kernels (every row)",
                    source=f"NVIDIA/cudnn-frontend @{where}",
                    licence="MIT (Copyright (c) 2020 NVIDIA CORPORATION)",
                    url="https://github.com/NVIDIA/cudnn-frontend",
                ),
            ),
            covers=f"{len(kernels)} flash_attention rows (forward and backward; head dims "
            f"{', '.join(str(d) for d in sorted({k.k for k in kernels}))}; {min(k.m for k in kernels):,}-"
            f"{max(k.m for k in kernels):,} tokens). Attention outside them, FP8 attention (from the BF16 rows at the "
            "GPU file's FP8 / BF16 ratio) and every other kernel are the model's.",
        )
        path = write_table(SHIPPED_DIR / name, CostTable(meta, kernels, []))
        (path / "LICENSE.cudnn-frontend").write_text(LICENSE)
        print(f"{name}: {len(kernels)} rows -> {path}")


if __name__ == "__main__":
    main()
