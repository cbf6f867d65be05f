"""The measured step time of an MLPerf Training submission, as simulator/validation/mlperf.yaml states it.

For each result file of a submission's results folder (mlcommons/training_results_v5.x: <submitter>/results/<system>/
<benchmark>/result_*.txt): the config its launcher ran (the ``:::DLPAL`` line's last field, the DGXSYSTEM the launcher
takes from the config's file name), the interval at which the step time is logged, and the median of its MLLOG
``tracked_stats.train_step_time`` (NeMo's DeltaTimingCallback: the host wall time between consecutive training batch
ends) over steps 10 and later, the first entry logged after each ``eval_stop`` left out. The submission's step time
is the median of those medians.

Run: python benchmarks/mlperf_step_time.py REPO RESULTS_DIR [RESULTS_DIR ...]
  REPO: a clone of mlcommons/training_results_v5.0 or v5.1 (or its bare git directory); RESULTS_DIR relative to it.
Prints one line per folder; not a test (the repositories are not shipped).
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

DLPAL = re.compile(r":::DLPAL \S+ \d+ \d+ \S+ '[^']*' (\S+)")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def file_step_time(text: str) -> tuple[str | None, float | None, int | None]:
    """(config named by the launcher, median step time in seconds, logging interval in steps) of one result file."""
    config = DLPAL.search(text)
    entries, eval_stops = [], []
    for line in text.splitlines():
        at = line.find(":::MLLOG ")
        if at < 0:
            continue
        try:
            event = json.loads(line[at + len(":::MLLOG ") :])
        except json.JSONDecodeError:
            continue
        if event.get("key") == "eval_stop":
            eval_stops.append(event["time_ms"])
        value = event.get("value")
        if event.get("key") == "tracked_stats" and isinstance(value, dict) and "train_step_time" in value:
            entries.append((event["time_ms"], event["metadata"].get("step", 0), value["train_step_time"]))
    after_eval = {
        min(e for e in entries if e[0] > t)[0] for t in eval_stops if any(e[0] > t for e in entries)
    }
    times = [v for t, step, v in entries if step >= 10 and t not in after_eval]
    steps = sorted({step for _, step, _ in entries})
    gaps = [int(b - a) for a, b in zip(steps, steps[1:], strict=False) if b > a]
    return (
        config.group(1) if config else None,
        statistics.median(times) if times else None,
        statistics.mode(gaps) if gaps else None,
    )


def main(repo: Path, folders: list[str]) -> None:
    names = _git(repo, "ls-tree", "-r", "--name-only", "HEAD").splitlines()
    for folder in folders:
        files = sorted(n for n in names if n.startswith(folder.rstrip("/") + "/result_"))
        rows = [file_step_time(_git(repo, "show", f"HEAD:{f}")) for f in files]
        medians = [m for _, m, _ in rows if m is not None]
        configs = sorted({c for c, _, _ in rows if c})
        every = sorted({g for _, _, g in rows if g})
        step = f"{statistics.median(medians):.4f} s" if medians else "no step times"
        print(
            f"{folder}: {step} over {len(medians)} of {len(files)} result files; config {configs}; logged every {every}"
        )


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2:])
