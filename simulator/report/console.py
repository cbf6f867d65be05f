"""Messages on the terminal's error stream: one line per error (exit code 2, never a traceback) and the
simulator's own warnings. User text is escaped: brackets in a key or a file name are not rich markup."""

from __future__ import annotations

import re
import warnings
from contextlib import contextmanager

import typer


class LazyConsole:
    """A rich Console made on first use: importing rich costs about 20 ms, which a run that prints JSON, or
    nothing on the terminal, need not pay (issue 33's start-up)."""

    def __init__(self, **options):
        self._options, self._console = options, None

    @property
    def real(self):
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name):
        return getattr(self.real, name)


class NoBar:
    """What a progress bar is asked, drawing nothing (``progress`` where nothing is shown)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def add_task(self, *args, **kwargs) -> int:
        return 0

    def advance(self, *args, **kwargs) -> None:
        return None

    def update(self, *args, **kwargs) -> None:
        return None


def progress(show: bool, *columns):
    """A transient rich progress bar on stderr where ``show``; otherwise one that draws nothing, without
    importing rich."""
    if not show:
        return NoBar()
    from rich.progress import Progress

    return Progress(*columns, console=err.real, transient=True)


def escape(text: str) -> str:
    """User text as rich prints it literally (brackets are not markup)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


err = LazyConsole(stderr=True)


def own_warnings() -> tuple[type[Warning], ...]:
    """The simulator's own warning categories (imported where warnings are shown: ``--help`` needs none)."""
    from simulator.scenario.deepspeed import DeepSpeedConfigWarning
    from simulator.scenario.hf_config import HfConfigWarning
    from simulator.tables.format import CostTableWarning

    return (DeepSpeedConfigWarning, CostTableWarning, HfConfigWarning)


def fail(message: str, code: int = 2) -> None:
    """One line on stderr (several problems joined by '; '), exit status ``code`` (2: bad input; 3: a plan with
    nothing to run, errors.NothingFits)."""
    one_line = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    err.print(f"[bold red]error:[/bold red] {escape(shortened(one_line))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


_LONG_WORD = re.compile(r"\S{1001,}")


def shortened(text: str) -> str:
    """``text`` with every word of over 1,000 characters cut to its first 100 and its length (an error message that
    echoes a 5,000-digit argument stays one readable line; a path of a few hundred is shown whole)."""
    return _LONG_WORD.sub(lambda m: f"{m.group()[:100]}...({len(m.group()):,} characters)", text)


def note(label: str, text: str, style: str = "yellow") -> None:
    err.print(f"[{style}]{label}:[/{style}] {escape(text)}", highlight=False, soft_wrap=True)


@contextmanager
def shown_warnings():
    """Print the simulator's own warnings (DeepSpeed keys not modelled, tables used on other hardware), once
    each."""
    own = own_warnings()
    with warnings.catch_warnings(record=True) as caught:
        for category in own:
            warnings.simplefilter("always", category)
        try:
            yield
        finally:
            seen = set()
            for w in caught:
                text = str(w.message)
                if issubclass(w.category, own) and text not in seen:
                    seen.add(text)
                    note("warning", text)
