"""``clustersim sweep`` and ``clustersim plan``: many simulations, a grid of scenarios or a search of layouts."""

import dataclasses
import json
import stat
import sys
from pathlib import Path
from typing import Annotated

import typer

from simulator import paths
from simulator.cli.common import FRAMEWORK_HELP
from simulator.errors import ScenarioError
from simulator.report.console import fail, note, progress, shown_warnings


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
    framework: Annotated[str | None, typer.Option("--framework", help=FRAMEWORK_HELP)] = None,
) -> None:
    """Simulate a base scenario over a grid of field values; resumable (finished points are skipped)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from simulator.report.output import check_output_dir, check_output_file
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
        if framework is not None:  # every point's profile, the command line's over the base's
            from simulator.scenario.loader import framework_option

            if "framework" in plan.fields:
                raise ScenarioError("--framework: the sweep varies framework itself; give one or the other")
            plan = dataclasses.replace(plan, base={**plan.base, "framework": framework_option(framework)})
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
    with progress(show, *columns) as bar:
        task = bar.add_task("points", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        try:
            with shown_warnings():
                outcome, rows = sw.run_sweep(plan, out, workers=workers, dask=dask, progress=advance)
        except ScenarioError as e:
            if created and not any(out.iterdir()):  # nothing ran (no Dask scheduler): leave nothing behind
                out.rmdir()
            fail(str(e))
    if report is not None:
        from simulator.study.report import write_sweep_report

        try:  # a target checked up front may still fail to take the bytes (a full disk, /dev/full); the points stay
            write_sweep_report(
                rows, list(plan.fields), report, f"Sweep of {plan.base.get('name', base.stem)}"
            )
        except ScenarioError as e:
            fail(f"{e} (the sweep's points and results are in {out})")
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
