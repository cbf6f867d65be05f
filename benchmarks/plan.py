"""Planner speed and choices: candidates screened per second and the confirmed best layouts.

    python benchmarks/plan.py

GPT-3 175B on 1,024 A100 (batch 1,536) and the 1T model on 3,072 A100 (batch 3,072), the two setups Narayanan et
al. (SC21) report; prints the screening rate, the wall time and the best layouts with their simulated times.
"""

from __future__ import annotations

import time

from simulator import load_scenario
from simulator.study.plan import plan

CASES = [
    ("gpt3-175b", 1024, 1536, {"num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96}),
    ("megatron-1t", 3072, 3072, {"num_layers": 128, "hidden_size": 25600, "num_attention_heads": 160}),
]


def main() -> None:
    for name, gpus, batch, shape in CASES:
        base = load_scenario(
            {
                "name": name,
                "model": {**shape, "seq_length": 2048, "vocab_size": 51200, "attention": "flash"},
                "cluster": {"topology": "dgx-a100", "num_nodes": gpus // 8},
                "training": {"global_batch_size": gpus, "micro_batch_size": 1, "precision": "bf16"},
            }
        )
        t0 = time.perf_counter()
        r = plan(base, gpus, top=5, batch=batch)
        wall = time.perf_counter() - t0
        print(
            f"{name} on {gpus} A100, batch {batch}: {r['screened']} layouts screened at "
            f"{r['screened_per_s']:,.0f}/s, {r['confirmed']} simulated, {wall:.1f} s in all"
        )
        for t in r["top"]:
            sim = f"{t['iteration_time_s']:.2f} s, MFU {t['mfu']:.1%}" if t["status"] == "ok" else t["status"]
            print(f"  {t['layout']:40s} estimate {t['estimate_s']:.2f} s; simulated {sim}")
        print(f"  {r['why']}\n")


if __name__ == "__main__":
    main()
