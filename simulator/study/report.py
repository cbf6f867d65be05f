"""A sweep's report: each metric against each varied field, the pipeline bubble where the study varies a pipeline,
and the Pareto front of iteration time against GPUs where it varies the GPU count.

One self-contained HTML page (plotly.js inlined once, so it opens offline).
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from simulator.report.figures import figures_html
from simulator.report.output import write_atomic

# (column, axis title)
METRICS = [
    ("iteration_time_s", "iteration time (s)"),
    ("mfu", "MFU"),
    ("tokens_per_s_per_gpu", "tokens/s per GPU"),
    ("memory_gib.peak", "peak memory per GPU (GiB)"),
]
COLOURS = {"ok": "#4C78A8"}


# a study of these fields is a pipeline study (pipeline size, schedule, virtual stages, micro-batches per step)
PIPELINE_FIELDS = ("pipeline", "virtual_pipeline_stages", "global_batch_size", "micro_batch_size")
BUBBLE = ("bubble_fraction", "pipeline bubble (share of the step)")


def study_metrics(rows: list[dict], fields: list[str]) -> list[tuple[str, str]]:
    """The metrics to chart: iteration time, MFU, throughput and memory always; the pipeline bubble where a varied
    field shapes the pipeline and some point has one."""
    piped = any(any(k in f for k in PIPELINE_FIELDS) for f in fields)
    bubbles = any((r.get(BUBBLE[0]) or 0) > 0 for r in rows if r["status"] in ("ok", "oom"))
    return [*METRICS, BUBBLE] if piped and bubbles else list(METRICS)


def metric_figures(rows: list[dict], fields: list[str]) -> list[go.Figure]:
    """One figure per (metric, varied field): the points that simulated, grouped by the next varied field's
    value; out-of-memory points as crosses; invalid ones left out (results.csv has their reasons)."""
    figs = []
    for column, title in study_metrics(rows, fields):
        for f in fields:
            other = next((g for g in fields if g != f), None)
            groups: dict = {}
            for r in rows:
                if r["status"] in ("ok", "oom") and r.get(column) is not None:
                    groups.setdefault(_axis(r[other]) if other else "", []).append(r)
            fig = go.Figure()
            for value, sel in groups.items():
                fig.add_trace(
                    go.Scatter(
                        x=[_category(r[f]) for r in sel],
                        y=[r[column] for r in sel],
                        mode="markers",
                        name=f"{other} = {value}" if other else "points",
                        marker={
                            "size": 10,
                            "symbol": ["x" if r["status"] == "oom" else "circle" for r in sel],
                        },
                        text=[
                            r.get("name", "") + (" (out of memory)" if r["status"] == "oom" else "")
                            for r in sel
                        ],
                        hovertemplate="%{text}<br>%{x}: %{y}<extra></extra>",
                    )
                )
            # the grid's values as categories, evenly spaced in grid order (a numeric axis put 100 and 3,200 Gb/s
            # at the ends with the points between crowded to one side)
            grid = sorted({_category(r[f]): r[f] for r in rows if r.get(f) is not None}.values(), key=_order)
            fig.update_xaxes(
                type="category", categoryorder="array", categoryarray=[_category(v) for v in grid]
            )
            fig.update_layout(
                title=f"{title} vs {f} (crosses: out of memory)",
                xaxis_title=f,
                yaxis_title=title,
                height=380,
                margin={"t": 50},
            )
            figs.append(fig)
    return figs


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points (gpus, time) not beaten by another with no more GPUs and no more time, by GPU count."""
    best: list[tuple[float, float]] = []
    for g, t in sorted(points, key=lambda p: (p[0], p[1])):
        if not best or t < best[-1][1]:
            best.append((g, t))
    return best


def pareto_figure(rows: list[dict]) -> go.Figure:
    ok = [r for r in rows if r["status"] == "ok" and r.get("gpus") and r.get("iteration_time_s")]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[r["gpus"] for r in ok],
            y=[r["iteration_time_s"] for r in ok],
            mode="markers",
            name="points that fit",
            marker={"color": COLOURS["ok"], "size": 8, "opacity": 0.6},
            text=[r.get("name", "") for r in ok],
            hovertemplate="%{text}<br>%{x} GPUs: %{y:.3f} s<extra></extra>",
        )
    )
    front = pareto([(r["gpus"], r["iteration_time_s"]) for r in ok])
    if front:
        fig.add_trace(
            go.Scatter(
                x=[g for g, _ in front],
                y=[t for _, t in front],
                mode="lines+markers",
                name="Pareto front",
                line={"color": "black", "shape": "hv"},
            )
        )
    fig.update_layout(
        title="Iteration time against GPUs: the Pareto front",
        xaxis_title="GPUs",
        yaxis_title="iteration time (s)",
        xaxis_type="log",
        height=450,
    )
    return fig


def write_sweep_report(rows: list[dict], fields: list[str], path: Path, title: str) -> None:
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "oom", "invalid", "error")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    varied_gpus = len({r.get("gpus") for r in rows if r["status"] == "ok"}) > 1  # else no front to draw
    figs = [*([pareto_figure(rows)] if varied_gpus else []), *metric_figures(rows, fields)]
    html = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_escape(title)}</title></head>"
        f"<body style='font-family:sans-serif;margin:20px'><h2>{_escape(title)}</h2>"
        f"<p>{len(rows)} points: {summary}. Varied: {_escape(', '.join(fields))}. Every number is in "
        f"results.csv; invalid points are listed there with their reason.</p>{figures_html(figs, default_width='100%')}</body></html>"
    )
    write_atomic(path, html)


def _axis(v):
    return v if isinstance(v, int | float | str) else str(v)


def _category(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _order(v) -> tuple:
    """Numbers by value, then everything else by its text."""
    return (0, v, "") if isinstance(v, int | float) and not isinstance(v, bool) else (1, 0, str(v))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
