"""``clustersim memory``: per-GPU memory of a scenario across data-parallel strategies and recompute choices."""

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from simulator.cli.common import FRAMEWORK_HELP
from simulator.errors import ScenarioError
from simulator.report.console import escape, fail, progress


def memory(
    scenario: Annotated[
        Path,
        typer.Argument(help="Scenario YAML file, or a shipped scenario's name (`clustersim scenarios`)."),
    ],
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress display.")] = False,
    framework: Annotated[str | None, typer.Option("--framework", help=FRAMEWORK_HELP)] = None,
) -> None:
    """Per-GPU memory of SCENARIO under DDP, ZeRO-1/2/3, FSDP and ZeRO-3 with offload, each with no, selective
    and full activation recompute: what fits on its GPUs (memory only; nothing is simulated)."""
    from simulator.scenario.loader import load_scenario
    from simulator.study.memory_table import memory_table

    try:
        s = load_scenario(scenario, framework=framework)
        show = not quiet and not json_out and sys.stderr.isatty()
        with progress(show) as bar:
            task = bar.add_task("building programs", total=None)
            rows = memory_table(s, lambda text: bar.update(task, description=text))
    except ScenarioError as e:
        fail(str(e))
    if json_out:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    capacity = next((r.gib["capacity"] for r in rows if r.gib), 0.0)
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{escape(s.name)}: GiB per GPU ({capacity:.0f} GiB GPUs)", show_edge=False, pad_edge=False
    )
    for name in ("strategy", "recompute", "params", "grads", "optim.", "activ.", "other", "total", "fits"):
        table.add_column(name, justify="left" if name in ("strategy", "recompute") else "right")
    previous = None
    for r in rows:
        if r.gib is None:
            continue
        label = "" if r.strategy == previous else escape(r.strategy)
        previous = r.strategy
        if r.current:
            label = f"[bold]{label or '  '} *[/bold]"
        g = r.gib
        cells = [f"{g[k]:.1f}" for k in ("params", "grads", "optimizer", "activations", "other", "device")]
        fits = "yes" if r.fits else "[red]no[/red]"
        table.add_row(label, r.recompute, *cells, fits, end_section=r.recompute == "full")
    Console().print(table)
    print(
        "* the scenario as given. other: buffers, CUDA context, NCCL, allocator reserve. Offload keeps the rest in "
        "host memory or on NVMe."
    )
    for r in rows:
        if r.gib is None:
            print(f"{r.strategy}: not with this scenario: {r.reason}")
