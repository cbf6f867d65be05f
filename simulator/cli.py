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
    err.print(f"[bold red]error:[/bold red] {message}", highlight=False, soft_wrap=True)
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
                    err.print(f"[yellow]warning:[/yellow] {text}", highlight=False, soft_wrap=True)


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
    err.print(f"fitting {', '.join(names)} on {len(chosen)} cases: {', '.join(c['id'] for c in chosen)}")
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
