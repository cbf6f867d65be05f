"""Calculon's own layout search (calculon-ai/calculon caa4b11, Apache-2.0), resumable, for benchmarks/calculon_compare.py.

``calculon llm-optimal-execution`` keeps every result in memory until its last task returns (``pool.starmap``), so
a search of hours cut short leaves nothing. This runs the same search, task by task: the parameter tuples of
``OptimalExecution.run_command`` (tensor, pipeline, data degrees x interleaving x recompute x optimizer sharding x
TP communication type), each through Calculon's own ``OptimalExecution.search`` (with ``-m``: break across
micro-batch sizes; fused activations; TP and DP overlap allowed), each result appended to a JSONL checkpoint as it
returns; a re-run skips the finished tuples. The merge is Calculon's ``OptimalExecution.update_list``. Results are
Calculon's; only the bookkeeping is this script's.

    pip install -e PATH/TO/calculon   # not a dependency of this project
    python benchmarks/calculon_search.py run models/gpt3-175B.json 1024 1536 float16 systems/a100_80g.json \\
        --checkpoint search.jsonl --cpus 2
    python benchmarks/calculon_search.py store search.jsonl docs/measurements/calculon-gpt3-175b-1024.json \\
        --command "..." --note "..."

``store`` writes the top layouts in the format benchmarks/calculon_compare.py reads (the 1T search's file);
``compact`` shrinks an unfinished checkpoint to what resuming needs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import time
from pathlib import Path

TOP = 5


def _tuples(app, num_procs: int, max_batch: int):
    """OptimalExecution.run_command's loops, in its order."""
    from calculon.llm import Llm, OptimalExecution
    from calculon.util import pick

    for tp in Llm.get_all_tensor_parallelisms(num_procs, app.hidden, app.attn_heads):
        for pp in Llm.get_all_pipeline_parallelisms(num_procs, tp, app.num_blocks):
            dp = Llm.get_data_parallelism(num_procs, tp, pp)
            for ppint in Llm.get_valid_pipeline_interleavings(app.num_blocks, pp):
                batch = OptimalExecution.get_batch_size(dp, max_batch)
                if batch is None:
                    continue
                for recompute in ["full", "attn_only", "none"]:
                    for sharding in pick(dp > 1, [True, False], [False]):
                        for tp_comm in ["ar", "p2p_rs_ag", "rs_ag"]:
                            yield (tp, pp, dp, ppint, batch, recompute, sharding, tp_comm)


_CTX: dict = {}


def _init(app_path: str, system_path: str, num_procs: int, max_batch: int, datatype: str) -> None:
    import calculon
    from calculon.llm import Llm
    from calculon.system import System

    _CTX.update(
        app=Llm.Application(calculon.io.read_json_file(app_path)),
        syst=System(calculon.io.read_json_file(system_path)),
        num_procs=num_procs,
        max_batch=max_batch,
        datatype=datatype,
    )


def _key(t) -> str:
    return "|".join(map(str, t))


def _search(t):
    from calculon.llm import OptimalExecution

    c = _CTX
    t0 = time.time()
    tp, pp, dp, ppint, batch, recompute, sharding, tp_comm = t
    best, ec, gec, bec, _, _ = OptimalExecution.search(
        False, TOP, False, c["num_procs"], c["max_batch"], c["datatype"], c["app"], c["syst"],
        tp, pp, dp, ppint, batch, recompute, sharding, tp_comm, [True], True, True, True,
    )  # fmt: skip
    return _key(t), best, ec, gec, bec, time.time() - t0


def run(a) -> None:
    import calculon
    from calculon.llm import Llm

    app = Llm.Application(calculon.io.read_json_file(a.application))
    tuples = list(_tuples(app, a.num_procs, a.max_batch))
    ckpt = Path(a.checkpoint)
    done = {r["key"] for r in _read(ckpt)}
    todo = [t for t in tuples if _key(t) not in done]
    print(f"{len(tuples)} search tasks, {len(done)} done, {len(todo)} to run", flush=True)
    start = time.time()
    init = (a.application, a.system, a.num_procs, a.max_batch, a.datatype)
    with mp.Pool(a.cpus, initializer=_init, initargs=init) as pool, ckpt.open("a") as f:
        for i, (key, best, ec, gec, bec, s) in enumerate(pool.imap_unordered(_search, todo)):
            f.write(json.dumps({"key": key, "best": best, "ec": ec, "gec": gec, "bec": bec, "s": s}) + "\n")
            f.flush()
            print(
                f"{i + 1}/{len(todo)} {key}: {ec} executions, {s:.0f} s ({time.time() - start:.0f} s)",
                flush=True,
            )


def _read(path: Path) -> list[dict]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line cut short when the run was stopped
                rows.append(json.loads(line))
    return rows


def _merged(rows: list[dict]) -> list:
    from calculon.llm import OptimalExecution

    best: list = []
    for r in rows:
        best = OptimalExecution.update_list(best, [tuple(b) for b in r["best"]], TOP)
    return best


def compact(a) -> None:
    """The checkpoint with every task's counts but only the results still among the best TOP overall: what a
    resumed search needs, small enough to keep (a full one grows by ~13 kB per task)."""
    path = Path(a.checkpoint)
    rows = _read(path)
    keep = {json.dumps(b[1], sort_keys=True) for b in _merged(rows)}
    for r in rows:
        r["best"] = [b for b in r["best"] if json.dumps(b[1], sort_keys=True) in keep]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} tasks kept; {sum(len(r['best']) for r in rows)} results -> {path}")


def store(a) -> None:
    rows = _read(Path(a.checkpoint))
    best = _merged(rows)
    executions = sum(r["ec"] for r in rows)
    worker_s = sum(r["s"] for r in rows)
    out = {
        "calculon": a.calculon,
        "command": a.command,
        "executions": executions,
        "good_executions": sum(r["gec"] for r in rows),
        "calcs_per_s": round(executions / worker_s, 2),
        "search_tasks": len(rows),
        "note": a.note,
        "top": {str(i): {"execution": e, "stats": s} for i, (_, e, s) in enumerate(best)},
    }
    if a.our_pick:  # `calculon llm` on this simulator's pick: "label=seconds"
        out["calculon_on_our_picks"] = {
            label: float(seconds) for label, seconds in (x.rsplit("=", 1) for x in a.our_pick)
        }
    Path(a.output).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(rows)} tasks, {executions:,} executions; best {best[0][0]:.2f} samples/s -> {a.output}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run (or resume) the search")
    r.add_argument("application")
    r.add_argument("num_procs", type=int)
    r.add_argument("max_batch", type=int)
    r.add_argument("datatype")
    r.add_argument("system")
    r.add_argument("--checkpoint", required=True)
    r.add_argument("--cpus", type=int, default=1)
    s = sub.add_parser("store", help="merge a finished search into benchmarks/calculon_compare.py's format")
    s.add_argument("checkpoint")
    s.add_argument("output")
    s.add_argument("--command", required=True, help="the search as run, for the record")
    s.add_argument("--calculon", default="calculon-ai/calculon commit caa4b11 (Apache-2.0)")
    s.add_argument("--note", default="")
    s.add_argument(
        "--our-pick",
        action="append",
        default=[],
        help="'LABEL=SECONDS': Calculon's time for this simulator's pick",
    )
    c = sub.add_parser("compact", help="shrink a checkpoint to what resuming needs (in place)")
    c.add_argument("checkpoint")
    a = ap.parse_args()
    {"run": run, "store": store, "compact": compact}[a.cmd](a)


if __name__ == "__main__":
    main()
