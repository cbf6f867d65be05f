"""``clustersim``: run, compare, memory, validate, calibrate, sweep, plan, schema. One module per command group
(``run.py``, ``memory.py``, ``validate.py``, ``calibrate.py``, ``study.py``, ``plan.py``); this is the entry point that joins them. Bad input
prints one message and exits 2, never a traceback.

The command modules do not use ``from __future__ import annotations``: Typer reads each parameter's annotation,
and strings it would ``eval`` one by one (building the commands, ``typer.main.get_command``, took 31 ms with
them and takes 6 ms without)."""

import gc

# ``clustersim --help`` (and each command's) imports the command modules and Typer only: the simulator (numpy,
# pydantic, the scenario models) is imported inside the command that runs, so the listing does not pay for it
# (0.17 s of imports before 2026-12-06; benchmarks/bench_scale.py). What is imported here lives as long as the
# process: Python's cyclic collector pauses while it is made, and it is then frozen out of every later collection
# (gc.freeze); it resumes as it was. Only the command line does this: ``import simulator`` in a program of one's
# own leaves its collector alone.
_collecting = gc.isenabled()
gc.disable()
try:
    import typer

    from simulator.cli import (
        calibrate_step,  # noqa: F401  (registers `calibrate step`)
        memory,
        plan,
        run,
        study,
        validate,
    )
    from simulator.cli.calibrate import calibrate_app
finally:
    gc.freeze()
    if _collecting:
        gc.enable()

# plain help (Click's formatter): rich's boxed panels cost 60-70 ms of a 0.19 s `clustersim --help`
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Simulate LLM training on GPU clusters.",
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"clustersim {version('clustersim')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print("clustersim (not installed: run from a source tree)")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the installed version and exit."
    ),
) -> None:
    """Simulate LLM training on GPU clusters."""


app.add_typer(calibrate_app, name="calibrate")
for command in (
    run.run,
    run.scenarios,
    run.init,
    run.compare,
    memory.memory,
    validate.validate,
    study.sweep,
    plan.plan,
    run.schema,
):
    # the listing shows the first paragraph of each docstring as one flowing line (Typer would keep its
    # source line breaks: ragged lines in an 80-column terminal)
    app.command(short_help=" ".join((command.__doc__ or "").split("\n\n")[0].split()))(command)


def main() -> None:
    """The ``clustersim`` command. Click's own usage errors (a missing argument, an option out of range) become
    one ``error:`` line and exit status 2, as every other refusal."""
    import sys

    try:  # Typer >= 0.20 carries its own copy of Click
        from typer._click.exceptions import NoArgsIsHelpError, UsageError
    except ImportError:  # pragma: no cover - an older Typer on Click
        from click.exceptions import NoArgsIsHelpError, UsageError

    _skip_final_collection()
    try:
        code = app(standalone_mode=False, prog_name="clustersim")
    except NoArgsIsHelpError as e:
        print(e.ctx.get_help() if e.ctx else "clustersim --help")
        sys.exit(2)
    except UsageError as e:
        where = e.ctx.command_path if e.ctx else "clustersim"
        print(f"error: {where}: {e.format_message()} (see {where} --help)", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _skip_final_collection() -> None:
    """When the process exits, every object the imports and the command made is first moved out of the garbage
    collector's reach (``gc.freeze`` as an atexit handler), so the interpreter's shutdown no longer traverses
    them: that traversal took 55 of the 68 ms the quickstart spent exiting (measured 2026-11-27). Nothing is
    lost: the other atexit handlers (logging, weakref finalizers, pools) still run, the files we write are
    closed by then, and the memory goes back with the process. A caller of ``main()`` that goes on running
    (a test) is not affected until it exits."""
    import atexit
    import gc

    atexit.unregister(gc.freeze)  # once, however often main() runs in one process
    atexit.register(gc.freeze)
