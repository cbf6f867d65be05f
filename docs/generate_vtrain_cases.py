"""Build simulator/validation/vtrain-8gpu.yaml from vTrain's public single-node measurements.

    python docs/generate_vtrain_cases.py --csv PATH/TO/vTrain/data/ground_truth_single.csv

vTrain (Bang et al., MICRO 2024; https://github.com/VIA-Research/vTrain, MIT licence) measured 1,440 iterations of
Megatron-DeepSpeed training small GPT models on one A100 node. ../shared/validation/measured-a100-small.yaml holds
the 720 runs on 2 and 4 GPUs (the megatron-2022 profile is fitted on them); this script writes the other 720, on
all 8 GPUs of the node, as a held-out cases file, the settings the CSV leaves open taken as in that file (the
GPT-2 vocabulary, fp16, full activation recompute, 1F1B, a DGX A100 node).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[1] / "simulator" / "validation" / "vtrain-8gpu.yaml"

HEADER = """\
# Measured iteration times of Megatron-DeepSpeed (fp16, full activation recompute, 1F1B) training small GPT models
# on all 8 A100-SXM4-80GB GPUs of one DGX A100 node: vTrain (Bang et al., MICRO 2024), VIA-Research/vTrain
# data/ground_truth_single.csv at f8dda847, MIT license (Copyright (c) 2024, VIA Research Group at KAIST). 720 runs:
# hidden 1024 / 2048, 16 heads, 12-24 layers, seq 1024, micro-batch 1-8, TP 1-8, PP 1-4, DP 1-8.
#
# HELD OUT: the same software and node as ../shared/validation/measured-a100-small.yaml (the CSV's 2- and 4-GPU
# rows, on which megatron-2022 is fitted), never fitted on; they measure how that fit carries to a full node (TP 8,
# DP 8). Not in the gated suite. Written by docs/generate_vtrain_cases.py.
# Run: clustersim validate --cases simulator/validation/vtrain-8gpu.yaml
"""


def cases(path: Path) -> list[dict]:
    out = []
    with path.open(encoding="utf-8-sig") as f:
        for row_number, row in enumerate(csv.DictReader(f)):
            if int(row["# GPUs"]) != 8:
                continue
            n = {k: int(v) for k, v in row.items() if k != "iteration time (ms)"}
            out.append(
                {
                    "id": f"VTRAIN-8GPU-{len(out):03d}",
                    "framework": "megatron-2022",
                    "model": {
                        "num_layers": n["# layers"],
                        "hidden_size": n["hidden size"],
                        "num_attention_heads": n["attention heads"],
                        "seq_length": n["sequence length"],
                        "vocab_size": 50257,
                    },
                    "cluster": {"topology": "dgx-a100", "num_nodes": 1},
                    "training": {
                        "global_batch_size": n["global batch"],
                        "micro_batch_size": n["micro batch"],
                        "precision": "fp16",
                        "activation_recompute": "full",
                    },
                    "parallelism": {
                        "tensor_parallel": n["tensor parallelism"],
                        "pipeline_parallel": n["pipeline parallelism"],
                        "data_parallel": n["data parallelism"],
                        "pipeline_schedule": "1f1b",
                    },
                    "published": {
                        "metric": "iteration_time_s",
                        "value": round(
                            float(row["iteration time (ms)"]) / 1000, 9
                        ),  # the CSV has microseconds
                        "source": "vTrain (Bang et al., MICRO 2024; MIT license) data/ground_truth_single.csv "
                        f"row {row_number}",
                        "level": "V1",
                    },
                }
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, required=True, help="vTrain's data/ground_truth_single.csv")
    args = ap.parse_args()
    body = yaml.safe_dump({"cases": cases(args.csv)}, sort_keys=False, default_flow_style=None, width=200)
    OUT.write_text(HEADER + body)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
