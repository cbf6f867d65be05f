"""The cluster rack by rack, for nodes too big to draw link by link (an NVL72 rack's 72 GPUs and 18 NVLink
switches): each rack (a node of the graph: one NVLink domain) a block of GPU squares coloured by pipeline stage,
labelled with its NICs; racks side by side, joined by the scale-out network."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from simulator.api import Result

# nodes of more GPUs than this are drawn rack by rack (report/html.py picks this figure or the graph's)
RACK_VIEW_GPUS = 16


def rack_figure(result: Result, max_racks: int = 8) -> go.Figure:
    """The first ``max_racks`` racks: every GPU a square in its rack's block, coloured by pipeline stage, with its
    rank and its tensor-, context- and data-parallel coordinates on hover."""
    c, pl = result.cluster, result.placement
    gpn, racks = c.gpus_per_node, min(max_racks, c.num_nodes)
    cols = math.ceil(math.sqrt(gpn))
    rows = math.ceil(gpn / cols)
    ranks = np.arange(racks * gpn)
    used = ranks < pl.world_size
    inside = ranks[used]
    axes = {a: pl.coordinates_of(inside, a) for a in ("pp", "tp", "cp", "dp_shard")}
    stage = np.full(ranks.shape, -1)
    stage[used] = axes["pp"]
    x = ranks // gpn * (cols + 2) + ranks % gpn % cols
    y = -(ranks % gpn // cols)
    fig = go.Figure()
    for s in sorted(set(stage.tolist())):
        pick = stage == s
        text = []
        for r in ranks[pick]:
            if s < 0:
                text.append(f"rank {r}: unused")
                continue
            i = int(np.searchsorted(inside, r))
            text.append(
                f"rack {r // gpn}, GPU {r % gpn}: rank {r}<br>stage {s}, tp rank {axes['tp'][i]}, "
                f"cp rank {axes['cp'][i]}, dp rank {axes['dp_shard'][i]}"
            )
        fig.add_trace(
            go.Scatter(
                x=x[pick],
                y=y[pick],
                mode="markers",
                name=f"GPUs of stage {s}" if s >= 0 else "unused GPUs",
                text=text,
                hoverinfo="text",
                marker={"symbol": "square", "size": 11},
            )
        )
    node = c.spec.node
    for k in range(racks):
        left = k * (cols + 2) - 0.7
        fig.add_shape(
            type="rect", x0=left, x1=left + cols + 0.4, y0=0.7, y1=-rows + 0.3, line={"color": "#888"}
        )
        fig.add_annotation(
            x=left + (cols + 0.4) / 2,
            y=1.4,
            showarrow=False,
            text=f"rack {k}",
            font={"size": 11},
        )
    fig.update_layout(
        title=f"Racks: first {racks} of {c.num_nodes} ({c.spec.name}: {gpn} GPUs a rack on one NVLink domain, "
        f"{node.nics} x {node.nic_bandwidth_gbps:g} Gb/s NICs a rack to the scale-out network)<br>"
        "GPUs coloured by pipeline stage; hover one for its rank and groups",
        xaxis={"visible": False},
        yaxis={"visible": False, "scaleanchor": "x"},
        height=200 + 32 * rows,
    )
    return fig
