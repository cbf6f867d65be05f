"""Simulator speed at scale (issue 33's targets beside each line): the process's start-up and a whole
`clustersim run quickstart --json`; simulated iteration time, event count and wall time per shipped scenario; GPT-3
175B (TP 8, PP 8 x 3) at 16,384, 65,536 and 131,072 GPUs; the 1T run at 1x, 16x and 64x its micro-batches,
extrapolated from short runs (the default) and replayed in full (``periodic=False``); each with the Python heap's
peak (tracemalloc, a separate pass).

Run: python benchmarks/bench_scale.py   (prints tables: the first run's wall time, caches cold, and the best
of 3; not a test)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from simulator import load_scenario, simulate
from simulator.api import with_microbatches

ROOT = Path(__file__).resolve().parents[1]
PYCACHE = tempfile.mkdtemp(prefix="clustersim-pycache-")
CASES = [
    "scenarios/gpt3-175b-zero3-384xa100.yaml",
    "scenarios/gpt3-175b-zero3-1536xa100.yaml",
    "scenarios/llama2-7b-fsdp2-512xh100.yaml",
    "scenarios/published/nar21-t1-1t.yaml",
    "scenarios/published/kor22-530b-sp-selective.yaml",
    "scenarios/llama3-405b-4d-cp1-8192xh100.yaml",
    "scenarios/llama3-405b-4d-cp1-16384xh100.yaml",
    "scenarios/llama3-405b-4d-cp16-16384xh100.yaml",
]


def timed(s, runs: int = 3):
    """``s`` simulated ``runs`` times: the metrics and each run's wall seconds (the first with caches cold)."""
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        m = simulate(s).metrics
        walls.append(time.perf_counter() - t0)
    return m, walls


def main(paths: list[str]) -> None:
    print(
        f"{'scenario':32s} {'GPUs':>6s} {'sim. iteration':>15s} {'ranks':>6s} {'tasks':>9s} {'SimPy ev.':>9s}"
        f" {'wall: first':>12s} {'best of 3':>10s}"
    )
    for rel in paths:
        s = load_scenario(ROOT / rel)
        m, walls = timed(s)
        print(
            f"{s.name:32s} {m.gpus:6d} {m.iteration_time_s:13.3f} s {m.ranks_simulated:6,d} {m.tasks:9,d}"
            f" {m.events:9,d} {walls[0]:10.3f} s"
            f" {min(walls):8.3f} s"
        )


def microbatch_scaling(rel: str = "scenarios/published/nar21-t1-1t.yaml") -> None:
    base = load_scenario(ROOT / rel)
    m0 = base.gradient_accumulation_steps
    print(
        f"\n{base.name} at 1x / 16x / 64x its {m0} micro-batches per pipeline (flat with the periodic replay)"
    )
    print(
        f"{'micro-batches':>13s} {'mode':>9s} {'sim. iteration':>15s} {'tasks':>9s} {'wall: first':>12s}"
        f" {'best of 3':>10s} {'heap peak':>10s}"
    )
    for factor in (1, 16, 64):
        s = with_microbatches(base, m0 * factor)
        for periodic in (True, False):
            walls = []
            if not periodic and factor == 64:
                continue  # 2^20 stage-steps: refused without --exact (and minutes long)
            for _ in range(3 if periodic or factor == 1 else 1):
                t0 = time.perf_counter()
                m = simulate(s, periodic=periodic).metrics
                walls.append(time.perf_counter() - t0)
            tracemalloc.start()
            simulate(s, periodic=periodic)
            heap = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            mode = "periodic" if m.periodic else "every"
            print(
                f"{m0 * factor:13,d} {mode:>9s} {m.iteration_time_s:13.3f} s {m.tasks:9,d} {walls[0]:10.3f} s"
                f" {min(walls):8.3f} s {heap / 2**20:7.1f} MiB"
            )


def _env(cache: str | None = None) -> dict[str, str]:
    """Python's bytecode caches as an installed package has them (pip compiles them at install; a
    PYTHONDONTWRITEBYTECODE environment would otherwise time the compiler): the caches go to a temporary
    prefix, warmed by a first run. What clustersim keeps between runs (parsed tables, routes inside a node:
    ``paths.cache_root``) goes to ``cache``, a temporary directory of its own by default."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = PYCACHE
    env["CLUSTERSIM_CACHE"] = cache or CACHE
    return env


CACHE = tempfile.mkdtemp(prefix="clustersim-cache-")


def best_of(command: list[str], runs: int = 5, fresh: bool = False) -> float:
    """The shortest wall time of ``runs`` runs of ``command``, a fresh process each (after a warming run);
    ``fresh``: each run with nothing kept from an earlier one (the cost tables parsed, the routes read from the
    shipped files or found), as a new user's first command is."""
    subprocess.run(command, check=True, capture_output=True, cwd=ROOT, env=_env())
    walls = []
    for _ in range(runs):
        cache = tempfile.mkdtemp(prefix="clustersim-cache-") if fresh else None
        t0 = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT, env=_env(cache))
        walls.append(time.perf_counter() - t0)
    return min(walls)


def import_time(modules: str, runs: int = 5) -> float:
    """The shortest time ``import modules`` takes in a fresh process (after a warming run), timed inside it:
    the start-up before a command runs, without the interpreter's own start and exit."""
    env = _env()
    code = f"import time; t = time.perf_counter(); import {modules}; print(time.perf_counter() - t)"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, cwd=ROOT, env=env)
    return min(
        float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                             cwd=ROOT, env=env).stdout)
        for _ in range(runs)
    )  # fmt: skip


# What the core dependencies the package imports at start-up cost alone: the floor under its start-up (networkx
# is imported where a graph is built or searched, hardware/cluster.py; rich where something is drawn; simpy at the
# first simulation, engine/engine.py)
DEPENDENCIES = "numpy, pydantic, yaml, typer"


def startup() -> None:
    python = sys.executable
    bare = best_of([python, "-c", "pass"])
    floor = import_time(DEPENDENCIES)
    imports = import_time("simulator.cli")
    simulator = import_time("simulator.api, simulator.scenario.loader")
    help_ = best_of([python, "-m", "simulator", "--help"])
    quickstart = [python, "-m", "simulator", "run", "quickstart", "--json"]
    whole, first = best_of(quickstart), best_of(quickstart, fresh=True)
    print(
        f"start-up: clustersim --help, whole process: {help_:.3f} s (target 0.15 s); the command line imports in "
        f"{imports:.3f} s (the simulator comes with the command that runs: {simulator:.3f} s, of which the core "
        f"dependencies alone, numpy, pydantic, pyyaml, typer, {floor:.3f} s); Python itself starts and exits in "
        f"{bare:.3f} s"
    )
    print(
        f"clustersim run quickstart --json, whole process: {whole:.3f} s (target 0.25 s); {first:.3f} s with nothing"
        f" cached yet (the cost table parsed, the node's routes read from the shipped files: hardware/route_cache.py)"
    )


def gpt3_175b(gpus: int):
    return load_scenario(gpt3_175b_data(gpus))


def gpt3_175b_data(gpus: int) -> dict:
    """GPT-3 175B, TP 8, PP 8 x 3, sequence parallel with selective recompute, 16 micro-batches a pipeline."""
    return (
        {
            "name": f"gpt3-175b-{gpus}",
            "framework": "megatron-2022",
            "model": {"num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96, "seq_length": 2048,
                      "vocab_size": 51200},
            "cluster": {"topology": "dgx-a100", "num_nodes": gpus // 8},
            "training": {"global_batch_size": gpus // 64 * 16, "micro_batch_size": 1, "precision": "fp16",
                         "activation_recompute": "selective"},
            "parallelism": {"tensor_parallel": 8, "pipeline_parallel": 8, "pipeline_schedule": "interleaved-1f1b",
                            "virtual_pipeline_stages": 3, "sequence_parallel": True},
        }
    )  # fmt: skip


def scale_175b() -> None:
    print("\nGPT-3 175B, TP 8, PP 8 x 3, 16 micro-batches per pipeline, as the GPU count grows")
    print(
        f"{'GPUs':>8s} {'sim. iteration':>15s} {'wall: first':>12s} {'best of 3':>10s} {'heap peak':>10s} target"
    )
    for gpus, target in ((16_384, 0.15), (65_536, None), (131_072, 0.3)):
        s = gpt3_175b(gpus)
        m, walls = timed(s)
        tracemalloc.start()
        simulate(s)
        heap = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        goal = f"{target:.2f} s" if target else ""
        print(
            f"{gpus:8,d} {m.iteration_time_s:13.3f} s {walls[0]:10.3f} s {min(walls):8.3f} s"
            f" {heap / 2**20:7.2f} MiB {goal}"
        )


if __name__ == "__main__":
    if not sys.argv[1:]:
        startup()
    main(sys.argv[1:] or CASES)
    if not sys.argv[1:]:
        scale_175b()
        microbatch_scaling()
