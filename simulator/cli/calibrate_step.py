"""``clustersim calibrate step``: a profile of one's own stack from one measured step of one's own run."""

import datetime
import sys
from pathlib import Path
from typing import Annotated

import typer

from simulator.cli.calibrate import calibrate_app, parse_duration
from simulator.errors import ScenarioError
from simulator.report.console import err, escape, fail, note, progress

# a step that moves less than this % per 1% of the fitted parameter fixes it poorly (a warning); one that moves
# less than REFUSE_BELOW, and less than REFUSE_HALVED with the parameter halved, cannot fix it (refused)
REFUSE_BELOW, WARN_BELOW, REFUSE_HALVED = 0.1, 0.3, 0.05


@calibrate_app.command("step")
def calibrate_step(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file of the run that was measured.")],
    write: Annotated[Path, typer.Option(help="Write the calibrated profile to this YAML file (its name).")],
    measured: Annotated[
        str | None, typer.Option(help="The measured time of one training step: 2.31s, 2.31 (seconds), 1m5s.")
    ] = None,
    tokens_per_s_per_gpu: Annotated[
        float | None,
        typer.Option("--tokens-per-s-per-gpu", min=0, help="Or: the measured tokens per second per GPU."),
    ] = None,
    mfu: Annotated[
        float | None,
        typer.Option(min=0, max=1, help="Or: the measured model FLOPs utilization (0.45 for 45%)."),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Or: a PyTorch profiler trace (.json or .json.gz) of a few steps of one rank: the step time is "
            "the median ProfilerStep span, the first of three or more left out."
        ),
    ] = None,
    table: Annotated[
        Path | None,
        typer.Option(
            help="With --trace: add the trace's kernel and NCCL times (record_shapes=True) to this table "
            "directory and fit with it layered over the GPU's shipped table (then run with --kernels DIR)."
        ),
    ] = None,
    param: Annotated[
        str,
        typer.Option(
            help="The one profile parameter to fit: gemm_efficiency (default: the level of the stack's matmuls, "
            "what an unseen stack's runs differ by first), or one of clustersim calibrate profile's."
        ),
    ] = "gemm_efficiency",
    framework: Annotated[
        str | None, typer.Option("--framework", help="The profile to start from (default: the scenario's).")
    ] = None,
) -> None:
    """Fit one profile parameter to one measured step of SCENARIO and write the profile: then run, compare,
    memory and plan take it with --framework FILE (its error bar is an unseen stack's)."""
    import yaml

    from simulator.api import simulate
    from simulator.frameworks import CalibratedOn, get_framework
    from simulator.hardware.gpus import get_gpu
    from simulator.hardware.topology import cluster_spec
    from simulator.report.output import check_output_file, write_atomic
    from simulator.scenario.loader import load_scenario
    from simulator.validation import calibrate as cal

    given = [
        (o, v)
        for o, v in (
            ("--measured", measured),
            ("--tokens-per-s-per-gpu", tokens_per_s_per_gpu),
            ("--mfu", mfu),
            ("--trace", trace),
        )
        if v is not None
    ]
    if len(given) != 1:
        fail(
            "calibrate step: give one measurement: --measured (seconds per step), --tokens-per-s-per-gpu, --mfu "
            "or --trace"
        )
    option, value = given[0]
    if table is not None and trace is None:
        fail("--table: the kernel times come from a trace; give --trace as well")
    if "," in param:
        fail(
            "--param: one measured step identifies one parameter; fit several with clustersim calibrate profile "
            "on several measured runs"
        )
    if param not in cal.BOUNDS:
        fail(f"--param: unknown {param!r}; fittable: {', '.join(cal.BOUNDS)}")
    try:
        check_output_file(write, "--write")
        s = load_scenario(scenario, framework=framework)
        metric = {
            "--measured": "iteration_time_s",
            "--trace": "iteration_time_s",
            "--tokens-per-s-per-gpu": "tokens_per_s_per_gpu",
        }.get(option, "mfu")
        traced = None
        if trace is not None:
            from simulator.calibration.step_trace import read_step

            traced = read_step(trace)
            target, value = traced.step_s, f"{trace} ({traced.how}: {traced.step_s:.4g} s)"
            if table is not None:
                s = _with_trace_table(s, trace, table)
        else:
            target = parse_duration(str(value), option) if option == "--measured" else float(value)
        if not 0 < target < float("inf"):  # NaN and infinity fail this too
            raise ScenarioError(f"{option}: must be a finite number above 0 (got {value})")
        start = get_framework(s.framework)
        gpu_name = get_gpu(cluster_spec(s).node.gpu).name
        first = simulate(s, framework=start).metrics
        before = cal.STEP_METRICS[metric](first)

        def with_param(ratio: float) -> float:  # the step with the parameter scaled by ``ratio``
            return cal.STEP_METRICS[metric](simulate(s, framework=cal.scaled(start, param, ratio)).metrics)

        # how much the parameter moves this step (as calibrate.elasticity): near 0 the measurement cannot fix it
        sensitivity = cal.sensitivity(before, with_param(0.9), 0.9)
        # where the parameter sits past a floor (GEMMs at the roofline) 10% moves nothing yet; halving it tells
        if sensitivity < REFUSE_BELOW and abs((moved := with_param(0.5)) / before - 1) < REFUSE_HALVED:
            raise ScenarioError(
                f"--param {param}: this step hardly depends on it ({param} halved moves the simulated step "
                f"{abs(moved / before - 1):.1%}), so one measurement of it cannot fix {param}; measure a step "
                "whose time depends on it, or fit another --param"
            )
        with progress(sys.stderr.isatty()) as bar:
            task = bar.add_task("fitting", total=None)
            fitted, old, new, at_bound = cal.fit_step(
                s, start, param, metric, target, progress=lambda msg: bar.update(task, description=msg)
            )
        last = simulate(s, framework=fitted).metrics
        after = cal.STEP_METRICS[metric](last)
    except ScenarioError as e:
        fail(str(e))
    unit = {"iteration_time_s": " s per step", "tokens_per_s_per_gpu": " tokens/s per GPU", "mfu": " MFU"}[
        metric
    ]
    print(f"{param}: {old:.4g} -> {new:.4g} on {gpu_name} ({start.name} profile; every entry scaled alike)")
    print(f"{s.name}: measured {target:.4g}{unit}; simulated {before:.4g} before, {after:.4g} after")
    print(
        f"sensitivity: the step moves {sensitivity:.2f}% per 1% of {param}, so a 1% error in the measurement moves "
        f"the fit by {1 / sensitivity:.1f}%"
    )
    if sensitivity < WARN_BELOW:
        note(
            "warning",
            f"this step identifies {param} poorly (sensitivity {sensitivity:.2f}): a step with more of its time in "
            "that parameter's kernels (a larger model or micro-batch) fixes it better",
        )
    if traced is not None:
        print(f"trace {trace.name}: {traced.how}")
        rows = [("traced", (traced.step_s, traced.compute_s, traced.nccl_only_s, traced.idle_s))]
        simulated = _parts(last)
        rows += [("simulated before", _parts(first)), ("simulated after", simulated)]
        for label, (step, compute, comm, idle) in rows:
            print(
                f"  {label:>16}: {step:.4g} s per step = compute {compute:.4g} s + communication alone "
                f"{comm:.4g} s + GPU idle {idle:.4g} s"
            )
        idle_share, simulated_share = traced.idle_s / traced.step_s, simulated[3] / last.iteration_time_s
        if param == "gemm_efficiency" and idle_share > simulated_share + 0.1:
            note(
                "warning",
                f"the traced GPU is idle {idle_share:.0%} of the step, the simulation {simulated_share:.0%}: "
                f"the fitted GEMM level stands in for host time; fit --param host.forward_kernel_s (or another "
                f"host.* cost) when the gaps are the host's",
            )
    if at_bound:
        note(
            "warning",
            f"the fit stopped at the bound of {param} ({new:.4g}, searched {cal.around(param, old)}): the "
            f"measurement lies beyond what it can explain; look at the rest (communication, host, memory-bound "
            f"kernels) with "
            f"clustersim run {scenario} --report",
        )
    today = datetime.date.today().isoformat()
    how = (
        f"clustersim calibrate step {scenario} {option} {value} --param {param} ({today}, from {start.name})"
    )
    if table is not None:
        how += f", with the trace's kernel times in table {table} (run with --kernels {table})"
    fitted = fitted.model_copy(
        update={
            "name": write.stem,  # `framework: path/to/NAME.yaml` reads as the profile NAME
            "fitted": how,
            "fit_params": (),  # not fitted on the published runs: cross-validation leaves it alone
            "fit_cases": (),
            "calibrated_on": CalibratedOn(gpu=gpu_name, precision=s.training.precision, gpus=first.gpus),
            "accuracy": f"calibrated on one measured step of {s.name} ({target:.4g}{unit}): {param} {old:.4g} -> "
            f"{new:.4g}; runs predicted with it carry an unseen stack's error bar (docs/calibration.md)",
        }
    )
    try:
        write_atomic(write, yaml.safe_dump(fitted.model_dump(exclude_defaults=True), sort_keys=False))
    except ScenarioError as e:
        fail(str(e))
    kernels = f" --kernels {table}" if table is not None else ""
    err.print(
        escape(f"profile written to {write}: clustersim run SCENARIO --framework {write}{kernels}"),
        soft_wrap=True,
    )


def _parts(m) -> tuple[float, float, float, float]:
    """A simulated step as the trace's parts: (step, compute stream busy, exposed communication, the rest) s."""
    step = m.iteration_time_s
    compute = m.host.get("gpu_busy_fraction", 0.0) * step
    comm = min(m.comm["exposed_s"], step - compute)
    return step, compute, comm, max(step - compute - comm, 0.0)


def _with_trace_table(s, trace: Path, table: Path):
    """The scenario with the trace's kernel and collective rows added to ``table`` and layered over the GPU's
    shipped table; the trace must come from the scenario's GPU."""
    from simulator.calibration.importers import merge_trace
    from simulator.cli.common import with_kernels
    from simulator.hardware.topology import cluster_spec

    source = f"PyTorch profiler trace {trace.name} (clustersim calibrate step)"
    merge_trace(table, trace, source, require=cluster_spec(s).node.gpu)
    return with_kernels(s, str(table))
