"""Terminal output: one rich table per run, or scenarios side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.metrics.metrics import Metrics

if TYPE_CHECKING:  # rich is imported where a table is drawn (20 ms a JSON run need not pay)
    from rich.console import Console
    from rich.table import Table


def _offloads(m: Metrics) -> bool:
    return bool(m.memory_gib["host"] or m.memory_gib["nvme"])


def _moe(m: Metrics) -> bool:
    return m.moe is not None


def _train(m: Metrics) -> bool:
    return m.train is not None


def _cost(m: Metrics) -> bool:
    return bool(m.train and m.train["cost_usd"])


def _fp8(m: Metrics) -> bool:
    return m.fp8 is not None


def calibrated_cell(on: dict | None) -> str:
    """The measured step a calibrated profile was fitted to, as a table cell: '8 a100-sxm4-80gb, bf16'."""
    return f"one measured step: {on['gpus']:,} {on['gpu']}, {on['precision']}" if on else "-"


def _phased(m: Metrics) -> bool:
    return m.amortised_iteration_time_s is not None


def _tokens(n: float) -> str:
    """1.5e13 -> 15T."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= scale:
            return f"{n / scale:,.3g}{suffix}"
    return f"{n:,.0f}"


_SOURCES = "{0[measured]:.0%} / {0[interpolated]:.0%} / {0[modelled]:.0%}"


def _bar(kind: str):
    """The row's getter: the |error| of the run's cell on measured runs the code had not seen
    (simulator/validation/accuracy.py); a star where the cell shown is a wider neighbour's."""

    def get(m: Metrics) -> str:
        g = (m.accuracy or {}).get(kind)
        if not g:
            return "none"
        star = "*" if g.get("note") else ""
        return f"{g['median_abs_pct']:.1f}% / {g['p90_abs_pct']:.1f}%, {g['n']:,} runs{star}"

    return get


def _lean(value: float, more: str, less: str) -> str:
    """+2.5, 'runs faster', 'runs slower' -> 'runs 2.5% faster'."""
    verb, rest = (more if value > 0 else less).split(" ", 1)
    return f"{verb} {abs(value):.1f}% {rest}"


def error_bar_lines(m: Metrics) -> list[str]:
    """Where the error bar comes from: the cell (profile, GPU generation, job size) whose unseen runs it sums up,
    why it is another cell's where the run's own holds too few, the files they come from, and which way the
    simulation leans on them."""
    if not m.accuracy:
        return [
            f"Error bar: none: the {m.framework or 'ideal'} profile is a bound, not a prediction of a measured run "
            "(docs/validation.md)."
        ]
    lines = []
    for kind, what, lean in (
        ("speed", "Speed", ("runs faster", "runs slower")),
        ("memory", "Memory", ("needs more memory", "needs less memory")),
    ):
        g = m.accuracy.get(kind)
        if not g:
            continue
        sets = ", ".join(f"{k} {v:,}" for k, v in g["sets"].items())
        note = f" ({g['note']})" if g.get("note") else ""
        lines.append(
            f"{what} error bar: {g['scope']}{note}, {g['n']:,} measured runs the code had not seen (each at the "
            f"worse of first contact and left out of every fit; {sets}): |error| {g['median_abs_pct']:.1f}% median, "
            f"{g['p90_abs_pct']:.1f}% p90, {g['max_abs_pct']:.1f}% max; on average the simulation "
            f"{_lean(g['mean_signed_pct'], *lean)} than measured."
        )
    return [*lines, "  (docs/validation.md; simulator/validation/accuracy.yaml)"]


# (label, getter, format[, shown only when some result satisfies this]) rows shared by `run` and `compare`
ROWS = [
    ("Strategy", lambda m: m.strategy, "{}"),
    ("GPUs", lambda m: m.gpus, "{:,}"),
    ("Parameters", lambda m: m.params_billion, "{:.2f} B"),
    ("Iteration time", lambda m: m.iteration_time_s, "{:.3f} s"),
    (
        "Iteration time, amortised over all steps",
        lambda m: m.amortised_iteration_time_s or m.iteration_time_s,
        "{:.3f} s",
        _phased,
    ),
    ("Tokens/s", lambda m: m.tokens_per_s, "{:,.0f}"),
    ("Tokens/s per GPU", lambda m: m.tokens_per_s_per_gpu, "{:,.1f}"),
    ("Samples/s", lambda m: m.samples_per_s, "{:,.2f}"),
    (
        "Time to train",
        lambda m: (m.train["days"], _tokens(m.train["tokens"])) if m.train else (0.0, "-"),
        "{0[0]:,.1f} days for {0[1]} tokens",
        _train,
    ),
    ("GPU-hours to train", lambda m: m.train["gpu_hours"] if m.train else 0.0, "{:,.0f}", _train),
    (
        "Cost to train",
        lambda m: (
            (m.train["cost_usd"] or 0.0, m.train["price_per_gpu_hour"] or 0.0) if m.train else (0.0, 0.0)
        ),
        "${0[0]:,.0f} at ${0[1]:.2f}/GPU-hour",
        _cost,
    ),
    ("Model TFLOP/s per GPU", lambda m: m.model_tflops_per_gpu, "{:.1f}"),
    ("MFU (vs the 16-bit dense peak)", lambda m: m.mfu, "{:.1%}"),
    (
        "MFU vs the FP8 / FP4 peak",
        lambda m: f"{m.fp8['mfu_vs_low_precision_peak']:.1%}" if m.fp8 else "-",  # a bf16 run beside: none
        "{}",
        _fp8,
    ),
    (
        "Low precision (recipe, library)",
        lambda m: f"{m.fp8['gemm_dtype']} ({m.fp8['recipe']}, {m.fp8['library']})" if m.fp8 else "-",
        "{}",
        _fp8,
    ),
    ("HFU", lambda m: m.hfu, "{:.1%}"),
    ("TFLOP/s per GPU (Narayanan Eq. 3)", lambda m: m.tflops_per_gpu_narayanan_eq3, "{:.1f}"),
    ("Pipeline bubble", lambda m: m.bubble_fraction, "{:.1%}"),
    ("Framework profile", lambda m: m.framework or "ideal", "{}"),
    (
        "Profile calibrated on",
        lambda m: calibrated_cell(m.framework_calibrated_on),
        "{}",
        lambda m: m.framework_calibrated_on is not None,
    ),
    ("Attention", lambda m: m.attention, "{}"),
    ("GPU busy (compute stream)", lambda m: m.host.get("gpu_busy_fraction", 0.0), "{:.1%}"),
    ("GPU idle waiting for the host", lambda m: m.host.get("host_bound_idle_s", 0.0), "{:.3f} s"),
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
        "Memory: CUDA graph static inputs",
        lambda m: m.memory_gib.get("graphs", 0.0),
        "{:.2f} GiB",
        lambda m: bool(m.memory_gib.get("graphs", 0.0)),
    ),
    (
        "Memory: optimizer-step temporaries",
        lambda m: m.memory_gib.get("step", 0.0),
        "{:.2f} GiB",
        lambda m: bool(m.memory_gib.get("step", 0.0)),
    ),
    ("Memory: peak allocated", lambda m: m.memory_gib["peak"], "{:.2f} GiB"),
    (
        "Memory: held by the allocator (reserved)",
        lambda m: m.memory_gib.get("reserved", m.memory_gib["peak"]),
        "{:.2f} GiB",
    ),
    (
        "Memory: CUDA context + NCCL buffers",
        lambda m: (m.memory_gib["context"], m.memory_gib["nccl"]),
        "{0[0]:.2f} + {0[1]:.2f} GiB",
    ),
    (
        "Memory: device total / capacity",
        lambda m: (m.memory_gib["device"], m.memory_gib["capacity"]),
        "{0[0]:.2f} / {0[1]:.0f} GiB",
    ),
    ("Fits in memory", lambda m: "no (OUT OF MEMORY)" if m.oom else "yes", "{}"),
    (
        "Host memory per node (offload)",
        lambda m: (m.memory_gib["host"], m.memory_gib["host_capacity"]),
        "{0[0]:.1f} / {0[1]:.0f} GiB",
        _offloads,
    ),
    ("NVMe per node (offload)", lambda m: m.memory_gib["nvme"], "{:.1f} GiB", _offloads),
    ("Fits in host memory", lambda m: "no (OUT OF HOST MEMORY)" if m.host_oom else "yes", "{}", _offloads),
    ("Copied to/from host per GPU", lambda m: m.comm["bytes_host_per_gpu"] / 2**30, "{:.2f} GiB", _offloads),
    (
        "MoE: busiest expert-parallel rank / mean",
        lambda m: f"{m.moe['busiest_rank_load']:.2f}x" if m.moe else "-",
        "{}",
        _moe,
    ),
    (
        "MoE: tokens dropped (capacity)",
        lambda m: f"{m.moe['tokens_dropped_fraction']:.1%}" if m.moe else "-",
        "{}",
        _moe,
    ),
    (
        "MoE: expert-parallel comm. / exposed",
        lambda m: f"{m.moe['expert_comm_s']:.3f} / {m.moe['expert_comm_exposed_s']:.3f} s" if m.moe else "-",
        "{}",
        _moe,
    ),
    ("Speed error bar, median / p90", _bar("speed"), "{}"),
    (
        "Memory error bar, median / p90",
        _bar("memory"),
        "{}",
        lambda m: bool((m.accuracy or {}).get("memory")),
    ),
    ("Cost table", lambda m: m.cost_tables.get("table") or "none (pure model)", "{}"),
    ("Compute time: measured / interp. / modelled", lambda m: m.cost_sources["compute"], _SOURCES),
    ("Comm. time: measured / interp. / modelled", lambda m: m.cost_sources["communication"], _SOURCES),
    ("Ranks simulated / tasks replayed", lambda m: (m.ranks_simulated, m.tasks), "{0[0]:,} / {0[1]:,}"),
    (
        "Micro-batches simulated (periodic)",
        lambda m: (
            f"{', '.join(map(str, m.periodic['simulated']))} of {m.periodic['microbatches']:,}, extrapolated"
            if m.periodic
            else "every one"
        ),
        "{}",
        lambda m: m.periodic is not None,
    ),
    ("SimPy events (communication)", lambda m: m.events, "{:,}"),
    ("Simulator wall time", lambda m: m.wall_s, "{:.3f} s"),
]


def metrics_table(results: list[tuple[str, Metrics]]) -> Table:
    from rich.markup import escape
    from rich.table import Table

    table = Table(show_header=True, header_style="bold")
    table.add_column("Metric")
    for name, _ in results:
        table.add_column(escape(name), justify="right")  # a scenario's name is the user's text, not markup
    for label, get, fmt, *shown in ROWS:
        if shown and not any(shown[0](m) for _, m in results):
            continue
        cells = []
        for _, m in results:
            text = fmt.format(get(m))
            bad = (label == "Fits in memory" and m.oom) or (label == "Fits in host memory" and m.host_oom)
            cells.append(f"[red]{text}[/red]" if bad else text)
        table.add_row(label, *cells)
    return table


def stages_table(m: Metrics, most: int = 16) -> Table:
    """Per pipeline stage: bubble, time in sends / receives, peak memory and the out-of-memory verdict."""
    from rich.table import Table

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


def phases_table(m: Metrics) -> Table:
    """1-bit / 0/1 Adam: each kind of step, how many of them, and the average over the run."""
    from rich.table import Table

    table = Table(title="Optimizer phases", show_header=True, header_style="bold")
    for col in ("Phase", "Steps", "Iteration time", "Bytes sent per GPU", "Exposed comm."):
        table.add_column(col, justify="right" if col != "Phase" else "left")
    for ph in m.optimizer_phases:
        table.add_row(
            ph["phase"],
            "-" if ph["steps"] is None else f"{ph['steps']:,}",
            f"{ph['iteration_time_s']:.3f} s",
            f"{ph['bytes_per_gpu'] / 2**30:.3f} GiB",
            f"{ph['exposed_comm_s']:.3f} s",
        )
    if m.amortised_iteration_time_s is not None:
        steps = sum(ph["steps"] for ph in m.optimizer_phases)
        table.add_row(f"amortised over {steps:,} steps", "", f"{m.amortised_iteration_time_s:.3f} s", "", "")
    return table


def largest_modelled_lines(m: Metrics, most: int = 3) -> list[str]:
    """What to measure next: the modelled ops that take the most time, when a cost table was used."""
    if not m.cost_tables.get("table") or not m.largest_modelled:
        return []
    lines = ["Largest modelled costs (measure these next):"]
    for x in m.largest_modelled[:most]:
        lines.append(f"  {x['time_per_gpu_s']:.3f} s per GPU  {x['kind']}: {x['op']}")
    lines += [f"  note: {n}" for n in m.cost_tables.get("notes", [])]
    return lines


def print_table(results: list[tuple[str, Metrics]], console: Console | None = None) -> None:
    from rich.console import Console

    console = console or Console()
    console.print(metrics_table(results))
    if len(results) == 1:
        for line in (*error_bar_lines(results[0][1]), *largest_modelled_lines(results[0][1])):
            console.print(line, highlight=False, markup=False, soft_wrap=True)
    if len(results) == 1 and len(results[0][1].stages) > 1:
        console.print(stages_table(results[0][1]))
    if len(results) == 1 and results[0][1].optimizer_phases:
        console.print(phases_table(results[0][1]))


def print_oom_headline(m: Metrics, fixes) -> None:
    """Out of memory first, before any throughput: the peak against the capacity, its largest parts, and the
    changes that would fit (simulator/study/fit.py)."""
    from rich.console import Console
    from rich.markup import escape

    console = Console()
    g = m.memory_gib
    if m.oom:
        parts = sorted(
            (
                (k, g[k])
                for k in ("params", "grads", "optimizer", "activations", "buffers", "graphs", "step_extra")
            ),
            key=lambda kv: -kv[1],
        )
        detail = ", ".join(f"{k} {v:,.1f}" for k, v in parts[:3] if v > 0)
        outside = g["device"] - g["peak"]
        console.print(
            f"[bold red]OUT OF MEMORY:[/bold red] {g['device']:,.1f} GiB per GPU > {g['capacity']:.0f} GiB: "
            f"peak allocation {g['peak']:,.1f} ({detail}) + {outside:,.1f} GiB of CUDA context, NCCL buffers and "
            "any allocator reserve you set; the times below are for a GPU that large.",
            highlight=False,
        )
    if m.host_oom:
        console.print(
            f"[bold red]OUT OF HOST MEMORY:[/bold red] offloaded states {g['host']:,.1f} GiB per node > "
            f"{g['host_capacity']:.0f} GiB.",
            highlight=False,
        )
    if fixes:
        console.print(
            "Would fit: "
            + "; ".join(f"[bold]{escape(f.change)}[/bold] ({f.device_gib:.1f} GiB)" for f in fixes)
            + " (cheapest first: ZeRO-1 / 2 move no more bytes than DDP; ZeRO-3 gathers the weights at every layer; "
            "full recompute runs the forward twice; more GPUs cost GPUs)",
            highlight=False,
        )
    else:
        console.print(
            "No nearby change fits: try `clustersim plan` for this model and GPU count.", highlight=False
        )
