"""Issue 62's acceptance on the shipped problems: does ``plan --model`` find a layout at least as fast as
``plan --scenario`` from the shipped scenario and as the scenario's own hand layout, and does ``run`` of the
written pick agree with the plan within 1%?

For each problem (Llama 3 70B on 256 H100, Mixtral 8x7B on 16 H100, DeepSeek-V3 on 1,024 H100, GPT-3 175B on 384
A100) it runs, as a user would, through the command line:
  clustersim run SCENARIO --json                                        the hand layout
  clustersim plan --scenario SCENARIO --json --write-scenario DIR       the plan from the scenario's switches
  clustersim plan --model M --gpus N --topology T --global-batch-size B [--seq S] [--precision P] --json
                  --write-scenario DIR                                  the plan from the model alone
  clustersim run DIR/01-*.yaml --json                                   the written pick, run
and prints the times side by side.

Run: python benchmarks/plan_problems.py            (several minutes on 2 cores; Markdown)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = [
    "scenarios/llama3-70b-fsdp2-tp8-256xh100.yaml",
    "scenarios/moe/mixtral-8x7b-ep8-16xh100.yaml",
    "scenarios/moe/deepseek-v3-ep64-1024xh100.yaml",
    "scenarios/gpt3-175b-megatron-deepspeed-3d-384xa100.yaml",
]


def cli(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "simulator", *args, "--json"], capture_output=True, text=True, cwd=ROOT
    )
    if out.returncode:
        raise SystemExit(f"clustersim {' '.join(args)}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def iteration_s(result: dict) -> float:
    return result["metrics"]["iteration_time_s"] if "metrics" in result else result["iteration_time_s"]


def best(planned: dict) -> dict:
    return min((t for t in planned["top"] if t["status"] == "ok"), key=lambda t: t["iteration_time_s"])


def model_args(path: Path) -> list[str]:
    """``plan --model`` arguments for the scenario's model, cluster and batch."""
    data = yaml.safe_load(path.read_text())
    model, cluster, training = data["model"], data["cluster"], data["training"]
    preset = model if isinstance(model, str) else model["preset"]
    topo = yaml.safe_load((ROOT / "topologies" / f"{cluster['topology']}.yaml").read_text())
    gpn = cluster.get("gpus_per_node") or topo["node"]["gpus"]
    args = ["--model", preset, "--gpus", str(cluster["num_nodes"] * gpn), "--topology", cluster["topology"]]
    args += ["--global-batch-size", str(training["global_batch_size"])]
    if isinstance(model, dict) and "seq_length" in model:
        args += ["--seq", str(model["seq_length"])]
    if training.get("precision", "bf16") != "bf16":
        args += ["--precision", training["precision"]]
    return args


def main() -> None:
    print(
        "| problem | hand layout s | plan --scenario pick s | plan --model pick s | run of the written pick s | pick |"
    )
    print("|---|---|---|---|---|---|")
    for rel in PROBLEMS:
        path = ROOT / rel
        hand = iteration_s(cli("run", str(path)))
        with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
            from_scenario = best(cli("plan", "--scenario", str(path), "--quiet", "--write-scenario", d1))
            from_model = cli("plan", *model_args(path), "--quiet", "--write-scenario", d2)
            pick = best(from_model)
            written = sorted(Path(d2).glob("*.yaml"))
            ran = next(
                (iteration_s(cli("run", str(f))) for f in written if f.read_text().find(pick["layout"]) >= 0),
                float("nan"),
            )
        print(
            f"| {path.stem} | {hand:.2f} | {from_scenario['iteration_time_s']:.2f} | {pick['iteration_time_s']:.2f} | "
            f"{ran:.2f} ({100 * (ran / pick['iteration_time_s'] - 1):+.1f}%) | {pick['layout']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
