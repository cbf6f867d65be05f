"""Make docs/validation.md's figures and tables from `clustersim validate`: the built-in published runs and, when
the file is there, the 720 measured small-model runs (../shared/validation/measured-a100-small.yaml).

Run: python docs/generate_validation.py   (needs Chromium for the PNGs: apt-get install chromium)
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


def diagonal(fig: go.Figure, lo: float, hi: float, title: str) -> None:
    """Log-log axes with the predicted = measured line and +-15% dotted lines."""
    for f, dash in ((1.0, "solid"), (1.15, "dot"), (1 / 1.15, "dot")):
        fig.add_trace(
            go.Scatter(
                x=[lo, hi],
                y=[lo * f, hi * f],
                mode="lines",
                showlegend=f == 1.0,
                name="predicted = measured (dotted: ±15%)",
                line={"color": "grey", "dash": dash},
            )
        )
    fig.update_layout(
        title=title,
        xaxis={"type": "log", "title": "published / measured"},
        yaxis={"type": "log", "title": "predicted"},
        width=900,
        height=700,
        legend={"x": 0.01, "y": 0.99, "bgcolor": "rgba(255,255,255,0.8)"},
    )


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
    diagonal(
        fig, lo, hi, "Predicted vs published (each case in its own metric: s/iter, tokens/s/GPU, TFLOP/s/GPU)"
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


SMALL = Path(__file__).resolve().parents[2] / "shared" / "validation" / "measured-a100-small.yaml"


def small_runs(path: Path = SMALL) -> None:
    """The measured small-model runs: summary, mean signed and absolute error by each varied setting, and a
    scatter of predicted against measured iteration time."""
    import statistics

    if not path.is_file():
        print(f"\n{path} not found: small-model section skipped")
        return
    cases = load_cases(path)
    results = run_cases(cases)
    print("\n" + summary_line(summarize(results)))
    errors = [r.error_pct for r in results]
    print(f"mean signed error {statistics.fmean(errors):+.1f}%\n")
    settings = {
        "micro-batch": lambda c: c["training"]["micro_batch_size"],
        "hidden": lambda c: c["model"]["hidden_size"],
        "tensor parallel": lambda c: c["parallelism"]["tensor_parallel"],
        "pipeline parallel": lambda c: c["parallelism"]["pipeline_parallel"],
        "data parallel": lambda c: c["parallelism"]["data_parallel"],
    }
    print(
        "| setting | value | cases | mean signed error | mean abs error | max abs error |\n|---|---|---|---|---|---|"
    )
    for name, key in settings.items():
        groups: dict = {}
        for c, r in zip(cases, results, strict=True):
            groups.setdefault(key(c), []).append(r.error_pct)
        for value, errs in sorted(groups.items()):
            print(
                f"| {name} | {value} | {len(errs)} | {statistics.fmean(errs):+.1f}% | "
                f"{statistics.fmean(abs(e) for e in errs):.1f}% | {max(abs(e) for e in errs):.1f}% |"
            )
    fig = go.Figure(
        go.Scatter(
            x=[r.published for r in results],
            y=[r.predicted for r in results],
            mode="markers",
            text=[f"{r.id}: {r.error_pct:+.1f}%" for r in results],
            marker={
                "size": 5,
                "color": [c["training"]["micro_batch_size"] for c in cases],
                "colorscale": "Viridis",
                "colorbar": {"title": "micro-batch"},
                "showscale": True,
            },
            name="runs",
            showlegend=False,
        )
    )
    diagonal(
        fig,
        0.05,
        3.0,
        "720 measured small-model runs on 2-4 A100 (Megatron-DeepSpeed): predicted vs measured s/iter",
    )
    fig.write_image(OUT / "validation-small.png")


if __name__ == "__main__":
    main()
    small_runs()
