"""What-if sweeps: a base scenario, some of its fields varied over values (``grid.py``), every point simulated
once, the results written as files (``results.py``).

A point is the base scenario with each varied field set (the cartesian product of the values, or the values
paired in order with ``zip``). Points are resolved (validated, defaults filled) in the calling process and keyed
by a hash of the resolved scenario: a re-run skips every key already in ``DIR/points.jsonl``, and two spellings of
one scenario share a row. A point that does not resolve (sizes that do not divide, an unknown name) or does not
fit in memory is a row with its status and reason, not an error; a varied field that is not a scenario field is
an error before any point runs (:func:`check_field`).

Points run on a local process pool, inline (one worker), or on a Dask cluster; each finished point is appended to
``DIR/points.jsonl`` at once, so an interrupted sweep keeps everything it finished. ``DIR/results.csv`` and
``DIR/results.parquet`` (with pyarrow) hold the current grid, one row per point: the varied fields, ``status``,
``reason``, ``key`` and every metric of ``clustersim run --json`` (nested ones as dotted columns, lists as JSON).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.errors import ScenarioError
from simulator.study.grid import Sweep, assign
from simulator.study.results import flatten, write_results

STATUSES = ("ok", "oom", "invalid", "error")


def scenario_key(scenario) -> str:
    """Hash of the resolved scenario (every field, defaults included), its name left out."""
    dump = scenario.model_dump(mode="json", exclude={"name"})
    return hashlib.sha256(json.dumps(dump, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _unresolved_key(data: dict) -> str:
    data = {k: v for k, v in data.items() if k != "name"}
    return "x" + hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:19]


@dataclass
class Point:
    index: int
    assignment: dict[str, Any]
    key: str
    scenario: Any = None  # the resolved Scenario, or None when invalid
    reason: str = ""


def resolve(sweep: Sweep) -> list[Point]:
    """Every point of the grid, resolved here (cheap): a Scenario and its key, or the reason it is invalid."""
    from simulator.scenario.loader import load_scenario

    points = []
    for i, assignment in enumerate(sweep.assignments()):
        data = assign(sweep.base, assignment)
        try:
            s = load_scenario(data, base_dir=sweep.base_dir)
        except ScenarioError as e:
            points.append(Point(i, assignment, _unresolved_key(data), None, str(e)))
            continue
        points.append(Point(i, assignment, scenario_key(s), s))
    return points


def simulate_point(scenario) -> dict:
    """Simulate one resolved scenario (in a worker process): status, reason and the metrics of ``run --json``."""
    from simulator.api import simulate

    try:
        m = simulate(scenario).metrics
    except ScenarioError as e:
        return {"status": "invalid", "reason": str(e)}
    except Exception as e:  # a bug hit by one point must not stop the sweep: the row says what happened
        return {"status": "error", "reason": f"internal error: {type(e).__name__}: {e}"}
    metrics = m.to_dict()
    if m.oom:
        reason = f"out of memory: simulated peak {m.memory_gib['peak']:.1f} GiB > {m.memory_gib['capacity']:.0f} GiB"
        return {"status": "oom", "reason": reason, "metrics": metrics}
    return {"status": "ok", "reason": "", "metrics": metrics}


@dataclass
class Outcome:
    points: int
    ran: int = 0
    skipped: int = 0
    failed: int = 0  # invalid or error
    oom: int = 0
    interrupted: bool = False
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "points": self.points,
            "ran": self.ran,
            "skipped": self.skipped,
            "failed": self.failed,
            "oom": self.oom,
            "interrupted": self.interrupted,
            "files": self.files,
        }


def read_done(out: Path) -> dict[str, dict]:
    """Records already in ``points.jsonl`` by key (a line cut short by an interruption is ignored)."""
    path = out / "points.jsonl"
    done: dict[str, dict] = {}
    if not path.is_file():
        return done
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "key" in rec:
            done[rec["key"]] = rec
    return done


def run_sweep(
    sweep: Sweep,
    out: Path,
    workers: int | None = None,
    dask: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Outcome, list[dict]]:
    """Simulate every point not yet in ``out`` and write the results; returns the outcome and the rows."""
    out.mkdir(parents=True, exist_ok=True)
    points = resolve(sweep)
    done = read_done(out)
    outcome = Outcome(points=len(points))
    pending: list[Point] = []
    for p in points:
        if p.key in done:
            outcome.skipped += 1
        elif p.scenario is None:  # invalid: its row needs no simulation
            done[p.key] = _record(p, {"status": "invalid", "reason": p.reason})
            _append(out, done[p.key])
            outcome.ran += 1
        else:
            pending.append(p)
    total = len(pending)
    finished = 0
    if progress:
        progress(0, total)
    try:
        for p, result in _execute(pending, workers, dask):
            done[p.key] = _record(p, result)
            _append(out, done[p.key])
            outcome.ran += 1
            finished += 1
            if progress:
                progress(finished, total)
    except KeyboardInterrupt:
        outcome.interrupted = True
    rows = [_row(sweep, p, done[p.key]) for p in points if p.key in done]
    outcome.failed = sum(r["status"] in ("invalid", "error") for r in rows)
    outcome.oom = sum(r["status"] == "oom" for r in rows)
    outcome.files = write_results(rows, out)
    return outcome, rows


def _record(p: Point, result: dict) -> dict:
    return {"key": p.key, "assignment": p.assignment, **result}


def _append(out: Path, record: dict) -> None:
    with open(out / "points.jsonl", "a") as f:
        f.write(json.dumps(record, default=str) + "\n")
        f.flush()


def _row(sweep: Sweep, p: Point, record: dict) -> dict:
    row: dict[str, Any] = dict(p.assignment)
    row.update(status=record["status"], reason=record.get("reason", ""), key=p.key)
    if p.scenario is not None:
        row["name"] = p.scenario.name
    row.update(flatten(record.get("metrics") or {}))
    return row


def _execute(pending: list[Point], workers: int | None, dask: str | None):
    """(point, result) as each finishes: inline, on a local process pool, or on Dask."""
    if not pending:
        return
    if dask:
        yield from _on_dask(pending, workers, dask)
        return
    n = workers or os.cpu_count() or 1
    if n <= 1 or len(pending) == 1:
        for p in pending:
            yield p, simulate_point(p.scenario)
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(max_workers=min(n, len(pending)))
    try:
        futures = {pool.submit(simulate_point, p.scenario): p for p in pending}
        for f in as_completed(futures):
            yield futures[f], f.result()
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _on_dask(pending: list[Point], workers: int | None, address: str):
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise ScenarioError(
            "--dask needs Dask distributed: pip install 'clustersim[sweep]' (or dask[distributed])"
        ) from None
    cluster = None
    if address == "local":
        cluster = LocalCluster(
            n_workers=workers or os.cpu_count() or 1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
        )
        client = Client(cluster)
    else:
        try:
            client = Client(address, timeout="10s")
        except Exception as e:  # OSError, TimeoutError, ValueError for a malformed address
            raise ScenarioError(f"--dask {address}: cannot reach the scheduler: {e}") from None
    try:
        futures = client.map(simulate_point, [p.scenario for p in pending], pure=False)
        index = {f.key: p for f, p in zip(futures, pending, strict=True)}
        for f in as_completed(futures):
            yield index[f.key], f.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
