"""``clustersim plan``: search the parallel layouts of a model on N GPUs (simulator/study/plan.py), with the
search constraints, the layouts written as scenarios and the pick emitted for a framework."""

import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer

from simulator.cli.plan_options import search_options, stack_shardings
from simulator.cli.study import parse_tokens
from simulator.errors import ScenarioError
from simulator.report.console import err, fail, note, shown_warnings


def stand_in(data: dict, own, gpus: int) -> None:
    """The --scenario file's layout on ``gpus`` GPUs as the plan's base (``data``, its dump, changed in place): its
    data parallelism scaled, one micro-batch per pipeline stage and data-parallel rank."""
    p = own.parallelism
    inner = p.tensor_parallel * p.pipeline_parallel * p.context_parallel
    if gpus % inner:
        raise ScenarioError(
            f"--gpus ({gpus}) is not a multiple of the --scenario layout's TP x PP x CP ({p.tensor_parallel} x "
            f"{p.pipeline_parallel} x {p.context_parallel} = {inner}): give such a --gpus, or plan with --model"
        )
    dp = gpus // inner
    data["parallelism"]["data_parallel"] = dp
    data["training"]["global_batch_size"] = dp * own.training.micro_batch_size * p.pipeline_parallel


def plan(
    model: Annotated[
        str | None, typer.Option("--model", help="A preset name or a Hugging Face config.json.")
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option("--gpus", min=1, help="GPUs to lay the job out on (with --scenario: default its own)."),
    ] = None,
    topology: Annotated[
        str | None, typer.Option("--topology", help="A shipped topology name or a YAML file.")
    ] = None,
    global_batch_size: Annotated[
        int | None,
        typer.Option(
            "--global-batch-size", min=1, help="Sequences per step (with --scenario: default its own)."
        ),
    ] = None,
    scenario_file: Annotated[
        Path | None,
        typer.Option(
            "--scenario",
            help="Plan from a scenario file instead of --model / --topology: its model, cluster, training and "
            "parallelism switches (SP, TP and DDP overlaps, ZeRO settings, rank order) hold for every layout.",
        ),
    ] = None,
    seq: Annotated[
        int | None, typer.Option("--seq", min=1, help="Sequence length (default: the model's).")
    ] = None,
    precision: Annotated[
        str | None,
        typer.Option(
            "--precision",
            help="bf16 (default), fp16, fp32 or fp8 (the GPU's FP8 recipe as Transformer Engine picks it; the FP8 peak from Hopper).",
        ),
    ] = None,
    attention: Annotated[
        str | None,
        typer.Option("--attention", help="flash (default: every current stack has it) or standard."),
    ] = None,
    framework: Annotated[
        str, typer.Option("--framework", help="Framework profile (default: auto).")
    ] = "auto",
    top: Annotated[int, typer.Option("--top", min=1, help="How many to confirm by simulation.")] = 10,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress display.")] = False,
    write_scenario: Annotated[
        Path | None,
        typer.Option(
            "--write-scenario", help="Write each simulated layout that fits as a runnable scenario file here."
        ),
    ] = None,
    tokens: Annotated[
        str | None, typer.Option("--tokens", help="Tokens to train on (15T, 300B): a days-to-train column.")
    ] = None,
    tp: Annotated[
        str | None, typer.Option("--tp", help="Tensor-parallel sizes to search, e.g. 1,2,4,8.")
    ] = None,
    pp: Annotated[
        str | None, typer.Option("--pp", help="Pipeline-parallel sizes to search, e.g. 1,2,4.")
    ] = None,
    pp_max: Annotated[
        int | None, typer.Option("--pp-max", min=1, help="Largest pipeline-parallel size.")
    ] = None,
    cp: Annotated[
        str | None, typer.Option("--cp", help="Context-parallel sizes to search, e.g. 1,2.")
    ] = None,
    mbs: Annotated[str | None, typer.Option("--mbs", help="Micro-batch sizes to search, e.g. 1,2.")] = None,
    ep: Annotated[
        str | None, typer.Option("--ep", help="Expert-parallel sizes (MoE models), e.g. 8,16.")
    ] = None,
    sharding: Annotated[
        str | None,
        typer.Option(
            "--sharding",
            help="Shardings to search: ddp, zero1, zero2, zero3, fsdp, hsdp (FSDP2 hybrid sharding, shard groups of "
            "1, 2, 4 or 8 whole nodes), zero2-offload, zero3-offload (DeepSpeed's optimizer on the host CPU).",
        ),
    ] = None,
    no_zero3: Annotated[
        bool, typer.Option("--no-zero3", help="Leave out full sharding (ZeRO-3, FSDP, HSDP, ZeRO-3 offload).")
    ] = False,
    recompute: Annotated[
        str | None, typer.Option("--recompute", help="Recompute policies to search: none, selective, full.")
    ] = None,
    max_memory_gib: Annotated[
        float | None,
        typer.Option("--max-memory-gib", min=0.1, help="Per-GPU memory budget (default: the GPU's memory)."),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs", min=1, max=1024, help="Processes confirming layouts at once (default: one per core)."
        ),
    ] = None,
    emit: Annotated[
        str | None,
        typer.Option(
            "--emit", help="Print the pick as megatron arguments, a deepspeed config or a torchtitan TOML."
        ),
    ] = None,
    stack: Annotated[
        str,
        typer.Option(
            "--stack",
            help="The training stack: megatron (DDP or distributed optimizer), torchtitan (FSDP2 / HSDP), deepspeed "
            "(ZeRO 0-3, offload), each with its profile and switches; auto (default) runs each layout on the stack "
            "that would run it.",
        ),
    ] = "auto",
    switches: Annotated[
        bool,
        typer.Option(
            "--switches",
            help="Search the switches too, each on and off: sequence parallelism and TP communication overlap (TP > "
            "1), the gradient reduction beside backward (DP > 1), the distributed optimizer's weight gather beside "
            "forward (zero1), activation offloading to the host (no PP). Default: the stack's (or --scenario's) "
            "switches for every layout.",
        ),
    ] = False,
    mbs_max: Annotated[
        int | None,
        typer.Option(
            "--mbs-max",
            min=1,
            help="Largest micro-batch size searched (default 16; every size dividing a rank's batch).",
        ),
    ] = None,
    dask: Annotated[
        str | None,
        typer.Option(
            "--dask",
            help="Confirm on Dask: 'local' (a LocalCluster of --jobs workers) or a scheduler address tcp://host:8786.",
        ),
    ] = None,
) -> None:
    """Search parallel layouts (TP, PP, CP, DP, virtual stages, micro-batch, ZeRO / FSDP, recompute) for a
    model on N GPUs: screen every one with a fast estimate, confirm the best by simulation."""
    from simulator.hardware.topology import load_topology
    from simulator.report.output import check_output_dir
    from simulator.scenario.loader import load_scenario
    from simulator.study.emit import FRAMEWORKS, emit_notes, emit_text, write_layouts
    from simulator.study.own import own_layout
    from simulator.study.plan import accuracy_line
    from simulator.study.plan import plan as run_plan
    from simulator.study.stacks import STACK_SCHEDULES, STACKS

    own = None  # the --scenario file's scenario
    if scenario_file is not None:
        given = [
            o for o, v in (("--model", model), ("--topology", topology), ("--seq", seq)) if v is not None
        ]
        given += [o for o, v in (("--precision", precision), ("--attention", attention)) if v is not None]
        if given:
            fail(f"plan: --scenario gives the model, cluster and training; leave out {', '.join(given)}")
        try:
            own = load_scenario(scenario_file)
        except ScenarioError as e:
            fail(str(e))
        data = own.model_dump(mode="json", exclude_none=True)
        data["name"] = f"plan-{own.name}"
        if framework != "auto":
            data["framework"] = framework
        topology = own.cluster.topology
        q = own.parallelism
        gpus = gpus or q.tensor_parallel * q.pipeline_parallel * q.context_parallel * q.data_parallel
        global_batch_size = global_batch_size or own.training.global_batch_size
    else:
        missing = [
            o for o, v in (("--model", model), ("--topology", topology), ("--gpus", gpus)) if v is None
        ]
        missing += ["--global-batch-size"] if global_batch_size is None else []
        if missing:
            fail(
                "plan: give --model, --topology, --gpus and --global-batch-size, or --scenario FILE "
                f"(missing: {', '.join(missing)})"
            )
        model_section: dict = {"hf_config": model} if model.endswith(".json") else {"preset": model}
        model_section["attention"] = attention or "flash"
        if seq:
            model_section["seq_length"] = seq
        data = {
            "name": f"plan-{Path(model).stem}",
            "framework": framework,
            "model": model_section,
            "cluster": {"topology": topology, "num_nodes": 1},
            "training": {
                "global_batch_size": global_batch_size,
                "micro_batch_size": 1,
                "precision": precision or "bf16",
            },
            "parallelism": {"data_parallel": 1},
        }

    try:
        if emit is not None and emit not in FRAMEWORKS:
            raise ScenarioError(f"--emit: '{emit}' is not one of {', '.join(FRAMEWORKS)}")
        if stack != "auto" and stack not in STACKS:
            raise ScenarioError(f"--stack: '{stack}' is not one of auto, {', '.join(STACKS)}")
        if stack != "auto" and framework != "auto":
            raise ScenarioError(
                f"--stack {stack} and --framework {framework}: a stack brings its own profile; give one of them"
            )
        if write_scenario is not None:
            check_output_dir(write_scenario, "--write-scenario")
        total_tokens = parse_tokens(tokens) if tokens is not None else None
        with shown_warnings():
            # a scenario's cluster.gpus_per_node (64 of an NVL72 rack's 72, docs/hardware.md) is the node the plan uses
            given = data["cluster"].get("gpus_per_node")
            gpn = given if isinstance(given, int) and not isinstance(given, bool) and given > 0 else None
            gpn = min(gpn or 10**9, load_topology(topology).node.gpus)
            nodes = max(1, gpus // gpn)
            if gpus > gpn and gpus % gpn:
                fail(f"--gpus ({gpus}) is not a whole number of {gpn}-GPU nodes of {topology}")
            data["cluster"]["num_nodes"] = nodes
            if gpus < gpn:  # part of one node: plan those GPUs (they keep the node's NVLink, NICs and host)
                data["cluster"]["gpus_per_node"] = gpus
                if not json_out:
                    print(
                        f"note: --gpus {gpus} is part of one {gpn}-GPU {topology} node: planning {gpus} of its "
                        f"GPUs (cluster.gpus_per_node: {gpus})",
                        file=sys.stderr,
                    )
            # a valid stand-in layout the search replaces: every GPU data-parallel, one sequence each; or the
            # --scenario file's own, its data parallelism scaled to the GPUs (its switches are the plan's)
            n = gpus
            if own is None:
                data["parallelism"] = {}
                data["training"] = {**data["training"], "global_batch_size": n}
            else:
                stand_in(data, own, n)
            base = load_scenario(data)
            show = not quiet and not json_out and sys.stderr.isatty()
            with err.status("screening layouts...") if show else nullcontext():
                options = search_options(
                    tp, pp, pp_max, cp, mbs, ep, sharding, no_zero3, recompute, max_memory_gib
                )
                options["jobs"] = jobs or os.cpu_count() or 1
                if stack != "auto":  # every layout on that stack, its shardings alone (study/stacks.py)
                    options["stack"] = stack
                    options["shardings"] = stack_shardings(stack, options.get("shardings"))
                    options["schedules"] = STACK_SCHEDULES[stack]
                elif own is None and framework == "auto":  # each layout on the stack that runs it
                    options["stack"] = "auto"
                if dask:
                    options["dask"] = dask
                if switches:
                    options["switches"] = True
                if mbs_max is not None:
                    options["max_micro_batch"] = mbs_max
                result = run_plan(base, n, top=top, batch=global_batch_size, options=options)
        if own is not None:  # the file's own layout beside the pick, where it is the same job
            result["scenario_own"] = own_layout(own, n, global_batch_size, result)
    except ScenarioError as e:
        fail(str(e), getattr(e, "exit_code", 2))
    seq_len = base.model.seq_length
    for r in result["top"]:
        if total_tokens and r.get("iteration_time_s"):
            r["days_to_train"] = total_tokens / (global_batch_size * seq_len / r["iteration_time_s"]) / 86400
    try:  # the directory was checked up front; a full disk can still refuse the files
        written = write_layouts(result, write_scenario) if write_scenario is not None else []
    except ScenarioError as e:
        fail(str(e))
    pick = next((r for r in result["top"] if r["status"] == "ok"), None)
    emitted = emit_text(pick, emit) if emit and pick else None
    beside = emit_notes(pick, emit) if emit and pick else []
    if json_out:
        extra = {
            "written": [str(w) for w in written],
            **({"emit": {emit: emitted}, "emit_notes": beside} if emitted else {}),
        }
        print(json.dumps({**result, **extra}, indent=2, default=str))
        if (
            pick is None
        ):  # every simulated layout out of memory or invalid: nothing to run (errors.NothingFits)
            raise typer.Exit(3)
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table

    c = Console(soft_wrap=True)
    c.print(
        f"screened {result['screened']:,} layouts ({result['screened_per_s']:,.0f}/s), "
        f"{result['fit_in_memory']:,} fit in memory by the estimate; the best {result['confirmed']} simulated:"
    )
    heads = ["#", "layout", "est. s", "sim. s", "MFU", "GiB", "bubble", "comm s"]
    if total_tokens:
        heads.append("days")
    rows = []
    for i, r in enumerate(result["top"], 1):
        if r["status"] != "ok":
            rows.append(
                [str(i), r["layout"], f"{r['estimate_s']:.3f}", r["status"], *[""] * (len(heads) - 4)]
            )
            continue
        rows.append(
            [
                str(i),
                r["layout"],
                f"{r['estimate_s']:.3f}",
                f"{r['iteration_time_s']:.3f}",
                f"{r['mfu']:.1%}",
                f"{r['memory_gib']:.1f}",
                f"{r['bubble_fraction']:.1%}",
                f"{r['exposed_comm_s']:.3f}",
                *([f"{r['days_to_train']:,.1f}"] if total_tokens else []),
            ]
        )
    # numbers are never cut: their columns keep their width and the layout column wraps (80 columns and up)
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for j, col in enumerate(heads):
        if col == "layout":
            t.add_column(col, justify="left", overflow="fold")
        else:
            width = max(len(col), *(len(row[j]) for row in rows)) if rows else len(col)
            t.add_column(col, justify="right", no_wrap=True, min_width=width)
    for row in rows:
        t.add_row(*row)
    c.print(t)
    for i, r in enumerate(result["top"], 1):
        if r["status"] != "ok" and r.get("reason"):
            c.print(f"#{i} {r['status']}: {r['reason']}", markup=False, highlight=False)
    if result.get("collapsed"):
        first = next((r for r in result["top"] if r.get("same_time")), None)
        example = (
            f" (e.g. #{result['top'].index(first) + 1} also as {', '.join(first['same_time'][:3])})"
            if first
            else ""
        )
        c.print(
            f"{result['collapsed']} near-duplicate layouts folded in: the same shape with another sharding, "
            f"recompute or switch, simulated within 0.5%{example}",
            markup=False,
            highlight=False,
        )
    c.print(result["why"], markup=False, highlight=False)
    if result.get("scenario_own"):
        c.print(result["scenario_own"]["note"], markup=False, highlight=False)
    if line := accuracy_line(result["screen_accuracy"]):
        c.print(line, markup=False, highlight=False)
    c.print(result["caveat"], markup=False, highlight=False)
    for path in written:
        c.print(f"wrote {path}")
    if emit and pick is None:
        note("warning", f"--emit {emit}: no layout fits, nothing to emit")
    elif emitted:
        c.print(f"\n{emit} for #1 ({pick['layout']}):", markup=False, highlight=False)
        print(emitted)
        for line in beside:  # beside the file, on stderr: a JSON config takes no comments
            note("note", line, "cyan")
    if pick is None:  # every simulated layout out of memory or invalid: nothing to run (errors.NothingFits)
        raise typer.Exit(3)
