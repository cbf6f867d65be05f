"""One self-contained HTML file per run (plotly embedded once, opens offline): headline numbers, timeline,
memory per stage, communication overlapped vs exposed, busiest links over time, and where the groups sit."""

from __future__ import annotations

import html
from collections import defaultdict
from pathlib import Path

import networkx as nx
import plotly.graph_objects as go

from simulator.api import Result
from simulator.metrics.layers import microbatch_view
from simulator.metrics.metrics import Metrics
from simulator.report.figures import COLOURS, figures_html, timeline_figure
from simulator.report.links import bounding_rank, busiest
from simulator.report.output import write_atomic
from simulator.report.racks import RACK_VIEW_GPUS, rack_figure

MEMORY_PARTS = [
    ("params", "parameters"),
    ("grads", "gradients"),
    ("optimizer", "optimizer states"),
    ("activations", "activations"),
    ("buffers", "buffers"),
    ("graphs", "CUDA graph static inputs"),
    ("step_extra", "optimizer step (beyond activations)"),
]


def memory_figure(result: Result) -> go.Figure:
    ranks = result.program.ranks
    labels = [r.label.split(":")[0] for r in ranks]
    fig = go.Figure()
    for key, name in MEMORY_PARTS:
        fig.add_trace(go.Bar(x=labels, y=[getattr(r.memory, key) / 2**30 for r in ranks], name=name))
    capacity = ranks[0].memory.capacity / 2**30
    fig.add_hline(
        y=capacity,
        line_dash="dash",
        line_color="red",
        annotation_text=f"capacity {capacity:.0f} GiB",
        annotation_position="top left",
    )
    oom = [label for label, r in zip(labels, ranks, strict=True) if r.memory.oom]
    verdict = f"OUT OF MEMORY on {', '.join(oom)}" if oom else "fits on every GPU"
    m = max((r.memory for r in ranks), key=lambda mem: mem.host)
    if m.host or m.nvme:  # offload: what the node's host memory and NVMe drives hold
        host = "OUT OF HOST MEMORY" if m.host_oom else "fits"
        verdict += (
            f"<br>host memory per node {m.host / 2**30:.0f} / {m.host_capacity / 2**30:.0f} GiB ({host})"
            + (f", NVMe {m.nvme / 2**30:.0f} GiB" if m.nvme else "")
        )
    fig.update_layout(
        barmode="stack", title=f"Memory per GPU (GiB): {verdict}", yaxis_title="GiB", height=420
    )
    return fig


def comm_figure(result: Result) -> go.Figure:
    items = sorted(result.metrics.comm_by_collective.items())
    names = [k for k, _ in items]
    exposed = [d["exposed_s"] for _, d in items]
    overlapped = [max(d["time_s"] - d["exposed_s"], 0.0) for _, d in items]
    fig = go.Figure(
        [
            go.Bar(
                y=names, x=overlapped, name="overlapped with compute", orientation="h", marker_color="#54A24B"
            ),
            go.Bar(
                y=names, x=exposed, name="exposed (compute waits)", orientation="h", marker_color="#E45756"
            ),
        ]
    )
    fig.update_layout(
        barmode="stack",
        title="Communication per GPU and iteration, by collective and group",
        xaxis_title="seconds",
        height=160 + 40 * len(names),
    )
    return fig


def layers_figure(result: Result) -> go.Figure:
    """One microbatch replayed kernel by kernel: per block and pass, GPU busy, GPU idle waiting for the host to
    issue kernels, and exposed communication (simulator/metrics/layers.py): why a small model is slow."""
    rows = microbatch_view(result)
    labels = [f"{r.block} {r.phase}" + (" (per layer)" if r.block == "layer" else "") for r in rows]
    series = [
        ("GPU busy", "gpu_busy_s", "#4C78A8"),
        ("GPU idle: host still issuing kernels", "host_bound_idle_s", "#F58518"),
        ("exposed communication", "exposed_comm_s", "#E45756"),
    ]
    fig = go.Figure(
        [
            go.Bar(
                y=labels,
                x=[getattr(r, key) * 1e3 for r in rows],
                name=name,
                orientation="h",
                marker_color=colour,
                customdata=[[r.kernels, r.host_issue_s * 1e3] for r in rows],
                hovertemplate="%{x:.3f} ms<br>%{customdata[0]} kernels, host issues them in %{customdata[1]:.3f} ms",
            )
            for name, key, colour in series
        ]
    )
    host = result.compute.framework.host
    per_kernel = (
        f"host {host.forward_kernel_s * 1e6:.0f} / {host.backward_kernel_s * 1e6:.0f} us per kernel "
        "(forward / backward)"
        if host.active
        else "no host cost (ideal profile)"
    )
    fig.update_layout(
        barmode="stack",
        title=f"One microbatch, kernel by kernel ({result.compute.framework.name}: {per_kernel})",
        xaxis_title="milliseconds",
        yaxis={"autorange": "reversed"},
        height=160 + 36 * len(rows),
    )
    return fig


def link_figure(result: Result, top: int = 6, bins: int = 200) -> go.Figure:
    """Utilisation over time of the busiest link classes (report/links.py) of the rank that bounds the step (the
    longest-busy compute stream: a pipeline's slowest stage): its collective tasks and the collectives inside its
    compute steps (tensor-parallel all-reduces, pipeline sends, MoE all-to-alls)."""
    rank = bounding_rank(result)
    xs, ranked = busiest(result, top, bins, rank)
    fig = go.Figure()
    for cls, name, ys in ranked:
        kind = _link_kind(result, cls)
        fig.add_trace(go.Scatter(x=xs, y=[100 * y for y in ys], mode="lines", name=f"{name} ({kind})"))
    fig.update_layout(
        title=f"Busiest links of {bounding_label(result, rank)}: utilisation over the iteration",
        xaxis_title="time (s)",
        yaxis_title="% of bandwidth",
        yaxis_range=[0, 105],
        height=380,
    )
    return fig


def bounding_label(result: Result, rank: int) -> str:
    """'stage 3 (its compute stream busy longest: ...)' where several ranks are simulated (a stage's label where
    the rank has none), else the one rank's label."""
    r = result.program.ranks[rank]
    if len(result.program.ranks) == 1:
        return r.label
    where = f"stage {r.stage}" if r.stage is not None else r.label
    return f"{where} (its compute stream busy longest: the rank that bounds the step)"


def _link_kind(result: Result, cls) -> str:
    g = result.cluster.first_nodes_graph(1)
    for u, v in ((f"n0.{cls[1]}", f"n0.{cls[2]}"),):
        if g.has_edge(u, v):
            return g.edges[u, v]["info"].kind
    return {"cpu": "CPU optimizer", "aio": "NVMe queue"}.get(cls[1], "fabric")


def topology_figure(result: Result, max_nodes: int = 2) -> go.Figure:
    """The first nodes of the graph, GPUs coloured by pipeline stage and labelled with their TP / DP group."""
    g = result.cluster.first_nodes_graph(max_nodes)
    keep = [
        n for n in g if any(n.startswith(f"n{k}.") for k in range(min(max_nodes, result.cluster.num_nodes)))
    ]
    keep += [n for n in g if g.nodes[n]["kind"] in ("leaf", "spine")][:4]
    sub = g.subgraph(keep).copy()
    layer = {
        "spine": 0,
        "leaf": 1,
        "nic": 2,
        "pcie_switch": 3,
        "nvme": 4,
        "cpu": 4,
        "hostmem": 5,
        "gpu": 6,
        "nvswitch": 7,
    }
    for n in sub:
        sub.nodes[n]["layer"] = layer.get(sub.nodes[n]["kind"], 5)
    pos = nx.multipartite_layout(sub, subset_key="layer", align="horizontal", scale=2)
    pos = {n: (x, -y) for n, (x, y) in pos.items()}  # switches on top, GPUs below
    pl = result.placement
    ex, ey = [], []
    for u, v in sub.edges():
        ex += [pos[u][0], pos[v][0], None]
        ey += [pos[u][1], pos[v][1], None]
    fig = go.Figure(
        go.Scatter(
            x=ex, y=ey, mode="lines", line={"color": "#bbb", "width": 1}, hoverinfo="none", showlegend=False
        )
    )
    groups = defaultdict(list)  # GPUs by pipeline stage, other devices by kind
    for n in sub:
        kind = sub.nodes[n]["kind"]
        if kind == "gpu":
            rank = sub.nodes[n]["node"] * result.cluster.gpus_per_node + sub.nodes[n]["local"]
            stage = pl.coordinate(rank, "pp") if rank < pl.world_size else None
            label = f"GPUs of stage {stage}" if stage is not None else "unused GPUs"
            text = (
                (
                    f"{n}<br>stage {stage}, tp rank {pl.coordinate(rank, 'tp')}, cp rank {pl.coordinate(rank, 'cp')}, "
                    f"dp rank {pl.coordinate(rank, 'dp_shard')}"
                )
                if stage is not None
                else n
            )
            groups[label].append((n, text, 16))
        else:
            groups[kind].append((n, n, 9))
    for label, members in groups.items():
        fig.add_trace(
            go.Scatter(
                x=[pos[n][0] for n, _, _ in members],
                y=[pos[n][1] for n, _, _ in members],
                mode="markers",
                name=label,
                text=[t for _, t, _ in members],
                hoverinfo="text",
                marker={"size": members[0][2]},
            )
        )
    fig.update_layout(
        title=f"Topology: first {min(max_nodes, result.cluster.num_nodes)} node(s) of "
        f"{result.cluster.num_nodes} ({result.cluster.spec.name}); hover a GPU for its groups",
        xaxis={"visible": False},
        yaxis={"visible": False},
        height=460,
    )
    return fig


def headline_html(result: Result) -> str:
    m = result.metrics
    cells = [
        ("Iteration time", f"{m.iteration_time_s:.3f} s"),
        ("Tokens/s", f"{m.tokens_per_s:,.0f}"),
        ("Tokens/s per GPU", f"{m.tokens_per_s_per_gpu:,.1f}"),
        ("MFU (16-bit peak)", f"{m.mfu:.1%}"),
        ("GPU busy", f"{m.host.get('gpu_busy_fraction', 0.0):.0%}"),
        ("Pipeline bubble", f"{m.bubble_fraction:.1%}"),
        ("Exposed comm.", f"{m.comm['exposed_s']:.3f} s"),
        ("Peak memory", f"{m.memory_gib['peak']:.1f} / {m.memory_gib['capacity']:.0f} GiB"),
        ("GPUs", f"{m.gpus:,}"),
        ("Strategy", m.strategy),
    ]
    tiles = "".join(
        f'<div class="tile"><div class="v">{html.escape(v)}</div><div class="k">{html.escape(k)}</div></div>'
        for k, v in cells
    )
    from simulator.report.table import error_bar_lines

    bar = "".join(f'<p class="k">{html.escape(line.strip())}</p>' for line in error_bar_lines(m))
    return (
        f'<h1>{html.escape(result.scenario.name)}</h1><div class="tiles">{tiles}</div>{profile_html(m)}{bar}'
    )


def profile_html(m: Metrics) -> str:
    """The framework profile the run used and how it was made: a profile calibrated on a measured step names the
    step and the command that fitted it (clustersim calibrate step)."""
    from simulator.report.table import calibrated_cell

    name = html.escape(m.framework or "ideal")
    if m.framework_calibrated_on is None:
        return f'<p class="k">Framework profile: <b>{name}</b></p>'
    return (
        f'<p class="k">Framework profile: <b>{name}</b>, calibrated on '
        f"{html.escape(calibrated_cell(m.framework_calibrated_on))}: {html.escape(m.framework_fitted)}</p>"
    )


def cost_sources_html(m: Metrics) -> str:
    """Where the costs came from (calibration tables) and the largest modelled ops: what to measure next."""
    src = m.cost_sources
    if not src:
        return ""
    table = m.cost_tables.get("table") or "none (the pure model)"
    shares = "; ".join(
        f"{kind}: " + ", ".join(f"{v:.0%} {k}" for k, v in src[kind].items())
        for kind in ("compute", "communication")
    )
    rows = "".join(
        f"<tr><td>{x['time_per_gpu_s']:.4f} s</td><td>{html.escape(x['kind'])}</td><td>{html.escape(x['op'])}</td></tr>"
        for x in m.largest_modelled
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in m.cost_tables.get("notes", []))
    return (
        f"<h2>Cost sources</h2><p>Cost table: <b>{html.escape(str(table))}</b>. Time by source, {html.escape(shares)}.</p>"
        + (f"<ul>{notes}</ul>" if notes else "")
        + (
            "<p>Largest modelled costs (per GPU per iteration): measure these next "
            "(<code>clustersim calibrate kernels</code>).</p>"
            f"<table><tr><th>time</th><th>kind</th><th>op</th></tr>{rows}</table>"
            if rows
            else ""
        )
    )


STYLE = """<style>body{font-family:system-ui,sans-serif;margin:24px;color:#222}.tiles{display:flex;flex-wrap:wrap;gap:12px}
.tile{border:1px solid #ddd;border-radius:8px;padding:10px 16px;min-width:150px}.v{font-size:22px;font-weight:600}
.k{color:#666;font-size:13px}.oom{color:#c00;font-weight:600}</style>"""


def write_report(result: Result, path: str | Path) -> None:
    figures = [
        timeline_figure(result.timeline, "Timeline: one row per simulated rank and stream", max_tasks=6000),
        layers_figure(result),
        memory_figure(result),
        comm_figure(result),
        link_figure(result),
        topology_figure(result) if result.cluster.gpus_per_node <= RACK_VIEW_GPUS else rack_figure(result),
    ]
    legend = ", ".join(k for k in COLOURS)
    body = (
        headline_html(result)
        + f"<p>Colours by kind: {legend}. Hover any bar for details.</p>"
        + figures_html(figures)
        + cost_sources_html(result.metrics)
    )
    write_atomic(
        Path(path),
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(result.scenario.name)}"
        f"</title>{STYLE}</head><body>{body}</body></html>",
    )
