"""``clustersim``: run, compare, schema. Bad input prints one message and exits 2, never a traceback."""

from __future__ import annotations

import json
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from simulator.api import simulate
from simulator.calibration.table import CostTableWarning, check_choice
from simulator.errors import ScenarioError
from simulator.report.table import print_table
from simulator.report.trace import write_trace
from simulator.scenario.deepspeed import DeepSpeedConfigWarning
from simulator.scenario.loader import load_scenario
from simulator.scenario.schema import Scenario

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Simulate LLM training on GPU clusters.")
err = Console(stderr=True)


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


KERNELS_HELP = (
    "Measured costs: a table directory, a shipped table's name, 'auto' (the shipped table of the cluster's GPU, "
    "the default) or 'none' (the pure model)."
)


@contextmanager
def _shown_warnings():
    """Print the simulator's own warnings (DeepSpeed keys not modelled, tables used on other hardware)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeepSpeedConfigWarning)
        warnings.simplefilter("always", CostTableWarning)
        try:
            yield
        finally:
            seen = set()
            for w in caught:
                text = str(w.message)
                if issubclass(w.category, (DeepSpeedConfigWarning, CostTableWarning)) and text not in seen:
                    seen.add(text)
                    err.print(f"[yellow]warning:[/yellow] {escape(text)}", highlight=False, soft_wrap=True)


def _with_kernels(s: Scenario, kernels: str | None) -> Scenario:
    """The scenario with ``--kernels`` applied (a directory is relative to the working directory)."""
    if kernels is None:
        return s
    return s.model_copy(update={"kernels": check_choice(kernels, "--kernels")})


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
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
    """Simulate one training iteration of SCENARIO."""
    if image and image.suffix.lower() not in (".png", ".svg", ".pdf"):
        _fail(f"--image: use a .png, .svg or .pdf file name (got {image.name})")
    try:
        with _shown_warnings():
            s = _with_kernels(load_scenario(scenario, deepspeed_config=deepspeed_config), kernels)
            if quiet or not sys.stderr.isatty():
                result = simulate(s)
            else:
                with err.status(f"simulating {s.name} ({s.cluster.num_nodes} nodes)..."):
                    result = simulate(s)
    except ScenarioError as e:
        _fail(str(e))
    if trace:
        write_trace(result.timeline, trace)
    if report:
        from simulator.report.html import write_report

        write_report(result, report)
    if image:
        _write_image(result, image)
    if json_out:
        print(json.dumps({"name": result.scenario.name, **result.metrics.to_dict()}, indent=2))
    else:
        print_table([(result.scenario.name, result.metrics)])
        if trace:
            Console().print(f"trace written to {trace} (open it in https://ui.perfetto.dev)")
        if report:
            Console().print(f"report written to {report}")


@app.command()
def compare(
    scenarios: Annotated[list[Path], typer.Argument(help="Two or more scenario YAML files.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    report: Annotated[Path | None, typer.Option(help="Write a self-contained HTML comparison.")] = None,
    kernels: Annotated[str | None, typer.Option("--kernels", help=KERNELS_HELP)] = None,
) -> None:
    """Simulate several scenarios and show their metrics side by side."""
    try:
        loaded = [_with_kernels(load_scenario(p), kernels) for p in scenarios]
    except ScenarioError as e:
        _fail(str(e))
    results = []
    show = not quiet and sys.stderr.isatty() and len(loaded) > 1
    with _shown_warnings(), Progress(console=err, transient=True, disable=not show) as bar:
        task = bar.add_task("simulating", total=len(loaded))
        for s in loaded:
            try:
                results.append((s.name, simulate(s).metrics))
            except ScenarioError as e:
                _fail(f"{s.name}: {e}")
            bar.advance(task)
    if report:
        from simulator.report.html import write_compare_report

        write_compare_report(results, report)
    if json_out:
        print(json.dumps([{"name": n, **m.to_dict()} for n, m in results], indent=2))
    else:
        print_table(results)


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
    """Predict published measured runs and report the error, case by case and per source."""
    from simulator.validation import runner

    try:
        kernels = check_choice(kernels, "--kernels") if kernels is not None else None
        selected = [
            c
            for c in runner.load_cases(cases)
            if not filter_text or filter_text.lower() in str(c.get("id", "")).lower()
        ]
    except ScenarioError as e:
        _fail(str(e))
    if not selected:
        _fail(f"--filter: no case id contains '{filter_text}'")
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


calibrate_app = typer.Typer(
    no_args_is_help=True,
    help="Ground the cost model in measurements: fit framework profiles, time kernels, import measured tables.",
)
app.add_typer(calibrate_app, name="calibrate")


@calibrate_app.command("profile")
def calibrate_profile(
    filter_text: Annotated[
        str, typer.Option("--filter", help="Comma-separated case ids (or id fragments) to fit on.")
    ],
    framework: Annotated[
        str, typer.Option(help="Profile to start from (and name the result after).")
    ] = "ideal",
    params: Annotated[
        str, typer.Option(help="Comma-separated parameters to fit.")
    ] = "gemm_efficiency,memory_efficiency",
    gpu: Annotated[
        str | None, typer.Option(help="Fit the profile's factors for this GPU only (catalogue name).")
    ] = None,
    cases: Annotated[
        Path | None, typer.Option(help="Cases file (default: the built-in published runs).")
    ] = None,
    write: Annotated[Path | None, typer.Option(help="Write the fitted profile to this YAML file.")] = None,
) -> None:
    """Fit a framework-generation profile to measured runs (least squares on log error)."""
    import yaml

    from simulator.frameworks import get_framework
    from simulator.hardware.gpus import get_gpu
    from simulator.validation import calibrate as cal
    from simulator.validation import runner

    try:
        start = get_framework(framework)
        if gpu:
            get_gpu(gpu, "--gpu")
        wanted = [f.strip().lower() for f in filter_text.split(",") if f.strip()]
        chosen = [
            c for c in runner.load_cases(cases) if any(w in str(c.get("id", "")).lower() for w in wanted)
        ]
    except ScenarioError as e:
        _fail(str(e))
    names = [x.strip() for x in params.split(",") if x.strip()]
    unknown = [x for x in names if x not in cal.BOUNDS]
    if unknown:
        _fail(f"--params: unknown {', '.join(unknown)}; fittable: {', '.join(cal.BOUNDS)}")
    if not chosen:
        _fail(f"--filter: no case id contains any of {filter_text}")
    err.print(
        escape(f"fitting {', '.join(names)} on {len(chosen)} cases: {', '.join(c['id'] for c in chosen)}")
    )
    with Progress(console=err, transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("fitting", total=None)
        fitted = cal.fit(
            chosen, start, names, progress=lambda msg: bar.update(task, description=msg), gpu=gpu
        )
    before, after = runner.run_cases(chosen, framework=start), runner.run_cases(chosen, framework=fitted)
    for name in names:
        print(
            f"{name}{f' on {gpu}' if gpu else ''}: {cal.value_of(start, name, gpu):.4g} -> {cal.value_of(fitted, name, gpu):.4g}"
        )
    print("before: " + runner.summary_line(runner.summarize(before)))
    print("after:  " + runner.summary_line(runner.summarize(after)))
    if write:
        how = f"clustersim calibrate profile --params {','.join(names)} --filter {filter_text}"
        if gpu:
            fitted = cal.with_value(fitted, "fitted", how, gpu)
        else:
            fitted = fitted.model_copy(update={"fitted": how})
        write.write_text(yaml.safe_dump(fitted.model_dump(exclude_defaults=True), sort_keys=False))
        print(f"profile written to {write}")


@calibrate_app.command("kernels")
def calibrate_kernels(
    scenario: Annotated[
        Path, typer.Argument(help="Scenario YAML file whose kernels and collectives to time.")
    ],
    out: Annotated[Path, typer.Option(help="Table directory to write (an existing one is resumed).")],
    device: Annotated[str, typer.Option(help="cuda (this machine's GPUs) or cpu.")] = "cuda",
    repeats: Annotated[
        int, typer.Option(min=1, max=10000, help="Timed calls per shape (the median is kept).")
    ] = 20,
    max_bytes: Annotated[
        float | None,
        typer.Option(
            help="Largest memory-bound working set timed whole (default 8 GiB on GPUs, 1 GiB on CPU)."
        ),
    ] = None,
    collectives: Annotated[
        bool, typer.Option(help="Also time the collectives (one process per rank).")
    ] = True,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Time every kernel shape and collective SCENARIO's simulation costs, on this machine, into a table."""
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from simulator.calibration.runner import calibrate_kernels as run_calibration
    from simulator.calibration.runner import require_torch

    if device not in ("cuda", "cpu"):
        _fail(f"--device: use cuda or cpu (got {device})")
    try:
        require_torch()
        s = load_scenario(scenario)
        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
        columns += (TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        show = not quiet and sys.stderr.isatty()
        with Progress(*columns, console=err, transient=True, disable=not show) as bar:
            task = bar.add_task("measuring", total=None)

            def progress(done: int, total: int, what: str) -> None:
                bar.update(task, completed=done, total=total, description=what[:50])

            summary = run_calibration(s, out, device, repeats, max_bytes, progress, collectives)
    except ScenarioError as e:
        _fail(str(e))
    t = summary.table
    print(
        f"{out}: {len(t.kernels)} kernel rows, {len(t.collectives)} collective rows "
        f"({summary.measured} measured now, {summary.kept} kept from before)"
    )
    for line in summary.skipped[:10]:
        err.print(f"[yellow]not measured:[/yellow] {escape(line)}", highlight=False, soft_wrap=True)
    if len(summary.skipped) > 10:
        err.print(f"[yellow]not measured:[/yellow] ... and {len(summary.skipped) - 10} more", highlight=False)
    if summary.interrupted:
        err.print("interrupted: what was measured is saved; run the same command again to resume")
        raise typer.Exit(130)
    print(f"use it: clustersim run {scenario} --kernels {out}")


import_app = typer.Typer(no_args_is_help=True, help="Turn measurements made elsewhere into cost-table rows.")
calibrate_app.add_typer(import_app, name="import")


def _report_import(table, added: int, notes: dict[str, int], out: Path) -> None:
    for what, count in sorted(notes.items(), key=lambda kv: -kv[1])[:8]:
        err.print(f"[yellow]not imported:[/yellow] {count} x {escape(what)}", highlight=False, soft_wrap=True)
    print(
        f"{out}: {added} rows added; the table has {len(table.kernels)} kernel and {len(table.collectives)} collective rows"
    )
    print(f"use it: clustersim run SCENARIO.yaml --kernels {out}")


@import_app.command("kineto")
def import_kineto(
    trace: Annotated[
        Path,
        typer.Argument(
            help="PyTorch profiler Chrome trace (.json or .json.gz), recorded with record_shapes=True."
        ),
    ],
    out: Annotated[Path, typer.Option(help="Table directory to write or add to.")],
    gpu: Annotated[
        str | None, typer.Option(help="GPU catalogue name (default: from the trace's device name).")
    ] = None,
    ranks: Annotated[
        int | None, typer.Option(min=2, help="Group size of collectives the trace does not record (gloo).")
    ] = None,
    nodes: Annotated[int, typer.Option(min=1, help="Nodes the traced collectives spanned.")] = 1,
    ranks_per_node: Annotated[
        int | None, typer.Option(min=1, help="Ranks per node (default: ranks / nodes).")
    ] = None,
    licence: Annotated[
        str, typer.Option(help="Licence of the numbers, for the table's sources.")
    ] = "the measurer's own",
) -> None:
    """Kernel rows (and NCCL collective rows) from a PyTorch profiler trace."""
    from simulator.calibration.importers import match_gpu, merge_into
    from simulator.calibration.importers.kineto import import_trace
    from simulator.calibration.table import SourceInfo
    from simulator.hardware.gpus import get_gpu

    try:
        if gpu:
            get_gpu(gpu, "--gpu")
        kernels, colls, info = import_trace(trace, ranks, nodes, ranks_per_node)
        model = str(info["device"].get("name", "")) if info["gpu_trace"] else "cpu"
        gpu = gpu or (match_gpu(model) if info["gpu_trace"] else "cpu")
        source = SourceInfo(
            rows=f"{len(kernels)} kernel, {len(colls)} collective",
            source=f"PyTorch profiler trace {trace.name}",
            licence=licence,
        )
        table = merge_into(out, kernels, colls, source, model, gpu)
    except ScenarioError as e:
        _fail(str(e))
    if not gpu:
        err.print(
            f"[yellow]warning:[/yellow] device '{model}' is not in the GPU catalogue; pass --gpu so runs pick the table"
        )
    _report_import(table, len(kernels) + len(colls), info["skipped"], out)


@import_app.command("nccl-tests")
def import_nccl_tests(
    logs: Annotated[list[Path], typer.Argument(help="nccl-tests output files (text, or JSON from -J).")],
    out: Annotated[Path, typer.Option(help="Table directory to write or add to.")],
    op: Annotated[
        str | None, typer.Option(help="Which test, where the log does not say: all_reduce, all_gather, ...")
    ] = None,
    ranks: Annotated[
        int | None, typer.Option(min=2, help="Ranks, where the log has no '#  Rank' lines.")
    ] = None,
    nodes: Annotated[
        int | None, typer.Option(min=1, help="Nodes (default: distinct hosts in the log).")
    ] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU catalogue name of the machine measured.")] = None,
    topology: Annotated[
        str | None, typer.Option(help="Topology the rows describe (rows across nodes apply only to it).")
    ] = None,
    licence: Annotated[
        str, typer.Option(help="Licence of the numbers, for the table's sources.")
    ] = "the measurer's own",
) -> None:
    """Collective rows from nccl-tests logs (both column layouts, MPI / Slurm prefixes, JSON output)."""
    from simulator.calibration.importers import merge_into
    from simulator.calibration.importers.nccl_tests import parse_nccl_tests
    from simulator.calibration.table import COLLECTIVE_OPS, SourceInfo, SystemInfo
    from simulator.hardware.gpus import get_gpu
    from simulator.hardware.topology import load_topology

    if op is not None and op not in COLLECTIVE_OPS:
        _fail(f"--op: '{op}' is not one of {', '.join(COLLECTIVE_OPS)}")
    try:
        if gpu:
            get_gpu(gpu, "--gpu")
        system = SystemInfo()
        if topology:
            spec = load_topology(topology)
            system = SystemInfo(
                topology=spec.name,
                intra_node=spec.node.intra_node,
                nics_per_node=spec.node.nics,
                nic_bandwidth_gbps=spec.node.nic_bandwidth_gbps,
                nic_kind=spec.node.nic_kind,
            )
            gpu = gpu or spec.node.gpu
        rows = [r for log in logs for r in parse_nccl_tests(log, op, ranks, nodes)]
        source = SourceInfo(
            rows=f"{len(rows)} collective",
            source="nccl-tests: " + ", ".join(p.name for p in logs),
            licence=licence,
        )
        table = merge_into(out, [], rows, source, gpu=gpu, system=system)
    except ScenarioError as e:
        _fail(str(e))
    _report_import(table, len(rows), {}, out)


@app.command()
def schema() -> None:
    """Print the JSON Schema of scenario files."""
    print(json.dumps(Scenario.model_json_schema(), indent=2))


def _write_image(result, path: Path) -> None:
    """Static export through plotly + kaleido, which drives a Chromium: say so plainly where it is missing."""
    from simulator.report.figures import timeline_figure

    fig = timeline_figure(result.timeline, f"{result.scenario.name}: {result.metrics.iteration_time_s:.3f} s")
    try:
        fig.write_image(path, width=1400, height=fig.layout.height)
    except Exception as e:  # kaleido missing, or no Chromium for it to drive
        _fail(
            f"--image: static export needs kaleido and a Chromium browser (pip install kaleido; "
            f"apt-get install chromium): {str(e).splitlines()[0][:200]}"
        )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
