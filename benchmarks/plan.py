"""Planner speed and choices: candidates screened per second and the confirmed best layouts.

    python benchmarks/plan.py

GPT-3 175B on 1,024 A100 (batch 1,536) and the 1T model on 3,072 A100 (batch 3,072), the two setups Narayanan et
al. (SC21) report; prints the screening rate, the wall time and the best layouts with their simulated times. Then
DeepSeek-V3 (61 layers, 256 experts) on 2,048 H100 (issue 29: one simulation under 2 s, MoE layouts screened at
1,000 or more per second): the shipped scenario's layout simulated, and a plan over TP, CP, PP, DP, EP and ETP.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from bench_scale import timed

from simulator import load_scenario
from simulator.study.plan import accuracy_line, plan

ROOT = Path(__file__).resolve().parents[1]

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
            f"{r['screened_per_s']:,.0f}/s (target 10,000/s; {r['zero3_replay_s']:.3f} s of it replaying ZeRO-3's "
            f"coordinator), {r['confirmed']} simulated, {wall:.1f} s in all (target under 10 s)"
        )
        show(r)
        print(f"  {r['why']}\n")


def show(r: dict) -> None:
    """The confirmed layouts, estimate beside simulation, and how close the screen came over them."""
    for t in r["top"]:
        sim = f"{t['iteration_time_s']:.2f} s, MFU {t['mfu']:.1%}" if t["status"] == "ok" else t["status"]
        print(f"  {t['layout']:40s} estimate {t['estimate_s']:.2f} s; simulated {sim}")
    print(f"  {accuracy_line(r['screen_accuracy'])}")


def deepseek_v3() -> None:
    data = yaml.safe_load((ROOT / "scenarios/moe/deepseek-v3-ep64-1024xh100.yaml").read_text())
    data["cluster"]["num_nodes"] = 256  # 2,048 H100, the batch doubled with the data-parallel ranks
    data["training"]["global_batch_size"] *= 2
    s = load_scenario(data)
    m, walls = timed(s)
    print(
        f"deepseek-v3 on 2,048 H100 (TP2 PP16 EP64): {m.iteration_time_s:.2f} s per iteration simulated in "
        f"{walls[0]:.2f} s (first), {min(walls):.2f} s (best of 3); target under 2 s"
    )
    t0 = time.perf_counter()
    r = plan(s, 2048, top=3)
    wall = time.perf_counter() - t0
    print(
        f"deepseek-v3 plan on 2,048 H100: {r['screened']} layouts screened at {r['screened_per_s']:,.0f}/s "
        f"(target 1,000/s), {r['confirmed']} simulated, {wall:.1f} s in all"
    )
    show(r)


if __name__ == "__main__":
    main()
    deepseek_v3()
