"""``clustersim sweep`` and ``clustersim plan``: many simulations, a grid of scenarios or a search of layouts."""

from __future__ import annotations

import json
import stat
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from simulator import paths
from simulator.errors import ScenarioError
from simulator.report.console import err, fail, note, shown_warnings
from simulator.report.output import check_output_dir, check_output_file
from simulator.scenario.loader import load_scenario


def sweep(
    base: Annotated[Path, typer.Argument(help="Base scenario YAML, or a sweep YAML (base:, vary:, zip:).")],
    vary: Annotated[
        list[str] | None,
        typer.Option(
            "--vary",
            help="FIELD=v1,v2,...: a dotted scenario field and its values (repeat for more fields).",
        ),
    ] = None,
    zipped: Annotated[
        bool, typer.Option("--zip", help="Pair the values in order instead of taking every combination.")
    ] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Directory for points.jsonl and results.")] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", min=1, help="Processes (default: one per core; 1 = inline).")
    ] = None,
    dask: Annotated[
        str | None,
        typer.Option(
            "--dask", help="Run on Dask: 'local' (a LocalCluster) or a scheduler address tcp://host:8786."
        ),
    ] = None,
    report: Annotated[Path | None, typer.Option(help="Write an HTML report of the sweep.")] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print {points, ran, skipped, failed, ...} as JSON.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Simulate a base scenario over a grid of field values; resumable (finished points are skipped)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from simulator.study import grid
    from simulator.study import sweep as sw

    try:
        with shown_warnings():
            if vary:
                base_data, base_dir = grid.load_base(base)
                parsed = [grid.parse_vary(v) for v in vary]
                plan = grid.Sweep(
                    base_data, base_dir, tuple(f for f, _ in parsed), tuple(v for _, v in parsed), zipped
                )
                options: dict = {}
            else:
                plan, options = grid.load_sweep_file(base)
                if zipped:
                    plan = grid.Sweep(plan.base, plan.base_dir, plan.fields, plan.values, True)
    except ScenarioError as e:
        fail(str(e))
    plan, dropped = grid.derived_data_parallel(plan)
    if dropped and not json_out:
        print(
            "note: data_parallel is derived from the GPU count at each point (vary it to fix it)",
            file=sys.stderr,
        )
    out = out or (Path(options["out"]) if "out" in options else None)
    if out is None:
        fail("sweep: give --out DIR (where points.jsonl and the results go)")
    report = report or (Path(options["report"]) if "report" in options else None)
    try:
        created = not paths.exists(out, "--out")
        check_output_dir(out, "--out")
        for name in ("points.jsonl", "results.csv", "results.parquet"):  # each a regular file or nothing
            st = paths.lookup(out / name, "--out")
            if st is not None and not stat.S_ISREG(st.st_mode):
                fail(f"--out {out}: {name} there is not a regular file (the sweep writes its results to it)")
        if report is not None:
            check_output_file(report, "--report")
    except ScenarioError as e:
        fail(str(e))
    show = not quiet and not json_out and sys.stderr.isatty()
    columns = (
        TextColumn("simulating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, transient=True, disable=not show) as bar:
        task = bar.add_task("points", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        try:
            with shown_warnings():
                outcome, rows = sw.run_sweep(plan, out, workers=workers, dask=dask, progress=progress)
        except ScenarioError as e:
            if created and not any(out.iterdir()):  # nothing ran (no Dask scheduler): leave nothing behind
                out.rmdir()
            fail(str(e))
    if report is not None:
        from simulator.study.report import write_sweep_report

        write_sweep_report(rows, list(plan.fields), report, f"Sweep of {plan.base.get('name', base.stem)}")
    for line in outcome.bad_records[:8]:
        note("warning", f"{line}; its point is simulated again")
    if len(outcome.bad_records) > 8:
        note("warning", f"{len(outcome.bad_records) - 8} more lines of points.jsonl were not records")
    if json_out:
        print(json.dumps(outcome.to_dict(), indent=2))
    else:
        c = Console(soft_wrap=True)
        c.print(
            f"{outcome.points} points: {outcome.ran} simulated, {outcome.skipped} already done, "
            f"{outcome.failed} invalid, {outcome.oom} out of memory"
            + (
                " (interrupted: every finished point is saved; run again to resume)"
                if outcome.interrupted
                else ""
            )
        )
        c.print(
            "results: " + ", ".join(outcome.files) + (f"; report: {report}" if report else ""),
            markup=False,
            highlight=False,
        )
    if outcome.interrupted:
        raise typer.Exit(130)


def parse_tokens(text: str) -> float:
    """``--tokens``: 15T, 300B or a number, checked as training.total_tokens is."""
    from simulator.scenario.training import parse_count

    try:
        value = float(parse_count(text))
    except ValueError as e:
        raise ScenarioError(f"--tokens: {e}") from None
    if not 0 < value <= 1e18:
        raise ScenarioError(f"--tokens: {text} is not a positive token count")
    return value


def write_layouts(result: dict, directory: Path) -> list[Path]:
    """Each simulated layout that fits, as a scenario file ``NN-layout.yaml`` in ``directory``, with what the
    simulation gave in a header comment; returns the paths written."""
    import re

    import yaml

    from simulator.report.output import write_atomic

    out = []
    for i, r in enumerate(result["top"], 1):
        if r["status"] != "ok" or not r.get("scenario"):
            continue
        slug = re.sub(r"[^a-z0-9]+", "-", r["layout"].lower()).strip("-")
        path = directory / f"{i:02d}-{slug}.yaml"
        head = (
            f"# clustersim plan, layout {i}: {r['layout']}\n"
            f"# simulated {r['iteration_time_s']:.3f} s per iteration, MFU {r['mfu']:.1%}, "
            f"{r['memory_gib']:.1f} GiB per GPU; run it: clustersim run {path.name}\n"
        )
        write_atomic(path, head + yaml.safe_dump(r["scenario"], sort_keys=False))
        out.append(path)
    return out


def plan(
    model: Annotated[str, typer.Option("--model", help="A preset name or a Hugging Face config.json.")],
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs to lay the job out on.")],
    topology: Annotated[str, typer.Option("--topology", help="A shipped topology name or a YAML file.")],
    global_batch_size: Annotated[int, typer.Option("--global-batch-size", min=1, help="Sequences per step.")],
    seq: Annotated[
        int | None, typer.Option("--seq", min=1, help="Sequence length (default: the model's).")
    ] = None,
    precision: Annotated[str, typer.Option("--precision", help="bf16, fp16 or fp32.")] = "bf16",
    attention: Annotated[
        str, typer.Option("--attention", help="flash (default: every current stack has it) or standard.")
    ] = "flash",
    framework: Annotated[
        str, typer.Option("--framework", help="Framework profile (default: auto).")
    ] = "auto",
    top: Annotated[int, typer.Option("--top", min=1, help="How many to confirm by simulation.")] = 10,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress display.")] = False,
    write_scenario: Annotated[
        Path | None,
        typer.Option(
            "--write-scenario", help="Write each simulated layout that fits as a runnable scenario file here."
        ),
    ] = None,
    tokens: Annotated[
        str | None, typer.Option("--tokens", help="Tokens to train on (15T, 300B): a days-to-train column.")
    ] = None,
) -> None:
    """Search parallel layouts (TP, PP, CP, DP, virtual stages, micro-batch, ZeRO / FSDP, recompute) for a
    model on N GPUs: screen every one with a fast estimate, confirm the best by simulation."""
    from simulator.hardware.topology import load_topology
    from simulator.study.plan import plan as run_plan

    model_section: dict = {"hf_config": model} if model.endswith(".json") else {"preset": model}
    model_section["attention"] = attention
    if seq:
        model_section["seq_length"] = seq
    data = {
        "name": f"plan-{Path(model).stem}",
        "framework": framework,
        "model": model_section,
        "cluster": {"topology": topology, "num_nodes": 1},
        "training": {"global_batch_size": global_batch_size, "micro_batch_size": 1, "precision": precision},
        "parallelism": {"data_parallel": 1},
    }
    try:
        if write_scenario is not None:
            check_output_dir(write_scenario, "--write-scenario")
        total_tokens = parse_tokens(tokens) if tokens is not None else None
        with shown_warnings():
            gpn = load_topology(topology).node.gpus
            nodes = max(1, gpus // gpn)
            if gpus > gpn and gpus % gpn:
                fail(f"--gpus ({gpus}) is not a whole number of {gpn}-GPU nodes of {topology}")
            data["cluster"]["num_nodes"] = nodes
            if gpus < gpn:  # part of one node: plan those GPUs (they keep the node's NVLink, NICs and host)
                data["cluster"]["gpus_per_node"] = gpus
                if not json_out:
                    print(
                        f"note: --gpus {gpus} is part of one {gpn}-GPU {topology} node: planning {gpus} of its "
                        f"GPUs (cluster.gpus_per_node: {gpus})",
                        file=sys.stderr,
                    )
            # a valid stand-in layout (every GPU data-parallel, one sequence each); the search replaces it
            n = gpus
            data["parallelism"] = {}
            data["training"] = {**data["training"], "global_batch_size": n}
            base = load_scenario(data)
            show = not quiet and not json_out and sys.stderr.isatty()
            with err.status("screening layouts...") if show else nullcontext():
                result = run_plan(base, n, top=top, batch=global_batch_size)
    except ScenarioError as e:
        fail(str(e))
    seq_len = base.model.seq_length
    for r in result["top"]:
        if total_tokens and r.get("iteration_time_s"):
            r["days_to_train"] = total_tokens / (global_batch_size * seq_len / r["iteration_time_s"]) / 86400
    written = write_layouts(result, write_scenario) if write_scenario is not None else []
    if json_out:
        print(json.dumps({**result, "written": [str(w) for w in written]}, indent=2, default=str))
        return
    from rich import box
    from rich.table import Table

    c = Console(soft_wrap=True)
    c.print(
        f"screened {result['screened']:,} layouts ({result['screened_per_s']:,.0f}/s), "
        f"{result['fit_in_memory']:,} fit in memory by the estimate; the best {result['confirmed']} simulated:"
    )
    heads = ["#", "layout", "est. s", "sim. s", "MFU", "GiB", "bubble", "comm s"]
    if total_tokens:
        heads.append("days")
    rows = []
    for i, r in enumerate(result["top"], 1):
        if r["status"] != "ok":
            rows.append(
                [str(i), r["layout"], f"{r['estimate_s']:.3f}", r["status"], *[""] * (len(heads) - 4)]
            )
            continue
        rows.append(
            [
                str(i),
                r["layout"],
                f"{r['estimate_s']:.3f}",
                f"{r['iteration_time_s']:.3f}",
                f"{r['mfu']:.1%}",
                f"{r['memory_gib']:.1f}",
                f"{r['bubble_fraction']:.1%}",
                f"{r['exposed_comm_s']:.3f}",
                *([f"{r['days_to_train']:,.1f}"] if total_tokens else []),
            ]
        )
    # numbers are never cut: their columns keep their width and the layout column wraps (80 columns and up)
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for j, col in enumerate(heads):
        if col == "layout":
            t.add_column(col, justify="left", overflow="fold")
        else:
            width = max(len(col), *(len(row[j]) for row in rows)) if rows else len(col)
            t.add_column(col, justify="right", no_wrap=True, min_width=width)
    for row in rows:
        t.add_row(*row)
    c.print(t)
    c.print(result["why"])
    for path in written:
        c.print(f"wrote {path}")
