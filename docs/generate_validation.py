"""Make docs/validation.md's figure and table from `clustersim validate`.

Run: python docs/generate_validation.py   (needs Chromium for the PNG: apt-get install chromium)
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from simulator.validation.runner import load_cases, run_cases, summarize, summarize_by_source, summary_line

OUT = Path(__file__).parent / "images"
UNITS = {
    "iteration_time_s": "s/iter",
    "tokens_per_s_per_gpu": "tokens/s/GPU",
    "model_tflops_per_gpu": "TFLOP/s/GPU",
}


def main() -> None:
    results = run_cases(load_cases())
    fig = go.Figure()
    for src in sorted({r.source for r in results}):
        rs = [r for r in results if r.source == src and r.predicted is not None]
        fig.add_trace(
            go.Scatter(
                x=[r.published for r in rs],
                y=[r.predicted for r in rs],
                mode="markers",
                name=src,
                text=[f"{r.id}: {r.error_pct:+.1f}%" for r in rs],
                marker={"size": 9},
            )
        )
    lo = min(min(r.published, r.predicted or r.published) for r in results) * 0.7
    hi = max(max(r.published, r.predicted or r.published) for r in results) * 1.4
    for f, dash in ((1.0, "solid"), (1.15, "dot"), (1 / 1.15, "dot")):
        fig.add_trace(
            go.Scatter(
                x=[lo, hi],
                y=[lo * f, hi * f],
                mode="lines",
                showlegend=f == 1.0,
                name="predicted = published (dotted: ±15%)",
                line={"color": "grey", "dash": dash},
            )
        )
    fig.update_layout(
        title="Predicted vs published (each case in its own metric: s/iter, tokens/s/GPU, TFLOP/s/GPU)",
        xaxis={"type": "log", "title": "published"},
        yaxis={"type": "log", "title": "predicted"},
        width=900,
        height=700,
    )
    OUT.mkdir(exist_ok=True)
    fig.write_image(OUT / "validation-scatter.png")
    print(summary_line(summarize(results)), "\n")
    print("| source | cases | median abs error | mean | max |\n|---|---|---|---|---|")
    for src, s in summarize_by_source(results).items():
        print(
            f"| {src} | {s['n']} | {s['median_abs_error_pct']:.1f}% | {s['mean_abs_error_pct']:.1f}% | {s['max_abs_error_pct']:.1f}% |"
        )
    print("\n| case | metric | published | predicted | error | status |\n|---|---|---|---|---|---|")
    for r in results:
        pred = f"{r.predicted:,.4g}" if r.predicted is not None else "-"
        err = f"{r.error_pct:+.1f}%" if r.error_pct is not None else "-"
        print(f"| {r.id} | {UNITS[r.metric]} | {r.published:,.4g} | {pred} | {err} | {r.status} |")


if __name__ == "__main__":
    main()
