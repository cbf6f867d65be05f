"""Warm ``simulate()`` here against an earlier commit (issue 64: "warm simulate() at 8-384 GPUs no slower than
17d8e4c"), and the periodic replay against replaying every micro-batch on every shipped scenario where the schedule
allows it (issue 64: "periodic <= full replay on every shipped scenario").

The earlier commit is checked out into a temporary git worktree and timed in its own process, one scenario after
the other, as this checkout is; each figure is the best of 7 calls after one warming call, in milliseconds.

Run: python benchmarks/warm_vs_commit.py [COMMIT]   (default 17d8e4c; prints tables; not a test)
     python benchmarks/warm_vs_commit.py --periodic   (the periodic replay's tables only)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [
    "scenarios/quickstart-gpt3-1.3b-ddp-8xa100.yaml",
    "scenarios/mds-2node-small-zero3.yaml",
    "scenarios/mds-2node-large-pipeline.yaml",
    "scenarios/llama3-8b-hsdp-64xh100.yaml",
    "scenarios/llama3-70b-fsdp2-tp8-256xh100.yaml",
    "scenarios/gpt3-175b-megatron-deepspeed-3d-384xa100.yaml",
    "scenarios/gpt3-175b-zero3-384xa100.yaml",
    "scenarios/published/kor22-530b-sp-selective.yaml",
]
# run inside each checkout: the best of 7 warm calls per scenario, as JSON {scenario: ms}
TIMER = """
import gc, json, sys, time
from simulator import load_scenario, simulate
out = {}
for rel in sys.argv[1:]:
    s = load_scenario(rel)
    simulate(s)
    walls = []
    for _ in range(7):
        gc.collect()
        t0 = time.perf_counter()
        simulate(s)
        walls.append(time.perf_counter() - t0)
    out[rel] = 1e3 * min(walls)
print(json.dumps(out))
"""


def timed(tree: Path) -> dict[str, float]:
    run = subprocess.run(
        [sys.executable, "-c", TIMER, *CASES],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(run.stdout.strip().splitlines()[-1])


def against(commit: str) -> None:
    with tempfile.TemporaryDirectory(prefix="clustersim-old-") as tmp:
        old = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "-f", "--detach", str(old), commit], cwd=ROOT, check=True,
                       capture_output=True)  # fmt: skip
        try:
            before, now = timed(old), timed(ROOT)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True)
    print(f"warm simulate(), best of 7 (ms): {commit} vs this checkout")
    print(f"{'scenario':58s} {commit:>9s} {'now':>9s} {'now/old':>8s}")
    for rel in CASES:
        print(f"{rel:58s} {before[rel]:9.1f} {now[rel]:9.1f} {now[rel] / before[rel]:8.2f}")


def best_of_3(s, periodic) -> tuple[float, object]:
    """The shortest of 3 ``simulate`` calls of ``s`` in milliseconds, and the metrics."""
    from simulator import simulate

    walls, m = [], None
    for _ in range(3):
        t0 = time.perf_counter()
        m = simulate(s, periodic=periodic).metrics
        walls.append(time.perf_counter() - t0)
    return 1e3 * min(walls), m


def periodic_vs_full() -> None:
    from simulator import load_scenario, simulate
    from simulator.scenario.shipped import shipped_scenarios

    print(
        "\nshipped scenarios the periodic replay can run (ms, best of 3): always, every micro-batch, the default"
    )
    print(
        f"{'scenario':45s} {'m':>5s} {'pp':>3s} {'periodic':>9s} {'full':>8s} {'default':>8s} {'default/full':>13s}"
    )
    for name, path in sorted(shipped_scenarios().items()):
        s = load_scenario(path)
        if simulate(s, periodic=True).metrics.periodic is None:
            continue
        (p, _), (f, _), (a, m) = best_of_3(s, True), best_of_3(s, False), best_of_3(s, "auto")
        mode = "periodic" if m.periodic else "full"
        print(
            f"{name:45s} {s.gradient_accumulation_steps:5d} {s.parallelism.pipeline_parallel:3d} {p:9.1f} {f:8.1f}"
            f" {a:8.1f} {a / f:8.2f} {mode}"
        )


# scenarios whose one-replay overhead replay_overhead measures
OVERHEAD_CASES = [
    "scenarios/gpt3-175b-megatron-deepspeed-3d-384xa100.yaml",
    "scenarios/moe/deepseek-v3-ep64-1024xh100.yaml",
    "scenarios/published/nar21-t1-1t.yaml",
    "scenarios/published/kor22-530b-sp-selective.yaml",
]


def replay_overhead() -> None:
    """What one replay costs beside its micro-batches (metrics/periodic.py REPLAY_COST_MICROBATCHES): every
    micro-batch replayed at p and 4p micro-batches (after a warming call), the wall time as a + b x m."""
    from simulator import load_scenario, simulate
    from simulator.api import with_microbatches

    def best(s) -> float:
        simulate(s, periodic=False)
        return best_of_3(s, False)[0] / 1e3

    print("\none replay's overhead: every micro-batch replayed at p and 4p micro-batches, wall = a + b x m")
    print(f"{'scenario':50s} {'p':>3s} {'b: ms/micro-batch':>18s} {'a: ms':>7s} {'a/b':>5s} {'a/(b/p)':>8s}")
    for rel in OVERHEAD_CASES:
        s = load_scenario(ROOT / rel)
        p = max(s.parallelism.pipeline_parallel, 2)
        t1, t4 = best(with_microbatches(s, p)), best(with_microbatches(s, 4 * p))
        b = (t4 - t1) / (3 * p)
        a = t1 - b * p
        print(f"{rel:50s} {p:3d} {1e3 * b:18.3f} {1e3 * a:7.1f} {a / b:5.0f} {a / b * p:8.0f}")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--periodic"]:
        against(sys.argv[1] if len(sys.argv) > 1 else "17d8e4c")
    replay_overhead()
    periodic_vs_full()
