"""``clustersim calibrate``: ground the cost model in measurements.

calibrate kernels S.yaml --out DIR      time S's kernels and collectives on this machine (calibration/runner.py)
calibrate import kineto | nccl-tests    rows from measurements made elsewhere (calibration/importers/)
calibrate profile --filter IDS          fit a framework-generation profile to measured runs (validation/)
"""

import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from simulator.errors import ScenarioError
from simulator.report.console import err, escape, fail, note, progress

calibrate_app = typer.Typer(
    rich_markup_mode=None,
    no_args_is_help=True,
    help="Ground the cost model in measurements: fit framework profiles, time kernels, import measured tables.",
)


@calibrate_app.command("profile")
def calibrate_profile(
    filter_text: Annotated[
        str, typer.Option("--filter", help="Comma-separated case ids (or id fragments) to fit on.")
    ],
    framework: Annotated[
        str, typer.Option(help="Profile to start from (and name the result after).")
    ] = "ideal",
    params: Annotated[
        str, typer.Option(help="Comma-separated parameters to fit.")
    ] = "gemm_efficiency,memory_efficiency",
    gpu: Annotated[
        str | None, typer.Option(help="Fit the profile's factors for this GPU only (catalogue name).")
    ] = None,
    cases: Annotated[
        Path | None, typer.Option(help="Cases file (default: the built-in published runs).")
    ] = None,
    write: Annotated[Path | None, typer.Option(help="Write the fitted profile to this YAML file.")] = None,
) -> None:
    """Fit a framework-generation profile to measured runs (least squares on log error)."""
    import yaml

    from simulator.frameworks import get_framework
    from simulator.hardware.gpus import get_gpu
    from simulator.report.output import check_output_file, write_atomic
    from simulator.validation import calibrate as cal
    from simulator.validation import runner

    try:
        if write is not None:
            check_output_file(write, "--write")
        start = get_framework(framework)
        if gpu:
            get_gpu(gpu, "--gpu")
        wanted = [f.strip().lower() for f in filter_text.split(",") if f.strip()]
        chosen = [
            c for c in runner.load_cases(cases) if any(w in str(c.get("id", "")).lower() for w in wanted)
        ]
    except ScenarioError as e:
        fail(str(e))
    names = [x.strip() for x in params.split(",") if x.strip()]
    unknown = [x for x in names if x not in cal.BOUNDS]
    if unknown:
        fail(f"--params: unknown {', '.join(unknown)}; fittable: {', '.join(cal.BOUNDS)}")
    if not chosen:
        fail(f"--filter: no case id contains any of {filter_text}")
    err.print(
        escape(f"fitting {', '.join(names)} on {len(chosen)} cases: {', '.join(c['id'] for c in chosen)}")
    )
    with progress(sys.stderr.isatty()) as bar:
        task = bar.add_task("fitting", total=None)
        fitted = cal.fit(
            chosen, start, names, progress=lambda msg: bar.update(task, description=msg), gpu=gpu
        )
    before, after = runner.run_cases(chosen, framework=start), runner.run_cases(chosen, framework=fitted)
    for name in names:
        print(
            f"{name}{f' on {gpu}' if gpu else ''}: {cal.value_of(start, name, gpu):.4g} -> {cal.value_of(fitted, name, gpu):.4g}"
        )
    print("before: " + runner.summary_line(runner.summarize(before)))
    print("after:  " + runner.summary_line(runner.summarize(after)))
    if write:
        how = f"clustersim calibrate profile --params {','.join(names)} --filter {filter_text}"
        if gpu:
            fitted = cal.with_value(fitted, "fitted", how, gpu)
        else:
            fitted = fitted.model_copy(update={"fitted": how})
        # named after its file, so that `framework: path/to/NAME.yaml` reads as the profile NAME
        fitted = fitted.model_copy(update={"name": write.stem})
        write_atomic(write, yaml.safe_dump(fitted.model_dump(exclude_defaults=True), sort_keys=False))
        print(f"profile written to {write}")


@calibrate_app.command("kernels")
def calibrate_kernels(
    scenario: Annotated[
        Path, typer.Argument(help="Scenario YAML file whose kernels and collectives to time.")
    ],
    out: Annotated[Path, typer.Option(help="Table directory to write (an existing one is resumed).")],
    device: Annotated[str, typer.Option(help="cuda (this machine's GPUs) or cpu.")] = "cuda",
    repeats: Annotated[
        int, typer.Option(min=1, max=10000, help="Timed calls per shape (the median is kept).")
    ] = 20,
    max_bytes: Annotated[
        float | None,
        typer.Option(
            help="Largest memory-bound working set timed whole (default 8 GiB on GPUs, 1 GiB on CPU)."
        ),
    ] = None,
    collectives: Annotated[
        bool, typer.Option(help="Also time the collectives (one process per rank).")
    ] = True,
    dtype: Annotated[
        str | None,
        typer.Option(
            help="Time the scenario in this precision instead of its own: bf16, fp16, fp32, or fp8 (its linear "
            "layers' GEMMs through torch._scaled_mm, the rest in bf16; needs an FP8 GPU)."
        ),
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            help="Stop starting new shapes after this long (90s, 10m, 1h30m); what is timed is saved and a later "
            "run goes on from it."
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Time every kernel shape and collective SCENARIO's simulation costs, on this machine, into a table."""
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from simulator.calibration.runner import calibrate_kernels as run_calibration
    from simulator.calibration.runner import require_torch
    from simulator.scenario.loader import load_scenario

    if device not in ("cuda", "cpu"):
        fail(f"--device: use cuda or cpu (got {device})")
    try:
        if dtype is not None and dtype not in ("bf16", "fp16", "fp32", "fp8"):
            fail(f"--dtype: use bf16, fp16, fp32 or fp8 (got {dtype})")
        if dtype == "fp8" and device != "cuda":
            fail(
                "--dtype fp8: FP8 GEMMs run on a GPU with FP8 tensor cores (torch._scaled_mm); use --device cuda"
            )
        budget_s = parse_duration(budget, "--budget") if budget is not None else None
        require_torch()
        s = load_scenario(scenario) if dtype is None else with_precision(scenario, dtype)
        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
        columns += (TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        show = not quiet and sys.stderr.isatty()
        with progress(show, *columns) as bar:
            task = bar.add_task("measuring", total=None)

            def advance(done: int, total: int, what: str) -> None:
                bar.update(task, completed=done, total=total, description=what[:50])

            def announce(summary, shapes: int) -> None:
                if shapes and not quiet:
                    cap = f"; --budget {budget} stops it at {duration(budget_s)}" if budget_s else ""
                    err.print(
                        f"{shapes} shapes to time on {device} ({summary.kept} kept from before): about "
                        f"{duration(summary.estimate_s)} by a probe of this device{cap}; Ctrl-C keeps what is done",
                        markup=False,
                        highlight=False,
                    )

            summary = run_calibration(
                s, out, device, repeats, max_bytes, advance, collectives, budget_s, announce
            )
    except ScenarioError as e:
        fail(str(e))
    t = summary.table
    print(
        f"{out}: {len(t.kernels)} kernel rows, {len(t.collectives)} collective rows "
        f"({summary.measured} measured now, {summary.kept} kept from before)"
    )
    for line in summary.skipped[:10]:
        note("not measured", line)
    if len(summary.skipped) > 10:
        note("not measured", f"... and {len(summary.skipped) - 10} more")
    if summary.interrupted:
        err.print("interrupted: what was measured is saved; run the same command again to resume")
        raise typer.Exit(130)
    if summary.left:
        err.print(
            f"--budget {budget} spent: {summary.left} shapes left, saved so far; run the same command again to go on",
            markup=False,
            highlight=False,
        )
    print(f"use it: clustersim run {scenario} --kernels {out}")


def parse_duration(text: str, option: str) -> float:
    """90s, 10m, 1h30m, 2h or a number of seconds."""
    # blanks are dropped first: a pattern with a blank run between every part backtracks for minutes over a long
    # run of blanks, and '1h 30m' is '1h30m'
    compact = "".join(text.split())
    parts = re.fullmatch(
        r"(?:(\d{1,9}(?:\.\d{1,9})?)h)?(?:(\d{1,9}(?:\.\d{1,9})?)m)?(?:(\d{1,9}(?:\.\d{1,9})?)s?)?", compact
    )
    if not compact or parts is None or not any(parts.groups()):
        raise ScenarioError(f"{option}: expected a duration such as 90s, 10m or 1h30m (got {text[:40]!r})")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in parts.groups())
    total = 3600 * hours + 60 * minutes + seconds
    if (
        not 0 < total <= 30 * 86400
    ):  # below a second is allowed: it stops after the first shape (tests use it)
        raise ScenarioError(f"{option}: {compact} is not a duration above 0 and at most 30 days")
    return total


def duration(seconds: float) -> str:
    """12 s, 3.4 min, 2.1 h."""
    if seconds < 1:
        return "under 1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def with_precision(path: Path, dtype: str):
    """The scenario of ``path`` loaded again with ``training.precision: dtype`` (its FP8 settings resolved anew)."""
    from simulator.scenario.files import read_yaml
    from simulator.scenario.loader import load_scenario

    data = read_yaml(path, "scenario")
    if not isinstance(data, dict):
        return load_scenario(path)
    training = dict(data.get("training") or {})
    training["precision"] = dtype
    return load_scenario({**data, "training": training}, base_dir=path.parent)


import_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Turn measurements made elsewhere into cost-table rows."
)
calibrate_app.add_typer(import_app, name="import")


def _report_import(table, added: int, notes: dict[str, int], out: Path) -> None:
    for what, count in sorted(notes.items(), key=lambda kv: -kv[1])[:8]:
        note("not imported", f"{count} x {what}")
    print(
        f"{out}: {added} rows added; the table has {len(table.kernels)} kernel and {len(table.collectives)} collective rows"
    )
    print(f"use it: clustersim run SCENARIO.yaml --kernels {out}")


@import_app.command("kineto")
def import_kineto(
    trace: Annotated[
        Path,
        typer.Argument(
            help="PyTorch profiler Chrome trace (.json or .json.gz), recorded with record_shapes=True."
        ),
    ],
    out: Annotated[Path, typer.Option(help="Table directory to write or add to.")],
    gpu: Annotated[
        str | None, typer.Option(help="GPU catalogue name (default: from the trace's device name).")
    ] = None,
    ranks: Annotated[
        int | None, typer.Option(min=2, help="Group size of collectives the trace does not record (gloo).")
    ] = None,
    nodes: Annotated[int, typer.Option(min=1, help="Nodes the traced collectives spanned.")] = 1,
    ranks_per_node: Annotated[
        int | None, typer.Option(min=1, help="Ranks per node (default: ranks / nodes).")
    ] = None,
    licence: Annotated[
        str, typer.Option(help="Licence of the numbers, for the table's sources.")
    ] = "the measurer's own",
) -> None:
    """Kernel rows (and NCCL collective rows) from a PyTorch profiler trace."""
    from simulator.calibration.importers import merge_trace

    try:
        source = f"PyTorch profiler trace {trace.name}"
        table, info, model, gpu, read = merge_trace(
            out, trace, source, gpu, licence, ranks, nodes, ranks_per_node
        )
    except ScenarioError as e:
        fail(str(e))
    if not gpu:
        note("warning", f"device '{model}' is not in the GPU catalogue; pass --gpu so runs pick the table")
    elif not info["gpu_trace"] and gpu != "cpu":
        note(
            "warning",
            f"the trace has no GPU kernels (a CPU trace): its rows are CPU times, labelled {gpu} as --gpu asks",
        )
    added = read - sum(v for k, v in info["skipped"].items() if "row skipped" in str(k))
    _report_import(table, added, info["skipped"], out)


def _logged_gpu(logs: dict[Path, str], gpu: str | None) -> str | None:
    """The GPU the logs (path -> text) name (each a catalogue name), checked against --gpu: one table holds one
    GPU's rows."""
    from simulator.calibration.importers import match_gpu
    from simulator.calibration.importers.nccl_tests import log_devices

    named = {name for log, text in logs.items() for name in log_devices(log, text)}
    found = {match_gpu(name) or name for name in named}
    if len(found) > 1:
        raise ScenarioError(
            f"the logs were measured on {', '.join(sorted(found))}: one table holds one GPU's rows"
        )
    logged = next(iter(found), None)
    if gpu and logged and logged != gpu:
        raise ScenarioError(f"--gpu {gpu}: the logs were measured on {logged}")
    if logged and not match_gpu(logged) and not gpu:
        note("warning", f"device '{logged}' is not in the GPU catalogue; pass --gpu so runs pick the table")
        return None
    return gpu or logged


@import_app.command("nccl-tests")
def import_nccl_tests(
    logs: Annotated[list[Path], typer.Argument(help="nccl-tests output files (text, or JSON from -J).")],
    out: Annotated[Path, typer.Option(help="Table directory to write or add to.")],
    op: Annotated[
        str | None, typer.Option(help="Which test, where the log does not say: all_reduce, all_gather, ...")
    ] = None,
    ranks: Annotated[
        int | None, typer.Option(min=2, help="Ranks, where the log has no '#  Rank' lines.")
    ] = None,
    nodes: Annotated[
        int | None, typer.Option(min=1, help="Nodes (default: distinct hosts in the log).")
    ] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU catalogue name of the machine measured.")] = None,
    topology: Annotated[
        str | None, typer.Option(help="Topology the rows describe (rows across nodes apply only to it).")
    ] = None,
    licence: Annotated[
        str, typer.Option(help="Licence of the numbers, for the table's sources.")
    ] = "the measurer's own",
) -> None:
    """Collective rows from nccl-tests logs (both column layouts, MPI / Slurm prefixes, JSON output)."""
    from simulator.calibration.importers import merge_into
    from simulator.calibration.importers.nccl_tests import parse_nccl_tests
    from simulator.hardware.gpus import get_gpu
    from simulator.hardware.topology import load_topology
    from simulator.scenario.files import read_text
    from simulator.tables.format import COLLECTIVE_OPS, SourceInfo, SystemInfo
    from simulator.tables.io import read_existing

    if op is not None and op not in COLLECTIVE_OPS:
        fail(f"--op: '{op}' is not one of {', '.join(COLLECTIVE_OPS)}")
    try:
        read_existing(out)
        if gpu:
            get_gpu(gpu, "--gpu")
        system = SystemInfo()
        if topology:
            spec = load_topology(topology)
            system = SystemInfo(
                topology=spec.name,
                intra_node=spec.node.intra_node,
                nics_per_node=spec.node.nics,
                nic_bandwidth_gbps=spec.node.nic_bandwidth_gbps,
                nic_kind=spec.node.nic_kind,
            )
            gpu = gpu or spec.node.gpu
        texts = {log: read_text(log) for log in logs}  # each log read once (bounded)
        rows = [r for log, text in texts.items() for r in parse_nccl_tests(log, op, ranks, nodes, text)]
        gpu = _logged_gpu(texts, gpu)
        source = SourceInfo(
            rows=f"{len(rows)} collective",
            source="nccl-tests: " + ", ".join(p.name for p in logs),
            licence=licence,
        )
        skipped: dict[str, int] = {}
        table = merge_into(out, [], rows, source, gpu=gpu, system=system, skipped=skipped)
    except ScenarioError as e:
        fail(str(e))
    _report_import(table, len(rows) - sum(skipped.values()), skipped, out)
