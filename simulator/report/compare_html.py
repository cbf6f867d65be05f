"""The comparison page (``clustersim compare --report``): throughput, memory and breakdown side by side."""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go

from simulator.metrics.metrics import Metrics
from simulator.report.figures import figures_html
from simulator.report.html import STYLE
from simulator.report.output import write_atomic


def compare_figures(results: list[tuple[str, Metrics]]) -> list[go.Figure]:
    """Side by side, as the tables of the Megatron-DeepSpeed report: throughput, peak memory against capacity,
    and the time breakdown with exposed communication."""
    names = [n for n, _ in results]
    ms = [m for _, m in results]
    throughput = go.Figure(
        go.Bar(
            x=names,
            y=[m.samples_per_s for m in ms],
            marker_color="#4C78A8",
            text=[f"{m.samples_per_s:.2f}" for m in ms],
            textposition="outside",
        )
    )
    throughput.update_layout(title="Throughput (samples/s)", height=380)
    memory = go.Figure(
        go.Bar(
            x=names,
            y=[m.memory_gib["peak"] for m in ms],
            marker_color=["#E45756" if m.oom else "#54A24B" for m in ms],
            text=[f"{m.memory_gib['peak']:.1f}" for m in ms],
            textposition="outside",
        )
    )
    memory.add_trace(
        go.Scatter(
            x=names,
            y=[m.memory_gib["capacity"] for m in ms],
            mode="markers",
            marker={"symbol": "line-ew-open", "size": 40, "color": "red"},
            name="capacity",
        )
    )
    memory.update_layout(title="Peak memory per GPU (GiB; red = out of memory)", height=380, showlegend=False)
    breakdown = go.Figure()
    for key, label, colour in (
        ("forward_s", "forward", "#4C78A8"),
        ("backward_s", "backward", "#F58518"),
        ("optimizer_s", "optimizer", "#54A24B"),
    ):
        breakdown.add_trace(
            go.Bar(x=names, y=[m.breakdown[key] for m in ms], name=label, marker_color=colour)
        )
    breakdown.add_trace(
        go.Scatter(
            x=names,
            y=[m.comm["exposed_s"] for m in ms],
            mode="markers",
            name="of which exposed communication",
            marker={"symbol": "diamond", "size": 12, "color": "#E45756"},
        )
    )
    breakdown.update_layout(barmode="stack", title="Iteration time breakdown (s)", height=420)
    return [throughput, memory, breakdown]


def write_compare_report(results: list[tuple[str, Metrics]], path: str | Path) -> None:
    figures = compare_figures(results)
    rows = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{m.iteration_time_s:.3f} s</td><td>{m.tokens_per_s:,.0f}</td>"
        f"<td>{m.mfu:.1%}</td><td>{m.memory_gib['peak']:.1f} GiB</td>"
        f'<td class="{"oom" if m.oom else ""}">{"OOM" if m.oom else "fits"}</td></tr>'
        for n, m in results
    )
    table = (
        "<table><tr><th>scenario</th><th>iteration</th><th>tokens/s</th><th>MFU</th><th>peak memory</th>"
        f"<th>memory</th></tr>{rows}</table>"
    )
    write_atomic(
        Path(path),
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>comparison</title>{STYLE}"
        f"</head><body><h1>Comparison</h1>{table}{figures_html(figures)}</body></html>",
    )
