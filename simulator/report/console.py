"""Messages on the terminal's error stream: one line per error (exit code 2, never a traceback) and the
simulator's own warnings. User text is escaped: brackets in a key or a file name are not rich markup."""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape

from simulator.scenario.deepspeed import DeepSpeedConfigWarning
from simulator.scenario.hf_config import HfConfigWarning
from simulator.tables.format import CostTableWarning

err = Console(stderr=True)
OWN_WARNINGS = (DeepSpeedConfigWarning, CostTableWarning, HfConfigWarning)


def fail(message: str) -> None:
    """One line on stderr (several problems joined by '; '), exit status 2."""
    one_line = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    err.print(f"[bold red]error:[/bold red] {escape(one_line)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def note(label: str, text: str, style: str = "yellow") -> None:
    err.print(f"[{style}]{label}:[/{style}] {escape(text)}", highlight=False, soft_wrap=True)


@contextmanager
def shown_warnings():
    """Print the simulator's own warnings (DeepSpeed keys not modelled, tables used on other hardware), once
    each."""
    with warnings.catch_warnings(record=True) as caught:
        for category in OWN_WARNINGS:
            warnings.simplefilter("always", category)
        try:
            yield
        finally:
            seen = set()
            for w in caught:
                text = str(w.message)
                if issubclass(w.category, OWN_WARNINGS) and text not in seen:
                    seen.add(text)
                    note("warning", text)
