"""Plotly figures of a simulated iteration (used by docs and, later, the HTML report)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import plotly.graph_objects as go

from simulator.timeline.timeline import Timeline

# one colour per kind of work, the same everywhere
COLOURS = {
    "forward": "#4C78A8",
    "backward": "#F58518",
    "weight-gradient": "#EECA3B",
    "recompute": "#72B7B2",
    "optimizer": "#54A24B",
    "all_reduce": "#E45756",
    "reduce_scatter": "#B279A2",
    "all_gather": "#FF9DA6",
    "send_recv": "#9D755D",
}


def _kind(task) -> str:
    if task.kind == "backward" and task.name.startswith("W"):
        return "weight-gradient"
    return task.kind


PLOTLY_JS = Path(__file__).with_name("plotly-basic.min.js")  # plotly.js's basic bundle (plotly-basic.LICENSE)


@cache
def plotly_script() -> str:
    """plotly.js for a self-contained page: the basic bundle (bar and scatter, all reports draw), 1.2 MB instead of
    the full bundle's 4.8 MB; the full one where the file is missing."""
    if PLOTLY_JS.is_file():
        return f"<script type='text/javascript'>{PLOTLY_JS.read_text(encoding='utf-8')}</script>"
    from plotly.offline import get_plotlyjs

    return f"<script type='text/javascript'>{get_plotlyjs()}</script>"


def figures_html(figures: list, **kw) -> str:
    """The figures as one self-contained HTML fragment: plotly.js once, then each figure's div. A vertical legend
    beside the plot (plotly's default) is moved below it, laid out across the figure's width: beside it, long
    trace names ran past the div's right edge and were cut."""
    for fig in figures:
        if fig.layout.showlegend is not False and fig.layout.legend.orientation != "h":
            fig.update_layout(
                legend={"orientation": "h", "yanchor": "top", "y": -0.18, "xanchor": "left", "x": 0}
            )
    parts = [
        fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"panel{i}", **kw)
        for i, fig in enumerate(figures)
    ]
    return plotly_script() + "".join(parts)


def natural(text: str) -> tuple:
    """A sort key that orders the numbers inside ``text`` by value: stage 2 before stage 10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def time_unit(span_s: float) -> tuple[str, float]:
    """The time axis's unit and its factor from seconds: seconds from a 2 s span up (an axis of "10k" ms reads
    badly), milliseconds below."""
    return ("s", 1.0) if span_s >= 2 else ("ms", 1e3)


def timeline_figure(timeline: Timeline, title: str = "", max_tasks: int = 20000) -> go.Figure:
    """Gantt chart: one row per simulated rank and stream, one bar per task, hover with its details."""
    program = timeline.program
    rows: dict[str, dict[str, list]] = {}
    unit, scale = time_unit(timeline.makespan_s)

    def bar(kind: str, row: str, start_s: float, dur_s: float, text: str) -> None:
        d = rows.setdefault(kind, {"y": [], "base": [], "x": [], "text": []})
        d["y"].append(row)
        d["base"].append(start_s * scale)
        d["x"].append(dur_s * scale)
        d["text"].append(f"{text}<br>{dur_s * 1e3:.3f} ms")

    for t in program.tasks[:max_tasks]:
        rank = program.ranks[t.rank].label.split(":")[0]
        start, end = timeline.start[t.id], timeline.end[t.id]
        extra = f"<br>{t.bytes / 2**20:.1f} MiB on {t.group}" if t.is_collective else ""
        bar(_kind(t), f"{rank} · {t.stream}", start, end - start, f"{t.name}{extra}")
        # collectives inside a compute task (tensor-parallel, pipeline send, ring attention): their own rows, one
        # bar per task and collective group, as long as they last together (a step of 12 layers holds dozens of TP
        # collectives: drawn one by one they made a 3D run's report 13 MB); the hover says how many and where
        for sp in timeline.inner_spans(t.id):
            bar(  # as long as they last together, from the first; the hover says where they are spread
                sp.kind,
                f"{rank} · {sp.group} (inside compute)",
                sp.first_s,
                sp.seconds,
                f"{sp.count} x {sp.kind.replace('_', '-')} in {t.name}, spread over "
                f"{(sp.last_s - sp.first_s) * 1e3:.3f} ms<br>{sp.bytes / 2**20:.1f} MiB in all",
            )
    fig = go.Figure()
    for kind, d in rows.items():
        fig.add_trace(
            go.Bar(
                y=d["y"],
                base=d["base"],
                x=d["x"],
                orientation="h",
                name=kind,
                marker_color=COLOURS.get(kind, "#888"),
                hovertext=d["text"],
                hoverinfo="text",
                marker_line_width=0.5 if len(d["x"]) < 500 else 0,
                marker_line_color="white",
            )
        )
    order = sorted({y for d in rows.values() for y in d["y"]}, key=lambda y: (natural(y.split(" · ")[0]), y))
    fig.update_layout(
        title=title,
        barmode="overlay",
        xaxis_title=f"time ({unit})",
        height=120 + 28 * len(order),
        yaxis={"categoryorder": "array", "categoryarray": order[::-1]},
        legend_orientation="h",
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )
    return fig
