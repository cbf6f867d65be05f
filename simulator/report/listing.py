"""``clustersim scenarios``: the shipped scenarios at a glance, one line each (GPUs, model, layout, precision and
the first sentence of what it is); ``--json`` gives the whole first sentence and the path."""

from __future__ import annotations

from pathlib import Path

from simulator.errors import ScenarioError
from simulator.hardware.topology import cluster_spec
from simulator.metrics.metrics import layout_label
from simulator.scenario.schema import Scenario
from simulator.scenario.training import ONEBIT_OPTIMIZERS
from simulator.workload.params import active_parameter_count, parameter_count


def gpus_label(s: Scenario) -> str:
    """``1,024 H100``: the GPUs the layout uses, and their type (the topology's GPU profile, its first word)."""
    p = s.parallelism
    gpus = p.tensor_parallel * p.pipeline_parallel * p.context_parallel * p.data_parallel
    return f"{gpus:,} {cluster_spec(s).node.gpu.split('-')[0].upper()}"


def model_label(s: Scenario) -> str:
    """``175B fp16``; a mixture of experts with what one token uses: ``671B/37B bf16`` (NVFP4 as ``nvfp4``)."""
    text = _billions(parameter_count(s))
    if s.model.moe is not None:
        text += f"/{_billions(active_parameter_count(s))}"
    tr = s.training
    return f"{text} {'nvfp4' if tr.precision == 'fp8' and tr.fp8.recipe == 'nvfp4' else tr.precision}"


def _billions(n: int) -> str:
    if n >= 1e12:  # 1T, not 1.01e+03B
        return f"{n / 1e12:.3g}T"
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def strategy_label(s: Scenario) -> str:
    """The layout (``TP8+SP PP8x3 DP16``), expert parallelism, how the data-parallel ranks shard (``ZeRO-3++``
    with any of ZeRO++'s three), what is offloaded (``offload:cpu``, ``offload:nvme``) and a 1-bit optimizer."""
    p, z = s.parallelism, s.parallelism.zero
    parts = [layout_label(s).replace(" x ", " ")]
    if s.model.moe is not None and p.expert_parallel > 1:
        parts.append(f"EP{p.expert_parallel}")
    if p.fsdp is not None:
        parts.append(f"HSDP{p.fsdp.hybrid_shard_size}" if p.fsdp.hybrid_shard_size else "FSDP")
    elif p.zero_stage:
        plus = z.zero_quantized_weights or z.zero_quantized_gradients or z.zero_hpz_partition_size > 1
        parts.append(f"ZeRO-{p.zero_stage}" + ("++" if plus else ""))
        devices = {z.offload_optimizer.device, z.offload_param.device} - {"none"}
        parts += [f"offload:{d}" for d in sorted(devices)]
    if s.training.optimizer in ONEBIT_OPTIMIZERS:
        parts.append(s.training.optimizer)
    return " ".join(parts)


def scenario_rows(shipped: dict[str, Path], root: Path, load, describe) -> list[dict]:
    """One row per shipped scenario: its folder under ``root`` (``published``, ``moe``... or none), name, path, GPUs, model
    (parameters, active ones of a mixture of experts, precision), layout and what it is (``describe``); ``load``
    reads a scenario file."""
    rows = []
    for name, path in shipped.items():
        s = load(path)
        rows.append(
            {
                "set": path.parent.relative_to(root).as_posix().removeprefix("."),
                "name": name,
                "path": str(path),
                "gpus": gpus_label(s),
                "model": model_label(s),
                "layout": strategy_label(s),
                "about": describe(path),
            }
        )
    return rows


def matching(rows: list[dict], text: str | None) -> list[dict]:
    """The rows whose name, folder, GPUs, model or layout contain ``text`` (any case); all without it."""
    if not text:
        return rows
    needle = text.lower()
    keep = [
        r for r in rows if any(needle in r[k].lower() for k in ("name", "set", "gpus", "model", "layout"))
    ]
    if not keep:
        raise ScenarioError(
            f"scenarios: no shipped scenario's name, folder, GPUs, model or layout contains '{text}' "
            "(`clustersim scenarios` lists them all)"
        )
    return keep


# "what it is" is shown where the terminal leaves it this many columns beside the others
ABOUT_MIN_WIDTH = 30


def print_scenarios(rows: list[dict], where: Path) -> None:
    """The rows as a table, one line each, grouped by folder; what it is (cut to the terminal's width) where
    there is room for it. A terminal too narrow for the table (a pipe is 80 columns) gets two lines per
    scenario: its name, then its GPUs, model and layout."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False)
    rows = [{k: escape(v) for k, v in r.items()} for r in rows]
    columns = {"name": "name", "gpus": "GPUs", "model": "model", "layout": "layout"}
    widths = [max(len(header), *(len(r[c]) for r in rows)) for c, header in columns.items()]
    fixed = sum(widths) + 3 * len(widths) + 1  # each column's padding and separator, the right edge
    title = escape(f"Shipped scenarios ({where}); run one by name: clustersim run NAME")
    groups = sorted({r["set"] for r in rows})
    if fixed > console.width:
        console.print(title)
        for group in groups:
            if group:
                console.print(f"\n[bold]{group}/[/bold]")
            for r in (r for r in rows if r["set"] == group):
                console.print(f"  [bold]{r['name']}[/bold]\n    {r['gpus']}, {r['model']}, {r['layout']}")
        return
    room = console.width - fixed - 3
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for header, width in zip(columns.values(), widths, strict=True):
        table.add_column(header, no_wrap=True, min_width=width)
    if room >= ABOUT_MIN_WIDTH:
        table.add_column("what it is", no_wrap=True, overflow="ellipsis", max_width=room)
    for group in groups:
        if group:
            table.add_section()
            table.add_row(f"[bold]{group}/[/bold]")
        for r in (r for r in rows if r["set"] == group):
            table.add_row(*(r[c] for c in columns), *((r["about"],) if room >= ABOUT_MIN_WIDTH else ()))
    console.print(table)
