"""What-if sweeps: a base scenario, some of its fields varied over values, every point simulated once.

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

import copy
import csv
import difflib
import hashlib
import itertools
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from simulator.errors import ScenarioError
from simulator.scenario.files import read_yaml
from simulator.scenario.presets import MODEL_SOURCE_KEYS

FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
STATUSES = ("ok", "oom", "invalid", "error")


@dataclass(frozen=True)
class Sweep:
    """A base scenario (parsed YAML and the directory its relative paths are read from) and the varied fields."""

    base: dict
    base_dir: Path | None
    fields: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]
    zipped: bool = False

    def __post_init__(self):
        if not self.fields:
            raise ScenarioError("sweep: nothing to vary (give --vary FIELD=v1,v2,... or a vary: section)")
        if len(set(self.fields)) != len(self.fields):
            raise ScenarioError(f"sweep: a field is varied twice: {', '.join(self.fields)}")
        for f, vs in zip(self.fields, self.values, strict=True):
            check_field(f)
            if not vs:
                raise ScenarioError(f"sweep: {f}: no values")
        if self.zipped and len({len(v) for v in self.values}) > 1:
            lengths = ", ".join(f"{f} ({len(v)})" for f, v in zip(self.fields, self.values, strict=True))
            raise ScenarioError(
                f"sweep: --zip pairs values in order, so every field needs as many: {lengths}"
            )

    @property
    def size(self) -> int:
        if self.zipped:
            return len(self.values[0])
        n = 1
        for v in self.values:
            n *= len(v)
        return n

    def assignments(self) -> Iterator[dict[str, Any]]:
        rows = zip(*self.values, strict=True) if self.zipped else itertools.product(*self.values)
        for row in rows:
            yield dict(zip(self.fields, row, strict=True))


# keys the loader reads before validation (simulator/scenario/presets.py expand_model_section)
_LOADER_KEYS = {("model",): MODEL_SOURCE_KEYS}


def check_field(name: str) -> None:
    """A varied field must be a scenario field: a misspelt one would make every point of the grid invalid for the
    same reason, so it is one error before anything runs (with the nearest field's name)."""
    from simulator.scenario.loader import section_at

    parts = tuple(name.split("."))
    for i, part in enumerate(parts):
        path = parts[:i]
        model = section_at(path)
        if model is None:  # below a value, a free-form mapping or a loader key: nothing to check
            return
        known = [*model.model_fields, *_LOADER_KEYS.get(path, ())]
        if part not in known:
            where = ".".join(path) or "the scenario"
            hint = difflib.get_close_matches(part, known, n=1)
            raise ScenarioError(
                f"vary {name}: {where} has no field {part!r}"
                + (f" (did you mean '{'.'.join((*path, hint[0]))}'?)" if hint else "")
            )


# varying one of these changes the GPUs left for data parallelism
SHAPE_FIELDS = {
    "parallelism.tensor_parallel",
    "parallelism.pipeline_parallel",
    "parallelism.context_parallel",
    "cluster.num_nodes",
    "cluster.topology",
    "cluster.gpus_per_node",
}


def derived_data_parallel(sweep: Sweep) -> tuple[Sweep, bool]:
    """When the grid changes the GPU count or the model-parallel degrees but not data_parallel, data
    parallelism is derived at each point (the base's value would make most points invalid). Returns the sweep
    and whether the base's data_parallel was dropped."""
    par = sweep.base.get("parallelism")
    if (
        not isinstance(par, dict)
        or "data_parallel" not in par
        or "parallelism.data_parallel" in sweep.fields
        or not SHAPE_FIELDS & set(sweep.fields)
    ):
        return sweep, False
    base = copy.deepcopy(sweep.base)
    del base["parallelism"]["data_parallel"]
    return Sweep(base, sweep.base_dir, sweep.fields, sweep.values, sweep.zipped), True


def parse_vary(spec: str) -> tuple[str, tuple[Any, ...]]:
    """``FIELD=v1,v2,...`` -> (field, values); each value is read as YAML (8 -> int, true -> bool)."""
    name, sep, rest = spec.partition("=")
    name = name.strip()
    if not sep or not FIELD.match(name):
        raise ScenarioError(
            f"--vary {spec!r}: expected FIELD=v1,v2,... with FIELD a dotted scenario path "
            "(e.g. parallelism.tensor_parallel=1,2,4)"
        )
    values = tuple(_value(v.strip(), name) for v in rest.split(",") if v.strip())
    if not values:
        raise ScenarioError(f"--vary {name}: no values after '='")
    return name, values


def _value(text: str, name: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise ScenarioError(f"--vary {name}: cannot read value {text!r}") from None


def load_base(path: Path) -> tuple[dict, Path]:
    """The base scenario file, parsed (validated point by point later)."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: expected a mapping with model, cluster, training, parallelism")
    data.setdefault("name", path.stem)
    return data, path.parent


def load_sweep_file(path: Path) -> tuple[Sweep, dict]:
    """A sweep YAML: ``base:`` (a scenario path, relative to the file, or an inline scenario), ``vary:``
    (field -> list of values), optional ``zip: true``, ``out:``, ``report:``. Returns the sweep and the options."""
    data = read_yaml(path)
    if not isinstance(data, dict) or "vary" not in data:
        raise ScenarioError(f"{path}: a scenario with no vary: section; a sweep file has base: and vary:")
    unknown = set(data) - {"base", "vary", "zip", "out", "report"}
    if unknown:
        raise ScenarioError(
            f"{path}: unknown keys {', '.join(sorted(unknown))} (expected base, vary, zip, out, report)"
        )
    base = data.get("base")
    if isinstance(base, str):
        base_data, base_dir = load_base((path.parent / base).resolve())
    elif isinstance(base, dict):
        base_data, base_dir = copy.deepcopy(base), path.parent
        base_data.setdefault("name", path.stem)
    else:
        raise ScenarioError(f"{path}: base: must be a scenario file name or a scenario mapping")
    vary = data["vary"]
    if not isinstance(vary, dict) or not vary:
        raise ScenarioError(f"{path}: vary: must map fields to lists of values")
    fields, values = [], []
    for name, vs in vary.items():
        if not isinstance(name, str) or not FIELD.match(name):
            raise ScenarioError(f"{path}: vary: {name!r} is not a dotted scenario path")
        fields.append(name)
        values.append(tuple(vs) if isinstance(vs, list) else (vs,))
    options = {k: data[k] for k in ("out", "report") if k in data}
    return Sweep(base_data, base_dir, tuple(fields), tuple(values), bool(data.get("zip", False))), options


def assign(base: dict, assignment: dict[str, Any]) -> dict:
    """The base scenario with each dotted field set. ``model`` set to a name means that preset (a ``.json``
    path: that Hugging Face config); the point's name records what was varied."""
    data = copy.deepcopy(base)
    for name, value in assignment.items():
        keys = name.split(".")
        if keys == ["model"] and isinstance(value, str):
            value = {"hf_config": value} if value.endswith(".json") else {"preset": value}
        node = data
        for k in keys[:-1]:
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            elif not isinstance(child, dict):
                raise ScenarioError(f"sweep: {name}: {k} is a value in the base scenario, not a section")
            node = child
        node[keys[-1]] = value
    label = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in assignment.items())
    data["name"] = f"{base.get('name', 'sweep')}[{label}]"
    return data


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


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys; lists as JSON text (one cell)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, name + "."))
        elif isinstance(v, list):
            out[name] = json.dumps(v)
        else:
            out[name] = v
    return out


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


def write_results(rows: list[dict], out: Path) -> list[str]:
    """``results.csv`` and, with pyarrow, ``results.parquet``; each written to a temporary file and renamed."""
    columns: list[str] = []
    for r in rows:
        for k in r:
            if k not in columns:
                columns.append(k)
    written = []
    tmp = out / "results.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow(r)
    tmp.replace(out / "results.csv")
    written.append(str(out / "results.csv"))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return written
    mixed = {c for c in columns if len({_kind(r.get(c)) for r in rows} - {"none"}) > 1}
    table = pa.Table.from_pylist(
        [{c: (_text(r.get(c)) if c in mixed else _cell(r.get(c))) for c in columns} for r in rows]
    )
    tmp = out / "results.parquet.tmp"
    pq.write_table(table, tmp)
    tmp.replace(out / "results.parquet")
    written.append(str(out / "results.parquet"))
    return written


def _kind(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    return "text"


def _cell(v: Any) -> Any:
    return v if v is None or isinstance(v, bool | int | float | str) else json.dumps(v, default=str)


def _text(v: Any) -> Any:
    """A column whose cells are of several kinds (a varied field given 1 and "auto") is stored as text."""
    return None if v is None else v if isinstance(v, str) else json.dumps(v, default=str)
