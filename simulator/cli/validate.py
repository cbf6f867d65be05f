"""``clustersim validate``: predict published measured runs and print the error, case by case and per source."""

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simulator.cli.common import KERNELS_HELP
from simulator.errors import ScenarioError
from simulator.report.console import err, fail, progress

if TYPE_CHECKING:  # rich is imported where a table is drawn; the runner where cases run
    from rich.console import Console

    from simulator.validation.runner import CaseResult


def validate(
    cases: Annotated[
        Path | None, typer.Option(help="Cases file (default: the built-in published runs).")
    ] = None,
    filter_text: Annotated[
        str | None, typer.Option("--filter", help="Only cases whose id contains TEXT.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    check: Annotated[bool, typer.Option(help="Exit 1 when the summary misses the CI gate.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    kernels: Annotated[str | None, typer.Option("--kernels", help=KERNELS_HELP)] = None,
    cross_validate: Annotated[
        bool,
        typer.Option(
            "--cross-validate",
            help="Also predict every source with the framework profiles refitted without it (leave one source "
            "out): in-sample and out-of-sample errors side by side.",
        ),
    ] = False,
    one_run: Annotated[
        bool,
        typer.Option(
            "--one-run",
            help="Measure the one-run workflow (calibrate step): per source with 4+ runs of a profile, fit its GEMM "
            "level to the smallest run, predict the others; errors by same GPU and precision, other precision, "
            "other GPU. Default: every shipped validation file.",
        ),
    ] = False,
    pool: Annotated[
        list[Path] | None,
        typer.Option(
            "--pool",
            help="With --cross-validate: more cases files whose cases a profile may be refitted on (default with the "
            "built-in cases: the MoE runs, simulator/validation/moe.yaml).",
        ),
    ] = None,
) -> None:
    """Predict published measured runs and report the error, case by case and per source. Exits 1 when a case
    fails to simulate or is simulated out of memory (or, with --check, when the summary misses the CI gate)."""
    from simulator.tables.select import check_choice
    from simulator.validation import runner

    if one_run:
        _one_run(cases, filter_text, json_out, quiet)
        return
    if cross_validate:
        if kernels is not None:
            fail("--cross-validate: refits use the shipped tables; leave --kernels out")
        _cross_validate(cases, filter_text, json_out, check, quiet, pool)
        return

    try:
        kernels = check_choice(kernels, "--kernels") if kernels is not None else None
        selected = _select(cases, filter_text)
    except ScenarioError as e:
        fail(str(e))
    if not selected:
        fail(f"--filter: no case id contains '{filter_text}'")
    show = not quiet and not json_out and sys.stderr.isatty()
    with progress(show) as bar:
        task = bar.add_task("validating", total=len(selected))
        results = runner.run_cases(
            selected, lambda case_id: bar.update(task, advance=1, description=case_id), kernels=kernels
        )
    summary = runner.summarize(results)
    if json_out:
        print(
            json.dumps(
                {
                    "cases": [
                        {
                            k: r.to_dict()[k]
                            for k in ("id", "metric", "published", "predicted", "error_pct", "status")
                        }
                        for r in results
                    ],
                    "summary": {
                        k: summary[k]
                        for k in (
                            "n",
                            "median_abs_error_pct",
                            "mean_abs_error_pct",
                            "max_abs_error_pct",
                            "mean_signed_speed_pct",
                            "mean_signed_memory_pct",
                        )
                    },
                    "by_source": runner.summarize_by_source(results),
                },
                indent=2,
            )
        )
    else:
        print_validation(results, runner.summarize_by_source(results), summary)
        print(runner.summary_line(summary))
    if check and (missed := runner.gate_failures(summary)):
        err.print("[bold red]validation gate missed:[/bold red] " + "; ".join(missed))
        raise typer.Exit(1)
    if summary["failed"] or summary["oom"]:  # a prediction that could not be made is not a pass
        raise typer.Exit(1)


UNITS = {
    "iteration_time_s": "s/iter",
    "tokens_per_s_per_gpu": "tokens/s/GPU",
    "model_tflops_per_gpu": "TFLOP/s/GPU",
    "peak_memory_gib": "GiB peak",
    "reserved_memory_gib": "GiB reserved",
}


def _err(e: float | None) -> str:
    if e is None:
        return "-"
    colour = "green" if abs(e) <= 5 else "yellow" if abs(e) <= 15 else "red"
    return f"[{colour}]{e:+.1f}%[/{colour}]"


def print_validation(
    results: "list[CaseResult]", by_source: dict, overall: dict, console: "Console | None" = None
) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    cases = Table(title="Predicted vs published", header_style="bold")
    for col, just in (
        ("case", "left"),
        ("metric", "left"),
        ("published", "right"),
        ("predicted", "right"),
        ("error", "right"),
        ("status", "left"),
    ):
        cases.add_column(col, justify=just)
    for r in results:
        predicted = f"{r.predicted:,.4g}" if r.predicted is not None else "-"
        status = r.status if r.status == "ok" else f"[red]{r.status}[/red] {escape(r.message[:70])}"
        cases.add_row(
            escape(r.id), UNITS[r.metric], f"{r.published:,.4g}", predicted, _err(r.error_pct), status
        )
    console.print(cases)
    summary = Table(
        title="Absolute error by source (signed speed: + where the simulation is faster than measured)",
        header_style="bold",
    )
    for col in ("source", "cases", "median", "mean", "max", "signed speed", "failed"):
        summary.add_column(col, justify="left" if col == "source" else "right")
    for name, s in [*by_source.items(), ("all", overall)]:
        if not s["n"]:
            summary.add_row(name, "0", "-", "-", "-", "-", str(s["failed"]))
            continue
        signed = s.get("mean_signed_speed_pct")
        summary.add_row(
            name,
            str(s["n"]),
            f"{s['median_abs_error_pct']:.1f}%",
            f"{s['mean_abs_error_pct']:.1f}%",
            f"{s['max_abs_error_pct']:.1f}%",
            "-" if signed is None else f"{signed:+.1f}%",
            str(s["failed"]),
        )
    console.print(summary)


def _select(cases, filter_text: str | None) -> list[dict]:
    """The cases of ``cases`` (default: the published suite) whose id contains ``filter_text``."""
    from simulator.validation import runner

    needle = (filter_text or "").lower()
    return [c for c in runner.load_cases(cases) if needle in str(c.get("id", "")).lower()]


def _cross_validate(
    cases: Path | None,
    filter_text: str | None,
    json_out: bool,
    check: bool,
    quiet: bool,
    pool: list[Path] | None,
) -> None:
    """In-sample and leave-one-source-out errors, case by case and summarised (validation/crossval.py)."""
    from simulator.validation import runner
    from simulator.validation.crossval import cross_validate

    try:
        selected = _select(cases, filter_text)
        if pool is None and cases is None:
            pool = [runner.DEFAULT_CASES.with_name("moe.yaml")]
        extra = [c for path in pool or () for c in runner.load_cases(path)]
    except ScenarioError as e:
        fail(str(e))
    if not selected:
        fail(f"--filter: no case id contains '{filter_text}'")
    show = not quiet and not json_out and sys.stderr.isatty()
    with progress(show) as bar:
        task = bar.add_task("cross-validating", total=len(selected))
        results = cross_validate(selected, lambda text: bar.update(task, advance=1, description=text), extra)
    inside = runner.summarize([r.case for r in results])
    outside = runner.summarize([r.out_of_sample for r in results])
    if json_out:
        print(
            json.dumps(
                {
                    "cases": [
                        {
                            "id": r.case.id,
                            "source": r.case.source,
                            "published": r.case.published,
                            "in_sample_error_pct": r.case.error_pct,
                            "out_of_sample_error_pct": r.out_of_sample.error_pct,
                            "out_of_sample_profile": r.how,
                        }
                        for r in results
                    ],
                    "in_sample": inside,
                    "out_of_sample": outside,
                },
                indent=2,
            )
        )
    else:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table(title="In sample and out of sample (leave one source out)", header_style="bold")
        for col in ("case", "published", "in sample", "out of sample", "profile out of sample"):
            table.add_column(col, justify="left" if col in ("case", "profile out of sample") else "right")
        for r in results:
            table.add_row(
                escape(r.case.id),
                f"{r.case.published:,.4g}",
                _err(r.case.error_pct),
                _err(r.out_of_sample.error_pct),
                r.how,
            )
        Console().print(table)
        print(
            runner.summary_line(outside).replace(
                "validation:", "validation (out of sample, leave one source out):"
            )
        )
        print(runner.summary_line(inside).replace("validation:", "validation (in sample):"))
    if check and (missed := runner.gate_failures(inside)):
        err.print("[bold red]validation gate missed:[/bold red] " + "; ".join(missed))
        raise typer.Exit(1)


def _one_run(cases: Path | None, filter_text: str | None, json_out: bool, quiet: bool) -> None:
    """The one-run workflow measured per source (validation/one_run.py)."""
    from simulator.metrics.error_bar import RELATIONS
    from simulator.validation import one_run as one
    from simulator.validation import runner
    from simulator.validation.accuracy import shipped_cases

    try:
        needle = (filter_text or "").lower()
        pool = shipped_cases() if cases is None else runner.load_cases(cases)
        selected = [c for c in pool if needle in str(c.get("id", "")).lower()]
    except ScenarioError as e:
        fail(str(e))
    show = not quiet and not json_out and sys.stderr.isatty()
    with progress(show) as bar:
        task = bar.add_task("one run per source", total=None)
        results = one.one_run(selected, lambda text: bar.update(task, description=text))
    if not results:
        fail(f"--one-run: no source has {one.MIN_RUNS} or more speed runs of one profile among these cases")
    relations = RELATIONS
    by_source: dict[tuple[str, str], list] = {}
    for r in results:
        by_source.setdefault((r.source, r.profile), []).append(r)
    if json_out:
        rows = [
            {
                "source": src,
                "profile": prof,
                "fitted_on": rs[0].fitted_on,
                "gemm_efficiency": list(rs[0].gemm_efficiency),
                **{rel: one.summary(rs, rel) for rel in relations},
            }
            for (src, prof), rs in by_source.items()
        ]
        overall = {rel: one.summary(results, rel) for rel in relations}
        print(json.dumps({"sources": rows, "overall": overall}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    def cell(x: dict) -> str:
        return (
            "-"
            if not x["n"]
            else f"{x['median_abs_error_pct']:.1f}% / {x['max_abs_error_pct']:.1f}% ({x['n']})"
        )

    table = Table(
        title="One measured run per source: its GEMM level fitted, the others predicted", header_style="bold"
    )
    for col in ("source", "profile", "fitted on", "gemm_efficiency", *relations):
        table.add_column(col, justify="left" if col in ("source", "profile", "fitted on") else "right")
    for (src, prof), rs in by_source.items():
        before, after = rs[0].gemm_efficiency
        table.add_row(
            src,
            prof,
            rs[0].fitted_on,
            f"{before:.3f} -> {after:.3f}",
            *(cell(one.summary(rs, rel)) for rel in relations),
        )
    Console().print(table)
    print("cells: median / max |error| (runs)")
    for rel in (*relations, None):
        x = one.summary(results, rel)
        if x["n"]:
            print(
                f"one run ({rel or 'all'}): {x['n']} runs, median |error| {x['median_abs_error_pct']:.1f}%, "
                f"max {x['max_abs_error_pct']:.1f}%, signed speed {x['mean_signed_speed_pct']:+.1f}% "
                "(+: simulated faster)"
            )
