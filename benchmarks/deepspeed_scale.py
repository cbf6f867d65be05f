"""Where the DeepSpeed runs at scale lose time the simulator does not: simulated vs published, decomposed.

Runs the cases of simulator/validation/deepspeed.yaml and prints, for each, the published and simulated iteration
time and the time the simulation is missing (published - simulated). Two decompositions follow, each on data
the sources give rather than on a fitted factor:

- ZeRO-3 (DeepSpeed's Azure runs): the missing time per model parameter and per ZeRO-3 byte (the per-GPU
  all-gather and reduce-scatter traffic of one iteration), beside the simulated collective time. A cost that
  grows with the parameter count at a fixed number of tokens per GPU is a cost per parameter, not per FLOP.
- MT-NLG 530B on 280, 350 and 420 nodes (one batch of 1,920, so 240, 192 and 160 micro-batches per pipeline):
  a least-squares fit of  iteration time = a x (micro-batches + stages - 1) + F  to the published and to the
  simulated times separates a time per pipeline step (a) from a time per iteration (F).

Run: python benchmarks/deepspeed_scale.py        (about 10 s; Markdown, used in docs/deepspeed.md)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simulator import load_scenario, simulate
from simulator.validation.runner import case_scenario, load_cases

CASES = Path(__file__).resolve().parents[1] / "simulator" / "validation" / "deepspeed.yaml"


def run(case: dict):
    return simulate(load_scenario(case_scenario(case)))


def main() -> None:
    rows = []
    for case in load_cases(CASES):
        r = run(case)
        m = r.metrics
        published = float(case["published"]["value"])
        simulated = m.tflops_per_gpu_narayanan_eq3
        t_sim = m.iteration_time_s
        t_pub = t_sim * simulated / published  # the same FLOPs per GPU at the published rate
        rows.append((case, r, published, simulated, t_sim, t_pub))

    print(
        "| case | tokens / GPU / iteration | published TFLOP/s | simulated | error | published s | simulated s | missing s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for case, r, pub, sim, t_sim, t_pub in rows:
        s = r.scenario
        tokens = s.training.global_batch_size * s.model.seq_length // (s.parallelism.data_parallel or 1)
        print(
            f"| {case['id']} | {tokens:,} | {pub:.1f} | {sim:.1f} | {100 * (sim / pub - 1):+.1f}% | "
            f"{t_pub:.1f} | {t_sim:.1f} | {t_pub - t_sim:.1f} |"
        )

    print("\nZeRO-3: the missing time per parameter and per byte of ZeRO-3 traffic")
    print(
        "\n| case | parameters | missing ps / parameter | ZeRO-3 GB sent / GPU | missing ps / byte |"
        " simulated all-gather + reduce-scatter s (exposed) | error if they took 2x, none hidden |"
    )
    print("|---|---|---|---|---|---|---|")
    for case, r, _, _, t_sim, t_pub in rows:
        if case["parallelism"].get("zero_stage") != 3:
            continue
        comm = r.metrics.comm_by_collective
        zero3 = [comm[k] for k in ("all_gather:dp", "reduce_scatter:dp") if k in comm]
        sent = sum(c["bytes_sent_per_gpu"] for c in zero3)
        busy = sum(c["time_s"] for c in zero3)
        exposed = sum(c["exposed_s"] for c in zero3)
        params = r.workload.total_params
        missing = t_pub - t_sim
        print(
            f"| {case['id']} | {params / 1e9:,.0f}B | {1e12 * missing / params:.0f} | {sent / 1e9:,.0f} | "
            f"{1e12 * missing / sent:.1f} | {busy:.1f} ({exposed:.1f}) | "
            f"{100 * (t_pub / (t_sim + 2 * busy - exposed) - 1):+.1f}% |"
        )

    mtnlg = [row for row in rows if row[0]["id"].startswith("DS-MTNLG-530B")]
    if len(mtnlg) >= 2:
        steps, pub, sim = [], [], []
        for _, r, _, _, t_sim, t_pub in mtnlg:
            s = r.scenario
            steps.append(s.gradient_accumulation_steps + s.parallelism.pipeline_parallel - 1)
            pub.append(t_pub)
            sim.append(t_sim)
        design = np.column_stack([steps, np.ones(len(steps))])
        (a_pub, f_pub), *_ = np.linalg.lstsq(design, np.array(pub), rcond=None)
        (a_sim, f_sim), *_ = np.linalg.lstsq(design, np.array(sim), rcond=None)
        print(
            "\nMT-NLG 530B, iteration time = a x (micro-batches + stages - 1) + F, least squares over "
            f"{len(steps)} node counts"
        )
        print("\n| | a, s per pipeline step | F, s per iteration |")
        print("|---|---|---|")
        print(f"| published | {a_pub:.3f} | {f_pub:.2f} |")
        print(f"| simulated | {a_sim:.3f} | {f_sim:.2f} |")


if __name__ == "__main__":
    main()
