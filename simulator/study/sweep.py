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
import logging
import os
import signal
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator import paths
from simulator.errors import ScenarioError
from simulator.scenario.files import read_bytes
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
    # lines of points.jsonl that were not records (their points run again)
    bad_records: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "points": self.points,
            "ran": self.ran,
            "skipped": self.skipped,
            "failed": self.failed,
            "oom": self.oom,
            "interrupted": self.interrupted,
            "files": self.files,
            "bad_records": self.bad_records,
        }


STATUSES = ("ok", "oom", "invalid", "error")
MAX_POINTS_BYTES = 1 << 30  # points.jsonl: a record is about 2 kB, so half a million points


def read_done(out: Path) -> tuple[dict[str, dict], list[str]]:
    """Records already in ``points.jsonl`` by key, and what was wrong with each line that is not one (a line
    cut short by an interruption, or a corrupted one: not UTF-8, not JSON, not a record this sweep wrote). Those
    points run again."""
    path = out / "points.jsonl"
    done: dict[str, dict] = {}
    bad: list[str] = []
    if not paths.exists(path, "--out"):
        return done, bad
    raw = read_bytes(path, limit=MAX_POINTS_BYTES)  # a regular file within the limit, one message otherwise
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        problem = None
        try:
            rec = json.loads(line.decode("utf-8"))
            problem = _record_problem(rec)
        except UnicodeDecodeError:
            problem = "not UTF-8"
        except (ValueError, RecursionError):  # JSONDecodeError, a 4,300-digit integer, deep nesting
            problem = "not a JSON record (cut short by an interruption?)"
        if problem:
            bad.append(f"{path.name} line {number}: {problem}")
        else:
            done[rec["key"]] = rec
    return done, bad


def _record_problem(rec: object) -> str | None:
    """Why a parsed line is not a point record (``{key, assignment, status, reason, metrics}``), or None."""
    if not isinstance(rec, dict):
        return f"a {type(rec).__name__}, not a record"
    if not isinstance(rec.get("key"), str):
        return "no key (a string)"
    if rec.get("status") not in STATUSES:
        return f"status {rec.get('status')!r} is not one of {', '.join(STATUSES)}"
    if not isinstance(rec.get("reason", ""), str):
        return "reason is not a string"
    if not isinstance(rec.get("metrics") or {}, dict):
        return "metrics is not a mapping"
    return None


def _rewrite(out: Path, done: dict[str, dict]) -> None:
    """points.jsonl with its good records only (the bad lines' points run again and are appended)."""
    tmp = out / "points.jsonl.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in done.values():
            f.write(json.dumps(rec, default=str) + "\n")
    paths.install(tmp, out / "points.jsonl", "--out")


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
    done, bad = read_done(out)
    if bad:
        _rewrite(out, done)
    outcome = Outcome(points=len(points), bad_records=bad)
    pending: list[Point] = []
    for p in points:
        if p.key in done:
            outcome.skipped += 1
        elif p.scenario is None:  # invalid: its row needs no simulation (counted as invalid, not simulated)
            done[p.key] = _record(p, {"status": "invalid", "reason": p.reason})
            _append(out, done[p.key])
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
    try:
        outcome.files = write_results(rows, out)
    except (
        KeyboardInterrupt
    ):  # every point is in points.jsonl: the results files are rebuilt from it next time
        for tmp in out.glob("results.*.tmp"):
            tmp.unlink(missing_ok=True)
        outcome.interrupted = True
        outcome.files = ["(interrupted while writing results.csv: run the same command again to rebuild it)"]
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


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _on_dask(pending: list[Point], workers: int | None, address: str):
    futures = []
    with dask_client(address, workers) as client:
        from dask.distributed import as_completed

        try:
            futures = client.map(simulate_point, [p.scenario for p in pending], pure=False)
            index = {f.key: p for f, p in zip(futures, pending, strict=True)}
            for f in as_completed(futures):
                yield index[f.key], f.result()
        finally:
            with _quiet_distributed():
                client.cancel(futures)


@contextmanager
def dask_client(address: str, workers: int | None):
    """A Dask client: on a LocalCluster of ``workers`` processes ('local') or a running scheduler's address;
    closed (and the local cluster stopped) quietly on the way out, Ctrl-C included."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise ScenarioError(
            "--dask needs Dask distributed: pip install 'clustersim[sweep]' (or dask[distributed])"
        ) from None
    cluster = None
    if address == "local":
        # the worker processes start with SIGINT ignored (a disposition that survives their exec): Ctrl-C reaches
        # the whole process group, and only this process, which stops the cluster, should act on it (each worker
        # printed a KeyboardInterrupt traceback)
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None
        try:
            cluster = LocalCluster(
                n_workers=workers or os.cpu_count() or 1,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                # the workers' own log lines, errors included: on the way out (Ctrl-C, or a loaded machine) a
                # worker may still send a heartbeat to the scheduler just closed and log an ERROR that is not the
                # user's (seen in CI, 2026-11-27); a point that fails comes back through its future
                silence_logs=logging.CRITICAL,
            )
        finally:
            if handler is not None:
                signal.signal(signal.SIGINT, handler)
        client = Client(cluster)
    else:
        try:
            client = Client(address, timeout="10s")
        except Exception as e:  # OSError, TimeoutError, ValueError for a malformed address
            raise ScenarioError(f"--dask {address}: cannot reach the scheduler: {e}") from None
    tornado = logging.getLogger("tornado.application")
    tornado.addFilter(_interrupted_sync)
    try:
        yield client
    finally:
        with _quiet_distributed():
            client.close()
            if cluster is not None:
                cluster.close()
        tornado.removeFilter(_interrupted_sync)


def _interrupted_sync(record: logging.LogRecord) -> bool:
    """False for the traceback distributed's ``sync`` leaves when Ctrl-C lands before its future exists: its
    ``cancel`` callback then reads the unset ``future`` (NameError, distributed/utils.py, 2026.8.0), which tornado
    logs from the event loop's thread while the interrupt is already being handled."""
    error = record.exc_info[1] if record.exc_info else None
    return not (isinstance(error, NameError) and "future" in str(error))


@contextmanager
def _quiet_distributed():
    """After Ctrl-C the scheduler, nannies and workers log every task they drop and every worker they stop
    (warnings, not results): the interrupt is said once by the caller."""
    quiet = logging.getLogger("distributed")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        quiet.setLevel(level)
