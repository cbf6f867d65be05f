"""Collective rows from nccl-tests output (all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf,
sendrecv_perf, alltoall_perf; https://github.com/NVIDIA/nccl-tests).

Both column layouts in use are read, found by their header line:

    #       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong

(the second since nccl-tests 2.13 added ``root``); lines may carry MPI / Slurm prefixes (``[1,0]<stdout>:``,
``0: ``). The JSON that newer nccl-tests write with ``-J FILE`` is read too. A row keeps the out-of-place time
(µs, the mean over the test's iterations) of each size; ``size`` is NCCL's: the full buffer, which is what
``bytes`` means in a table. Ranks and nodes come from the ``#  Rank  N ... on HOST device`` lines, the test
from ``# Collective test starting: X_perf`` or the file name; the command line can say either.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.scenario.files import parse_json, read_text
from simulator.scenario.section import MAX_GPUS
from simulator.tables.format import CollectiveRow

TESTS = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "broadcast": "broadcast",
    "sendrecv": "send_recv",
    "alltoall": "all_to_all",
}
_PREFIX = re.compile(r"^\s*(\[\d+,\d+\]<std(?:out|err)>:|\d+:\s)")
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
_TEST = re.compile(r"Collective test starting:\s*(\w+?)_perf")
_ITERS = re.compile(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)")
_DTYPE = {
    "float": "fp32",
    "half": "fp16",
    "bfloat16": "bf16",
    "double": "fp32",
    "int8": "int8",
    "uint8": "int8",
}


def _op_from(text: str, path: Path, op: str | None) -> str:
    if op:
        return op
    found = _TEST.search(text)
    name = found.group(1) if found else next((t for t in TESTS if t in path.name.replace("-", "_")), None)
    if name not in TESTS:
        raise ScenarioError(
            f"{path}: cannot tell which test this is (no 'Collective test starting' line, no test name in the file "
            f"name); pass --op ({', '.join(TESTS.values())})"
        )
    return TESTS[name]


_DEVICE = re.compile(r"#\s*Rank\s+\d+.*?\bdevice\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$", re.MULTILINE)


def log_devices(path: Path, text: str | None = None) -> set[str]:
    """The GPU names nccl-tests' rank lines give ("#  Rank  0 Group  0 Pid 1 on node1 device  0 [0x07] NVIDIA
    A100-SXM4-80GB"), or the JSON's devices[].name; empty where the log does not say. ``text``: the log, where
    the caller has read it already."""
    text = read_text(path) if text is None else text
    if text.lstrip().startswith("{"):
        try:
            devices = json.loads(text).get("config", {}).get("devices") or []
            return {str(d["name"]) for d in devices if isinstance(d, dict) and d.get("name")}
        except (ValueError, AttributeError, TypeError, RecursionError):
            return set()
    return {m.group(1) for m in _DEVICE.finditer(_PREFIX.sub("", text))}


def parse_nccl_tests(
    path: Path,
    op: str | None = None,
    ranks: int | None = None,
    nodes: int | None = None,
    text: str | None = None,
) -> list[CollectiveRow]:
    """The collective rows of one log (``text``: its contents, where the caller has read them)."""
    text = read_text(path) if text is None else text  # bounded: a regular file, size, UTF-8
    parse = _parse_json if text.lstrip().startswith("{") else _parse_text
    try:
        rows = parse(path, text, op, ranks, nodes)
    # a field of another type than nccl-tests writes, a number over Python's 4,300-digit limit
    except (TypeError, ValueError, OverflowError, AttributeError, KeyError) as e:
        raise ScenarioError(
            f"{path}: a field of the wrong type ({type(e).__name__}: {str(e)[:100]})"
        ) from None
    return _checked(path, rows)


def _parse_text(
    path: Path, text: str, op: str | None, ranks: int | None, nodes: int | None
) -> list[CollectiveRow]:
    """nccl-tests' text output, either column layout, with MPI / Slurm prefixes."""
    lines = [_PREFIX.sub("", line) for line in text.splitlines()]
    op = _op_from(text, path, op)
    hosts: dict[int, str] = {}
    for line in lines:
        m = _RANK.search(line)
        if m:
            hosts[int(m.group(1))] = m.group(2)
    n = ranks or len(hosts)
    n_nodes = nodes or len(set(hosts.values())) or 1
    if n < 2:
        raise ScenarioError(
            f"{path}: found {n} rank(s) in the header; pass --ranks (and --nodes) for this log"
        )
    if n % n_nodes:
        raise ScenarioError(f"{path}: {n} ranks do not split evenly into {n_nodes} nodes")
    iters = _ITERS.search(text)
    header = next((i for i, line in enumerate(lines) if re.match(r"#\s+size\s+count\s", line)), None)
    if header is None:
        raise ScenarioError(f"{path}: no '#  size  count  type ...' header line (not nccl-tests output?)")
    columns = lines[header].lstrip("#").split()
    has_root = "root" in columns
    rows = []
    for lineno, line in enumerate(lines[header + 1 :], start=header + 2):
        cells = line.split()
        if not cells or line.lstrip().startswith("#"):
            continue
        if not cells[0].isdigit():
            if rows:
                break  # the table ended ("Out of bounds values", "Avg bus bandwidth")
            continue
        time_col = 5 if has_root else 4
        try:
            size, us = float(cells[0]), float(cells[time_col])
        except (IndexError, ValueError):
            raise ScenarioError(
                f"{path} line {lineno}: cannot read size and time from '{line.strip()[:80]}'"
            ) from None
        if not math.isfinite(us):
            raise ScenarioError(
                f"{path} line {lineno}: time '{cells[time_col]}' is not a finite number; the log is refused"
            )
        if size <= 0 or us <= 0:
            continue
        rows.append(_row(op, n, n_nodes, size, us, int(iters.group(1)) if iters else 0, cells[2]))
    if not rows:
        raise ScenarioError(f"{path}: the table under the header has no rows (a truncated log?)")
    return rows


def _checked(path: Path, rows: list[CollectiveRow]) -> list[CollectiveRow]:
    """Rows a cost table can hold: finite sizes and times (a time of inf or nan is refused, with the size)
    and group sizes within what one simulation holds."""
    for i, r in enumerate(rows):
        if not (math.isfinite(r.bytes) and math.isfinite(r.median_us)):
            raise ScenarioError(
                f"{path}: results[{i}]: size {r.bytes:g} B, time {r.median_us:g} us: not finite; the file is refused"
            )
        if r.ranks > MAX_GPUS:
            raise ScenarioError(f"{path}: {r.ranks} ranks; a simulation holds at most {MAX_GPUS:,}")
    return rows


def _parse_json(
    path: Path, text: str, op: str | None, ranks: int | None, nodes: int | None
) -> list[CollectiveRow]:
    """nccl-tests ``-J FILE.json`` output (src/util.cu, JSON file version 3): ``args`` (the command line),
    ``config`` (with ``devices``: one entry per rank, with its hostname) and ``results`` (per size:
    ``size``, ``type``, ``out_of_place: {time | cpu_time, ...}``)."""
    data = parse_json(text, str(path))
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        raise ScenarioError(f"{path}: no 'results' list (not nccl-tests JSON output)")
    args = data.get("args")
    if args is not None and not isinstance(args, list):
        raise ScenarioError(
            f"{path}: a field of the wrong type (TypeError: args is the command line as a list of words, "
            f"got {type(args).__name__})"
        )
    program = " ".join(str(a) for a in args or [])
    words = program.split()  # args of blanks only ([" "]) name no program
    op = _op_from(f"Collective test starting: {Path(words[0]).name}" if words else "", path, op)
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    devices = [d for d in config.get("devices") or [] if isinstance(d, dict)]
    n = ranks or len(devices)
    n_nodes = nodes or len({d.get("hostname") for d in devices}) or 1
    if n < 2:
        raise ScenarioError(f"{path}: the JSON lists {n} device(s); pass --ranks (and --nodes)")
    if n % n_nodes:
        raise ScenarioError(f"{path}: {n} ranks do not split evenly into {n_nodes} nodes")
    rows = []
    for i, r in enumerate(results):
        try:
            size = float(r["size"])
            oop = r.get("out_of_place") or r.get("in_place") or {}
            us = float(oop.get("time", oop.get("cpu_time")))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ScenarioError(f"{path}: results[{i}] needs size and out_of_place.time") from None
        if size > 0 and us > 0:
            rows.append(
                _row(op, n, n_nodes, size, us, int(config.get("iterations") or 0), str(r.get("type", "")))
            )
    if not rows:
        raise ScenarioError(f"{path}: 'results' holds no timed size")
    return rows


def _row(op: str, n: int, n_nodes: int, size: float, us: float, iters: int, type_name: str) -> CollectiveRow:
    """sendrecv_perf: each rank sends to the next; read as one transfer between a pair of ranks, across nodes
    when the test spanned several."""
    if op == "send_recv":
        across = n_nodes > 1
        return CollectiveRow(
            op, 2, 2 if across else 1, 1 if across else 2, size, us, iters, None, _DTYPE.get(type_name, "")
        )
    return CollectiveRow(op, n, n_nodes, n // n_nodes, size, us, iters, None, _DTYPE.get(type_name, ""))
