"""``clustersim``: run, compare, memory, validate, calibrate, sweep, plan, schema. One module per command group
(``run.py``, ``memory.py``, ``validate.py``, ``calibrate.py``, ``study.py``); this is the entry point that joins them. Bad input
prints one message and exits 2, never a traceback."""

from __future__ import annotations

import typer

from simulator.cli import memory, run, study, validate
from simulator.cli.calibrate import calibrate_app

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Simulate LLM training on GPU clusters.")
app.add_typer(calibrate_app, name="calibrate")
for command in (
    run.run,
    run.scenarios,
    run.init,
    run.compare,
    memory.memory,
    validate.validate,
    study.sweep,
    study.plan,
    run.schema,
):
    app.command()(command)


def main() -> None:
    app()
