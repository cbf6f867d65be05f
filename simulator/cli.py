"""``clustersim``: run, compare, schema. Bad input prints one message and exits 2, never a traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from simulator.api import simulate
from simulator.errors import ScenarioError
from simulator.report.table import print_table
from simulator.report.trace import write_trace
from simulator.scenario.loader import load_scenario
from simulator.scenario.schema import Scenario

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Simulate LLM training on GPU clusters.")
err = Console(stderr=True)


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/bold red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of a table.")
    ] = False,
    trace: Annotated[Path | None, typer.Option(help="Write a Chrome-trace JSON file (Perfetto).")] = None,
) -> None:
    """Simulate one training iteration of SCENARIO."""
    try:
        result = simulate(load_scenario(scenario))
    except ScenarioError as e:
        _fail(str(e))
    if trace:
        write_trace(result.timeline, trace)
    if json_out:
        print(json.dumps({"name": result.scenario.name, **result.metrics.to_dict()}, indent=2))
    else:
        print_table([(result.scenario.name, result.metrics)])
        if trace:
            Console().print(f"trace written to {trace} (open it in https://ui.perfetto.dev)")


@app.command()
def compare(
    scenarios: Annotated[list[Path], typer.Argument(help="Two or more scenario YAML files.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Simulate several scenarios and show their metrics side by side."""
    try:
        loaded = [load_scenario(p) for p in scenarios]
    except ScenarioError as e:
        _fail(str(e))
    results = []
    show = not quiet and sys.stderr.isatty() and len(loaded) > 1
    with Progress(console=err, transient=True, disable=not show) as bar:
        task = bar.add_task("simulating", total=len(loaded))
        for s in loaded:
            try:
                results.append((s.name, simulate(s).metrics))
            except ScenarioError as e:
                _fail(f"{s.name}: {e}")
            bar.advance(task)
    if json_out:
        print(json.dumps([{"name": n, **m.to_dict()} for n, m in results], indent=2))
    else:
        print_table(results)


@app.command()
def schema() -> None:
    """Print the JSON Schema of scenario files."""
    print(json.dumps(Scenario.model_json_schema(), indent=2))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
