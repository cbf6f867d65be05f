"""Tables for ``clustersim validate``: every case, then a summary per source and overall."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from simulator.validation.runner import CaseResult

UNITS = {
    "iteration_time_s": "s/iter",
    "tokens_per_s_per_gpu": "tokens/s/GPU",
    "model_tflops_per_gpu": "TFLOP/s/GPU",
}


def _err(e: float | None) -> str:
    if e is None:
        return "-"
    colour = "green" if abs(e) <= 5 else "yellow" if abs(e) <= 15 else "red"
    return f"[{colour}]{e:+.1f}%[/{colour}]"


def print_validation(
    results: list[CaseResult], by_source: dict, overall: dict, console: Console | None = None
) -> None:
    console = console or Console()
    cases = Table(title="Predicted vs published", header_style="bold")
    for col, just in (
        ("case", "left"),
        ("metric", "left"),
        ("published", "right"),
        ("predicted", "right"),
        ("error", "right"),
        ("status", "left"),
    ):
        cases.add_column(col, justify=just)
    for r in results:
        predicted = f"{r.predicted:,.4g}" if r.predicted is not None else "-"
        status = r.status if r.status == "ok" else f"[red]{r.status}[/red] {r.message[:70]}"
        cases.add_row(r.id, UNITS[r.metric], f"{r.published:,.4g}", predicted, _err(r.error_pct), status)
    console.print(cases)
    summary = Table(title="Absolute error by source", header_style="bold")
    for col in ("source", "cases", "median", "mean", "max", "failed"):
        summary.add_column(col, justify="left" if col == "source" else "right")
    for name, s in [*by_source.items(), ("all", overall)]:
        if not s["n"]:
            summary.add_row(name, "0", "-", "-", "-", str(s["failed"]))
            continue
        summary.add_row(
            name,
            str(s["n"]),
            f"{s['median_abs_error_pct']:.1f}%",
            f"{s['mean_abs_error_pct']:.1f}%",
            f"{s['max_abs_error_pct']:.1f}%",
            str(s["failed"]),
        )
    console.print(summary)
