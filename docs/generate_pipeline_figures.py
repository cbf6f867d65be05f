"""Make docs/pipelines.md's figures and table: every schedule at p = 4, m = 8, simulated.

Run: python docs/generate_pipeline_figures.py   (needs Chromium for PNG export: apt-get install chromium)
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from simulator import load_scenario, simulate
from simulator.hardware.cluster import Cluster
from simulator.hardware.topology import cluster_spec, ideal_network
from simulator.report.figures import timeline_figure
from simulator.workload.block import Block
from simulator.workload.transformer import build_workload

OUT = Path(__file__).parent / "images"
MODEL = {
    "num_layers": 16,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "seq_length": 2048,
    "vocab_size": 51200,
    "attention": "flash",
}
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1)]


def scenario(schedule: str, v: int, m: int = 8, p: int = 4):
    return load_scenario(
        {
            "name": f"{schedule} p={p} m={m}" + (f" v={v}" if v > 1 else ""),
            "framework": "ideal",  # the closed forms assume no host cost
            "model": MODEL,
            "cluster": {"topology": "dgx-a100", "num_nodes": 1, "gpus_per_node": p},
            "training": {"global_batch_size": m, "micro_batch_size": 1, "precision": "bf16"},
            "parallelism": {
                "pipeline_parallel": p,
                "pipeline_schedule": schedule,
                "virtual_pipeline_stages": v,
            },
        }
    )


def ideal(s):
    """Free communication and equal stages: the setting of the closed-form bubble formulas."""
    cluster = Cluster(ideal_network(cluster_spec(s)), 1)
    empty = Block("none", (), (), (), 0)
    w = build_workload(s)
    return cluster, replace(w, embedding=replace(empty, name="embedding"), head=replace(empty, name="head"))


def main() -> None:
    OUT.mkdir(exist_ok=True)
    print(
        "| schedule | p | m | v | formula | simulated (free comm., equal stages) | simulated (NVLink, with embedding and loss) | iteration time |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for schedule, v in SCHEDULES:
        for m in (8, 32):
            s = scenario(schedule, v, m)
            cluster, w = ideal(s)
            free = simulate(s, cluster=cluster, workload=w).metrics
            real = simulate(s)
            formula = 3 / (v * m + 3)
            shown = f"{formula:.3f}" if schedule != "zb-h1" else f"< {formula:.3f} (1F1B)"
            print(
                f"| {schedule} | 4 | {m} | {v} | {shown} | {free.bubble_fraction:.3f} | "
                f"{real.metrics.bubble_fraction:.3f} | {real.metrics.iteration_time_s * 1e3:.1f} ms |"
            )
            if m == 8:
                fig = timeline_figure(
                    real.timeline,
                    f"{s.name}: bubble {real.metrics.bubble_fraction:.1%}, "
                    f"iteration {real.metrics.iteration_time_s * 1e3:.1f} ms",
                )
                fig.write_image(
                    OUT / f"pipeline-{schedule}.png", width=1400, height=fig.layout.height, scale=1
                )


if __name__ == "__main__":
    main()
