"""``clustersim``: run, compare, validate, calibrate, schema. Bad input prints one message and exits 2, never a
traceback."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from simulator.api import simulate
from simulator.calibration.cli import calibrate_app
from simulator.errors import ScenarioError
from simulator.report.console import err, fail, shown_warnings
from simulator.report.output import check_output_dir, check_output_file, temporary_beside
from simulator.report.table import print_oom_headline, print_table
from simulator.report.trace import write_trace
from simulator.scenario.loader import load_scenario
from simulator.scenario.schema import Scenario
from simulator.tables.select import check_choice

# Exit status: 0 = simulated and fits; 2 = bad input (one line on stderr naming the field); 3 = simulated, but the
# run (compare: any of its runs) does not fit in GPU (or, offloading, host) memory; validate: 1 = a case failed
# or the --check gate missed.
EXIT_OUT_OF_MEMORY = 3

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Simulate LLM training on GPU clusters.")
app.add_typer(calibrate_app, name="calibrate")


KERNELS_HELP = (
    "Measured costs: a table directory, a shipped table's name, 'auto' (the shipped table of the cluster's GPU, "
    "the default) or 'none' (the pure model)."
)


def _with_kernels(s: Scenario, kernels: str | None) -> Scenario:
    """The scenario with ``--kernels`` applied (a directory is relative to the working directory)."""
    if kernels is None:
        return s
    return s.model_copy(update={"kernels": check_choice(kernels, "--kernels")})


@app.command()
def run(
    scenario: Annotated[
        Path,
        typer.Argument(help="Scenario YAML file, or a shipped scenario's name (`clustersim scenarios`)."),
    ],
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of a table.")
    ] = False,
    trace: Annotated[Path | None, typer.Option(help="Write a Chrome-trace JSON file (Perfetto).")] = None,
    report: Annotated[Path | None, typer.Option(help="Write a self-contained HTML report.")] = None,
    image: Annotated[
        Path | None, typer.Option(help="Write the timeline as a static image (.png or .svg).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress display.")] = False,
    deepspeed_config: Annotated[
        Path | None, typer.Option("--deepspeed-config", help="A DeepSpeed JSON config to take settings from.")
    ] = None,
    kernels: Annotated[str | None, typer.Option("--kernels", help=KERNELS_HELP)] = None,
) -> None:
    """Simulate one training iteration of SCENARIO. Exits 3 when the run does not fit in memory (the output
    starts with that and with changes that would fit), 2 on bad input."""
    if image and image.suffix.lower() not in (".png", ".svg", ".pdf"):
        fail(f"--image: use a .png, .svg or .pdf file name (got {image.name})")
    try:
        for path, option in ((trace, "--trace"), (report, "--report"), (image, "--image")):
            if path is not None:
                check_output_file(path, option)
        with shown_warnings():
            s = _with_kernels(load_scenario(scenario, deepspeed_config=deepspeed_config), kernels)
            # a trace, report or image shows every micro-batch: no periodic extrapolation
            every = bool(trace or report or image)
            if quiet or not sys.stderr.isatty():
                result = simulate(s, periodic=not every)
            else:
                with err.status(f"simulating {s.name} ({s.cluster.num_nodes} nodes)..."):
                    result = simulate(s, periodic=not every)
        if trace:
            write_trace(result.timeline, trace)
        if report:
            from simulator.report.html import write_report

            write_report(result, report)
    except ScenarioError as e:
        fail(str(e))
    if image:
        _write_image(result, image)
    m = result.metrics
    fixes = None
    if m.oom or m.host_oom:
        from simulator.study.fit import what_fits

        with (
            err.status("out of memory: looking for changes that fit...") if err.is_terminal else nullcontext()
        ):
            fixes = what_fits(result.scenario)
    if json_out:
        from simulator.metrics.layers import microbatch_view

        layers = [row.to_dict() for row in microbatch_view(result)]
        extra = {} if fixes is None else {"would_fit": [asdict(f) for f in fixes]}
        print(
            json.dumps({"name": result.scenario.name, **m.to_dict(), **extra, "microbatch": layers}, indent=2)
        )
    else:
        if fixes is not None:
            print_oom_headline(m, fixes)
        print_table([(result.scenario.name, m)])
        if trace:
            Console().print(f"trace written to {trace} (open it in https://ui.perfetto.dev)")
        if report:
            Console().print(f"report written to {report}")
    if fixes is not None:
        raise typer.Exit(EXIT_OUT_OF_MEMORY)


@app.command()
def scenarios(
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
) -> None:
    """List the scenarios that ship with clustersim; run one by name (`clustersim run quickstart`)."""
    from rich.table import Table

    from simulator.scenario.shipped import describe, scenario_dir, shipped_scenarios

    shipped = shipped_scenarios()
    if json_out:
        print(
            json.dumps(
                [{"name": n, "path": str(p), "about": describe(p)} for n, p in shipped.items()], indent=2
            )
        )
        return
    table = Table(title=f"Shipped scenarios ({scenario_dir()})", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("what it is")
    for name, path in shipped.items():
        table.add_row(name, describe(path))
    Console().print(table)


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="File to write.")] = Path("scenario.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter scenario (GPT-3 1.3B on one DGX A100) to edit and run."""
    from simulator.report.output import write_atomic
    from simulator.scenario.shipped import STARTER

    if path.exists() and not force:
        fail(f"{path}: exists (use --force to overwrite)")
    try:
        check_output_file(path, "init")
        write_atomic(path, STARTER.format(name=path, stem=path.stem))
    except ScenarioError as e:
        fail(str(e))
    Console().print(f"wrote {path}; run it with: clustersim run {path}")


@app.command()
def compare(
    scenarios: Annotated[list[Path], typer.Argument(help="Two or more scenario YAML files.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    report: Annotated[Path | None, typer.Option(help="Write a self-contained HTML comparison.")] = None,
    kernels: Annotated[str | None, typer.Option("--kernels", help=KERNELS_HELP)] = None,
) -> None:
    """Simulate several scenarios and show their metrics side by side. Every scenario is shown; exits 3 (as
    `run` does) when any of them does not fit in memory, naming them on stderr."""
    try:
        if report is not None:
            check_output_file(report, "--report")
        loaded = [_with_kernels(load_scenario(p), kernels) for p in scenarios]
    except ScenarioError as e:
        fail(str(e))
    results = []
    show = not quiet and sys.stderr.isatty() and len(loaded) > 1
    with shown_warnings(), Progress(console=err, transient=True, disable=not show) as bar:
        task = bar.add_task("simulating", total=len(loaded))
        for s in loaded:
            try:
                results.append((s.name, simulate(s).metrics))
            except ScenarioError as e:
                fail(f"{s.name}: {e}")
            bar.advance(task)
    if report:
        from simulator.report.html import write_compare_report

        write_compare_report(results, report)
    if json_out:
        print(json.dumps([{"name": n, **m.to_dict()} for n, m in results], indent=2))
    else:
        print_table(results)
    unfit = [(n, m) for n, m in results if m.oom or m.host_oom]
    for n, m in unfit:
        gib = m.memory_gib
        where = (
            f"GPU: {gib['device']:.1f} GiB > {gib['capacity']:.0f} GiB"
            if m.oom
            else f"host: {gib['host']:.1f} GiB > {gib['host_capacity']:.0f} GiB"
        )
        err.print(f"out of memory: {n} ({where}); `clustersim run` on it lists changes that fit")
    if unfit:
        raise typer.Exit(EXIT_OUT_OF_MEMORY)


@app.command()
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
) -> None:
    """Predict published measured runs and report the error, case by case and per source. Exits 1 when a case
    fails to simulate or is simulated out of memory (or, with --check, when the summary misses the CI gate)."""
    from simulator.validation import runner

    try:
        kernels = check_choice(kernels, "--kernels") if kernels is not None else None
        selected = [
            c
            for c in runner.load_cases(cases)
            if not filter_text or filter_text.lower() in str(c.get("id", "")).lower()
        ]
    except ScenarioError as e:
        fail(str(e))
    if not selected:
        fail(f"--filter: no case id contains '{filter_text}'")
    show = not quiet and not json_out and sys.stderr.isatty()
    with Progress(console=err, transient=True, disable=not show) as bar:
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
                        for k in ("n", "median_abs_error_pct", "mean_abs_error_pct", "max_abs_error_pct")
                    },
                    "by_source": runner.summarize_by_source(results),
                },
                indent=2,
            )
        )
    else:
        from simulator.report.validation import print_validation

        print_validation(results, runner.summarize_by_source(results), summary)
        print(runner.summary_line(summary))
    if check and (missed := runner.gate_failures(summary)):
        err.print("[bold red]validation gate missed:[/bold red] " + "; ".join(missed))
        raise typer.Exit(1)
    if summary["failed"] or summary["oom"]:  # a prediction that could not be made is not a pass
        raise typer.Exit(1)


@app.command()
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

    from simulator.study import sweep as sw

    try:
        with shown_warnings():
            if vary:
                base_data, base_dir = sw.load_base(base)
                parsed = [sw.parse_vary(v) for v in vary]
                plan = sw.Sweep(
                    base_data, base_dir, tuple(f for f, _ in parsed), tuple(v for _, v in parsed), zipped
                )
                options: dict = {}
            else:
                plan, options = sw.load_sweep_file(base)
                if zipped:
                    plan = sw.Sweep(plan.base, plan.base_dir, plan.fields, plan.values, True)
    except ScenarioError as e:
        fail(str(e))
    plan, dropped = sw.derived_data_parallel(plan)
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
        check_output_dir(out, "--out")
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
            fail(str(e))
    if report is not None:
        from simulator.study.report import write_sweep_report

        write_sweep_report(rows, list(plan.fields), report, f"Sweep of {plan.base.get('name', base.stem)}")
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
        c.print("results: " + ", ".join(outcome.files) + (f"; report: {report}" if report else ""))
    if outcome.interrupted:
        raise typer.Exit(130)


@app.command()
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
        with shown_warnings():
            gpn = load_topology(topology).node.gpus
            nodes = max(1, gpus // gpn)
            if gpus > gpn and gpus % gpn:
                fail(f"--gpus ({gpus}) is not a whole number of {gpn}-GPU nodes of {topology}")
            data["cluster"]["num_nodes"] = nodes
            # a valid stand-in layout (every GPU data-parallel, one sequence each); the search replaces it
            n = gpus if gpus >= gpn else gpn
            data["parallelism"] = {}
            data["training"] = {**data["training"], "global_batch_size": n}
            base = load_scenario(data)
            show = not quiet and not json_out and sys.stderr.isatty()
            with err.status("screening layouts...") if show else nullcontext():
                result = run_plan(base, n, top=top, batch=global_batch_size)
    except ScenarioError as e:
        fail(str(e))
    if json_out:
        print(json.dumps(result, indent=2, default=str))
        return
    from rich.table import Table

    c = Console(soft_wrap=True)
    c.print(
        f"screened {result['screened']:,} layouts ({result['screened_per_s']:,.0f}/s), "
        f"{result['fit_in_memory']:,} fit in memory by the estimate; the best {result['confirmed']} simulated:"
    )
    t = Table()
    for col in ("#", "layout", "estimate s", "simulated s", "MFU", "memory GiB", "bubble", "exposed comm s"):
        t.add_column(col, justify="left" if col == "layout" else "right", no_wrap=col == "layout")
    for i, r in enumerate(result["top"], 1):
        if r["status"] != "ok":
            t.add_row(str(i), r["layout"], f"{r['estimate_s']:.3f}", r["status"], "", "", "", "")
            continue
        t.add_row(
            str(i),
            r["layout"],
            f"{r['estimate_s']:.3f}",
            f"{r['iteration_time_s']:.3f}",
            f"{r['mfu']:.1%}",
            f"{r['memory_gib']:.1f}",
            f"{r['bubble_fraction']:.1%}",
            f"{r['exposed_comm_s']:.3f}",
        )
    c.print(t)
    c.print(result["why"])


@app.command()
def schema() -> None:
    """Print the JSON Schema of scenario files."""
    print(json.dumps(Scenario.model_json_schema(), indent=2))


def _write_image(result, path: Path) -> None:
    """Static export through plotly + kaleido, which drives a Chromium: say so plainly where it is missing."""
    from simulator.report.figures import timeline_figure

    fig = timeline_figure(result.timeline, f"{result.scenario.name}: {result.metrics.iteration_time_s:.3f} s")
    tmp = temporary_beside(path)
    try:
        fig.write_image(tmp, width=1400, height=fig.layout.height)
        tmp.replace(path)
    except Exception as e:  # kaleido missing, or no Chromium for it to drive
        tmp.unlink(missing_ok=True)
        fail(
            f"--image: static export needs kaleido and a Chromium browser (pip install kaleido; "
            f"apt-get install chromium): {str(e).splitlines()[0][:200]}"
        )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
