"""Terminal output: one rich table per run, or scenarios side by side."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from simulator.metrics.metrics import Metrics

# (label, getter, format) rows shared by `run` and `compare`
ROWS = [
    ("Strategy", lambda m: m.strategy, "{}"),
    ("GPUs", lambda m: m.gpus, "{:,}"),
    ("Parameters", lambda m: m.params_billion, "{:.2f} B"),
    ("Iteration time", lambda m: m.iteration_time_s, "{:.3f} s"),
    ("Tokens/s", lambda m: m.tokens_per_s, "{:,.0f}"),
    ("Tokens/s per GPU", lambda m: m.tokens_per_s_per_gpu, "{:,.1f}"),
    ("Samples/s", lambda m: m.samples_per_s, "{:,.2f}"),
    ("Model TFLOP/s per GPU", lambda m: m.model_tflops_per_gpu, "{:.1f}"),
    ("MFU", lambda m: m.mfu, "{:.1%}"),
    ("HFU", lambda m: m.hfu, "{:.1%}"),
    ("TFLOP/s per GPU (Narayanan Eq. 3)", lambda m: m.tflops_per_gpu_narayanan_eq3, "{:.1f}"),
    ("Pipeline bubble", lambda m: m.bubble_fraction, "{:.1%}"),
    ("Forward", lambda m: m.breakdown["forward_s"], "{:.3f} s"),
    ("Backward", lambda m: m.breakdown["backward_s"], "{:.3f} s"),
    ("Optimizer", lambda m: m.breakdown["optimizer_s"], "{:.3f} s"),
    ("Communication exposed", lambda m: m.comm["exposed_s"], "{:.3f} s"),
    ("Communication overlapped", lambda m: m.comm["overlapped_s"], "{:.3f} s"),
    ("Bytes sent per GPU", lambda m: m.comm["bytes_per_gpu"] / 2**30, "{:.2f} GiB"),
    ("Memory: parameters", lambda m: m.memory_gib["params"], "{:.2f} GiB"),
    ("Memory: gradients", lambda m: m.memory_gib["grads"], "{:.2f} GiB"),
    ("Memory: optimizer states", lambda m: m.memory_gib["optimizer"], "{:.2f} GiB"),
    ("Memory: activations", lambda m: m.memory_gib["activations"], "{:.2f} GiB"),
    ("Memory: buffers", lambda m: m.memory_gib["buffers"], "{:.2f} GiB"),
    (
        "Memory: peak / capacity",
        lambda m: (m.memory_gib["peak"], m.memory_gib["capacity"]),
        "{0[0]:.2f} / {0[1]:.0f} GiB",
    ),
    ("Fits in memory", lambda m: "no (OUT OF MEMORY)" if m.oom else "yes", "{}"),
    ("Simulated events", lambda m: m.events, "{:,}"),
    ("Simulator wall time", lambda m: m.wall_s, "{:.3f} s"),
]


def metrics_table(results: list[tuple[str, Metrics]]) -> Table:
    table = Table(show_header=True, header_style="bold")
    table.add_column("Metric")
    for name, _ in results:
        table.add_column(name, justify="right")
    for label, get, fmt in ROWS:
        cells = []
        for _, m in results:
            text = fmt.format(get(m))
            cells.append(f"[red]{text}[/red]" if label == "Fits in memory" and m.oom else text)
        table.add_row(label, *cells)
    return table


def stages_table(m: Metrics, most: int = 16) -> Table:
    """Per pipeline stage: bubble, time in sends / receives, peak memory and the out-of-memory verdict."""
    table = Table(title="Pipeline stages", show_header=True, header_style="bold")
    for col in ("Stage", "Bubble", "Send/recv", "Exposed comm.", "Peak memory", "Fits"):
        table.add_column(col, justify="right" if col != "Stage" else "left")
    shown = m.stages if len(m.stages) <= most else m.stages[: most // 2] + m.stages[-most // 2 :]
    for i, st in enumerate(shown):
        if len(m.stages) > most and i == most // 2:
            table.add_row(f"... {len(m.stages) - most} more", "", "", "", "", "")
        table.add_row(
            st["rank"][:60],
            f"{st['bubble_fraction']:.1%}",
            f"{st['p2p_s']:.3f} s",
            f"{st['exposed_comm_s']:.3f} s",
            f"{st['memory_peak_gib']:.1f} GiB",
            "[red]no[/red]" if st["oom"] else "yes",
        )
    return table


def print_table(results: list[tuple[str, Metrics]], console: Console | None = None) -> None:
    console = console or Console()
    console.print(metrics_table(results))
    if len(results) == 1 and len(results[0][1].stages) > 1:
        console.print(stages_table(results[0][1]))
