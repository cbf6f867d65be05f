"""``clustersim run`` and its neighbours: simulate one scenario (``run``), several side by side (``compare``), list
the shipped ones (``scenarios``), write a starter (``init``), print the scenario schema (``schema``)."""

import json
import sys
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from simulator import paths
from simulator.cli.common import (
    EXIT_OUT_OF_MEMORY,
    FRAMEWORK_HELP,
    KERNELS_HELP,
    KERNELS_ONLY_HELP,
    PRICE_HELP,
    TOKENS_HELP,
    with_goal,
    with_kernels,
)
from simulator.errors import ScenarioError
from simulator.report.console import err, fail, progress, shown_warnings


def run(
    scenario: Annotated[
        Path,
        typer.Argument(help="Scenario YAML file, or a shipped scenario's name (`clustersim scenarios`)."),
    ],
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of a table.")
    ] = False,
    trace: Annotated[
        Path | None,
        typer.Option(help="Write a Chrome-trace JSON file (Perfetto); one ending in .gz is gzip-compressed."),
    ] = None,
    report: Annotated[Path | None, typer.Option(help="Write a self-contained HTML report.")] = None,
    image: Annotated[
        Path | None, typer.Option(help="Write the timeline as a static image (.png or .svg).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress display.")] = False,
    deepspeed_config: Annotated[
        Path | None, typer.Option("--deepspeed-config", help="A DeepSpeed JSON config to take settings from.")
    ] = None,
    kernels: Annotated[str | None, typer.Option("--kernels", help=KERNELS_HELP)] = None,
    kernels_only: Annotated[str | None, typer.Option("--kernels-only", help=KERNELS_ONLY_HELP)] = None,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact", help="Replay every micro-batch instead of extrapolating a periodic schedule (slower)."
        ),
    ] = False,
    tokens: Annotated[str | None, typer.Option("--tokens", help=TOKENS_HELP)] = None,
    price: Annotated[float | None, typer.Option("--price", help=PRICE_HELP)] = None,
    framework: Annotated[str | None, typer.Option("--framework", help=FRAMEWORK_HELP)] = None,
) -> None:
    """Simulate one training iteration of SCENARIO. Exits 3 when the run does not fit in memory (the output
    starts with that and with changes that would fit), 2 on bad input."""
    from simulator.api import simulate
    from simulator.report.output import check_output_file
    from simulator.report.table import print_oom_headline, print_table
    from simulator.report.trace import write_trace
    from simulator.scenario.loader import load_scenario

    if image and image.suffix.lower() not in (".png", ".svg", ".pdf"):
        fail(f"--image: use a .png, .svg or .pdf file name (got {image.name})")
    try:
        for path, option in ((trace, "--trace"), (report, "--report"), (image, "--image")):
            if path is not None:
                check_output_file(path, option)
        with shown_warnings():
            s = with_kernels(
                load_scenario(scenario, deepspeed_config=deepspeed_config, framework=framework),
                kernels,
                kernels_only,
            )
            s = with_goal(s, tokens, price)
            # a trace, report or image shows every micro-batch, --exact asks for it: no periodic extrapolation
            every = bool(trace or report or image or exact)
            if quiet or not sys.stderr.isatty():
                result = simulate(s, periodic=not every)
            else:
                with err.status(f"simulating {s.name} ({s.cluster.num_nodes} nodes)..."):
                    result = simulate(s, periodic=not every)
        if trace:
            write_trace(result, trace)
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
        if result.scenario.note:
            extra["note"] = result.scenario.note
        print(
            json.dumps({"name": result.scenario.name, **m.to_dict(), **extra, "microbatch": layers}, indent=2)
        )
    else:
        if fixes is not None:
            print_oom_headline(m, fixes)
        print_table([(result.scenario.name, m)])
        from rich.console import Console

        if result.scenario.note:
            Console(soft_wrap=True).print(f"note: {result.scenario.note}", markup=False, highlight=False)
        if trace:
            Console().print(f"trace written to {trace} (open it in https://ui.perfetto.dev)")
        if report:
            Console().print(f"report written to {report}")
        if exact:
            micro = result.scenario.gradient_accumulation_steps
            Console().print(
                f"exact: every one of the {micro:,} micro-batches replayed: {m.tasks:,} tasks, {m.wall_s:.2f} s "
                "(without --exact a periodic schedule is simulated on a few short runs and extrapolated)",
                markup=False,
                highlight=False,
            )
    if fixes is not None:
        raise typer.Exit(EXIT_OUT_OF_MEMORY)


def scenarios(
    match: Annotated[
        str | None,
        typer.Argument(
            help="Only the scenarios whose name, folder, GPUs, model or layout contain this (h100, moe, fp8)."
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
) -> None:
    """List the scenarios that ship with clustersim, one line each; run one by name (`clustersim run quickstart`)."""
    from simulator.report.listing import matching, print_scenarios, scenario_rows
    from simulator.scenario.loader import load_scenario
    from simulator.scenario.shipped import describe, scenario_dir, shipped_scenarios

    try:
        rows = matching(scenario_rows(shipped_scenarios(), scenario_dir(), load_scenario, describe), match)
    except ScenarioError as e:
        fail(str(e))
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    print_scenarios(rows, scenario_dir())


def init(
    path: Annotated[Path, typer.Argument(help="File to write.")] = Path("scenario.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter scenario (GPT-3 1.3B on one DGX A100) to edit and run."""
    from simulator.report.output import check_output_file, write_atomic
    from simulator.scenario.shipped import STARTER

    try:
        if paths.exists(path, "init") and not force:
            fail(f"{path}: exists (use --force to overwrite)")
        check_output_file(path, "init")
        from simulator.hardware.topology import TOPOLOGY_DIR

        shipped = ", ".join(sorted(p.stem for p in TOPOLOGY_DIR.glob("*.yaml")))
        write_atomic(path, STARTER.format(name=path, stem=path.stem, topologies=shipped))
    except ScenarioError as e:
        fail(str(e))
    from rich.console import Console

    Console().print(f"wrote {path}; run it with: clustersim run {path}")


def compare(
    scenarios: Annotated[list[Path], typer.Argument(help="Two or more scenario YAML files.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    report: Annotated[Path | None, typer.Option(help="Write a self-contained HTML comparison.")] = None,
    kernels: Annotated[str | None, typer.Option("--kernels", help=KERNELS_HELP)] = None,
    kernels_only: Annotated[str | None, typer.Option("--kernels-only", help=KERNELS_ONLY_HELP)] = None,
    tokens: Annotated[str | None, typer.Option("--tokens", help=TOKENS_HELP)] = None,
    price: Annotated[float | None, typer.Option("--price", help=PRICE_HELP)] = None,
    framework: Annotated[str | None, typer.Option("--framework", help=FRAMEWORK_HELP)] = None,
) -> None:
    """Simulate several scenarios and show their metrics side by side. Every scenario is shown; exits 3 (as
    `run` does) when any of them does not fit in memory, naming them on stderr."""
    from simulator.api import simulate
    from simulator.report.output import check_output_file
    from simulator.report.table import print_table
    from simulator.scenario.loader import load_scenario

    try:
        if report is not None:
            check_output_file(report, "--report")
        loaded = [
            with_goal(
                with_kernels(load_scenario(p, framework=framework), kernels, kernels_only), tokens, price
            )
            for p in scenarios
        ]
    except ScenarioError as e:
        fail(str(e))
    results = []
    show = not quiet and sys.stderr.isatty() and len(loaded) > 1
    with shown_warnings(), progress(show) as bar:
        task = bar.add_task("simulating", total=len(loaded))
        for s in loaded:
            try:
                results.append((s.name, simulate(s).metrics))
            except ScenarioError as e:
                fail(f"{s.name}: {e}")
            bar.advance(task)
    if report:
        from simulator.report.compare_html import write_compare_report

        try:  # a target checked up front may still fail to take the bytes (a full disk, /dev/full)
            write_compare_report(results, report)
        except ScenarioError as e:
            fail(str(e))
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


def schema() -> None:
    """Print the JSON Schema of scenario files."""
    from simulator.scenario.schema import Scenario

    print(json.dumps(Scenario.model_json_schema(), indent=2))


def _write_image(result, path: Path) -> None:
    """Static export through plotly + kaleido, which drives a Chromium: say so plainly where it is missing."""
    from simulator.report.figures import timeline_figure
    from simulator.report.output import temporary_beside

    fig = timeline_figure(result.timeline, f"{result.scenario.name}: {result.metrics.iteration_time_s:.3f} s")
    tmp = temporary_beside(path)
    try:
        fig.write_image(tmp, width=1400, height=fig.layout.height)
    except Exception as e:  # kaleido missing, or no Chromium for it to drive
        tmp.unlink(missing_ok=True)
        fail(
            f"--image: static export needs kaleido and a Chromium browser (pip install kaleido; "
            f"apt-get install chromium): {str(e).splitlines()[0][:200]}"
        )
    try:
        paths.install(tmp, path, "--image")
    except ScenarioError as e:
        fail(str(e))
