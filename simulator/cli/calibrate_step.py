"""``clustersim calibrate step``: a profile of one's own stack from one measured step of one's own run."""

import datetime
import sys
from pathlib import Path
from typing import Annotated

import typer

from simulator.cli.calibrate import calibrate_app, parse_duration
from simulator.errors import ScenarioError
from simulator.report.console import err, escape, fail, note, progress


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
    from simulator.frameworks import get_framework
    from simulator.report.output import check_output_file, write_atomic
    from simulator.scenario.loader import load_scenario
    from simulator.validation import calibrate as cal

    given = [
        (o, v)
        for o, v in (
            ("--measured", measured),
            ("--tokens-per-s-per-gpu", tokens_per_s_per_gpu),
            ("--mfu", mfu),
        )
        if v is not None
    ]
    if len(given) != 1:
        fail(
            "calibrate step: give one measurement: --measured (seconds per step), --tokens-per-s-per-gpu or --mfu"
        )
    option, value = given[0]
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
        metric = {"--measured": "iteration_time_s", "--tokens-per-s-per-gpu": "tokens_per_s_per_gpu"}.get(
            option, "mfu"
        )
        target = parse_duration(str(value), option) if option == "--measured" else float(value)
        if not 0 < target < float("inf"):  # NaN and infinity fail this too
            raise ScenarioError(f"{option}: must be a finite number above 0 (got {value})")
        start = get_framework(s.framework)
        before = cal.STEP_METRICS[metric](simulate(s, framework=start).metrics)
        with progress(sys.stderr.isatty()) as bar:
            task = bar.add_task("fitting", total=None)
            fitted, at_bound = cal.fit_step(
                s, start, param, metric, target, progress=lambda msg: bar.update(task, description=msg)
            )
        after = cal.STEP_METRICS[metric](simulate(s, framework=fitted).metrics)
    except ScenarioError as e:
        fail(str(e))
    unit = {"iteration_time_s": " s per step", "tokens_per_s_per_gpu": " tokens/s per GPU", "mfu": " MFU"}[
        metric
    ]
    old, new = cal.value_of(start, param), cal.value_of(fitted, param)
    print(f"{param}: {old:.4g} -> {new:.4g} ({start.name} profile)")
    print(f"{s.name}: measured {target:.4g}{unit}; simulated {before:.4g} before, {after:.4g} after")
    if at_bound:
        note(
            "warning",
            f"the fit stopped at the bound of {param} ({new:.4g}, searched {cal.around(start, param)}): the "
            f"measurement lies beyond what it can explain; look at the rest (communication, host, memory-bound "
            f"kernels) with "
            f"clustersim run {scenario} --report",
        )
    today = datetime.date.today().isoformat()
    how = (
        f"clustersim calibrate step {scenario} {option} {value} --param {param} ({today}, from {start.name})"
    )
    fitted = fitted.model_copy(
        update={
            "name": write.stem,  # `framework: path/to/NAME.yaml` reads as the profile NAME
            "fitted": how,
            "fit_params": (),  # not fitted on the published runs: cross-validation leaves it alone
            "fit_cases": (),
            "accuracy": f"calibrated on one measured step of {s.name} ({target:.4g}{unit}): {param} {old:.4g} -> "
            f"{new:.4g}; runs predicted with it carry an unseen stack's error bar (docs/calibration.md)",
        }
    )
    try:
        write_atomic(write, yaml.safe_dump(fitted.model_dump(exclude_defaults=True), sort_keys=False))
    except ScenarioError as e:
        fail(str(e))
    err.print(
        escape(f"profile written to {write}: clustersim run SCENARIO --framework {write}"), soft_wrap=True
    )
