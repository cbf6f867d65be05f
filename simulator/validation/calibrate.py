"""Fit a framework-generation profile to measured runs: ``clustersim calibrate``.

Minimises the mean squared log error (log predicted / published) over the chosen cases by coordinate descent,
one golden-section search per parameter within physical bounds. Few parameters, many cases: the point is one
profile per framework generation that then predicts runs it was not fitted on.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from simulator.frameworks import Framework, GpuFactors
from simulator.validation.runner import run_case

BOUNDS = {
    "gemm_efficiency": (0.4, 1.3),
    "attention_efficiency": (0.3, 1.3),
    "memory_efficiency": (0.3, 1.3),
    "kernel_overhead_s": (0.0, 1e-4),
    # the host thread (seconds): per kernel issued in forward / backward, per collective call, per microbatch
    # outside the layers, per synchronisation, per parameter tensor in the optimizer step
    "host.forward_kernel_s": (0.0, 1e-4),
    "host.backward_kernel_s": (0.0, 1e-4),
    "host.collective_s": (0.0, 2e-4),
    "host.microbatch_s": (0.0, 2e-2),
    "host.sync_s": (0.0, 1e-4),
    "host.optimizer_tensor_s": (0.0, 2e-4),
}


def loss(framework: Framework, cases: list[dict]) -> float:
    errors = [
        math.log(r.predicted / r.published)
        for r in (run_case(c, framework) for c in cases)
        if r.predicted is not None
    ]
    return sum(e * e for e in errors) / len(errors) if errors else math.inf


def golden_section(f: Callable[[float], float], lo: float, hi: float, iterations: int = 14) -> float:
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iterations):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def with_value(framework: Framework, name: str, value: float, gpu: str | None = None) -> Framework:
    """``framework`` with parameter ``name`` set (``host.x`` for the host profile's), for every GPU or, with
    ``gpu``, as that GPU's factor."""
    if name.startswith("host."):
        host = framework.host.model_copy(update={name.removeprefix("host."): value})
        return framework.model_copy(update={"host": host})
    if gpu is None:
        return framework.model_copy(update={name: value})
    factors = framework.gpus.get(gpu, GpuFactors())
    return framework.model_copy(
        update={"gpus": {**framework.gpus, gpu: factors.model_copy(update={name: value})}}
    )


def value_of(framework: Framework, name: str, gpu: str | None = None) -> float:
    if name.startswith("host."):
        return getattr(framework.host, name.removeprefix("host."))
    return getattr(framework.on_gpu(gpu) if gpu else framework, name)


def ceiling(name: str) -> float:
    """The largest value a profile file takes for ``name`` (its schema's ``le``: 1.5 for the efficiencies), so that
    a fitted profile loads again; unbounded for host costs and overheads."""
    field = Framework.model_fields.get(name)
    bounds = [m.le for m in (field.metadata if field else ()) if getattr(m, "le", None) is not None]
    return min(bounds, default=math.inf)


def around(name: str, x: float) -> tuple[float, float]:
    """``name``'s search range from its starting value ``x``: its physical bounds (BOUNDS), widened to half and one
    and a half times ``x`` (a profile whose fitted level lies beyond them, megatron-2022's GEMM level of 1.40, can be
    fitted again to a run of its own stack), within what a profile file takes (``ceiling``)."""
    lo, hi = BOUNDS[name]
    lo, hi = (min(lo, 0.5 * x), max(hi, 1.5 * x)) if x > 0 else (lo, hi)
    return lo, min(hi, ceiling(name))


def on_gpu_value(framework: Framework, name: str, gpu) -> float:
    """``name`` as it applies on ``gpu`` (a GPU: its generation's and its own factors over the profile's value)."""
    if name.startswith("host."):
        return value_of(framework, name)
    return getattr(framework.on_gpu(gpu.lineage, gpu.architecture), name)


def scaled(framework: Framework, name: str, ratio: float) -> Framework:
    """``framework`` with ``name`` times ``ratio`` wherever it is set: the profile's own value and every GPU's or
    generation's factor (each within ``ceiling``). A stack's level fitted on one GPU so moves as one: the factor
    that applies on the measured GPU is the one fitted, whichever entry holds it, and the others keep their ratios
    to it."""
    if name.startswith("host."):
        return with_value(framework, name, value_of(framework, name) * ratio)
    cap = ceiling(name)
    gpus = {
        key: f.model_copy(update={name: min(getattr(f, name) * ratio, cap)}) if getattr(f, name, None) else f
        for key, f in framework.gpus.items()
    }
    return framework.model_copy(update={name: min(getattr(framework, name) * ratio, cap), "gpus": gpus})


def fit_level(
    start: Framework, name: str, gpu, objective: Callable[[Framework], float], iterations: int = 20
) -> tuple[Framework, float, float, bool]:
    """``start`` with ``name`` as it applies on ``gpu`` (``on_gpu_value``) set by a golden-section search of
    ``objective`` within ``around`` it, every entry scaled alike (``scaled``). Returns the profile, the value on
    ``gpu`` before and after, and whether the search stopped at a bound."""
    x0 = on_gpu_value(start, name, gpu)

    def at(x: float) -> Framework:
        return scaled(start, name, x / x0) if x0 > 0 else with_value(start, name, x)

    lo, hi = around(name, x0)
    best = golden_section(lambda x: objective(at(x)), lo, hi, iterations=iterations)
    return at(best), x0, best, min(best - lo, hi - best) < 1e-3 * (hi - lo)


def fit(
    cases: list[dict],
    start: Framework,
    params: list[str],
    rounds: int = 2,
    progress: Callable[[str], None] | None = None,
    gpu: str | None = None,
) -> Framework:
    """Coordinate descent over ``params`` (the profile's own, or with ``gpu`` that GPU's factors), each within its
    physical bounds (``BOUNDS``)."""
    current = start
    for _ in range(rounds):
        for name in params:
            lo, hi = BOUNDS[name]

            def objective(x: float, name: str = name, base: Framework = current) -> float:
                return loss(with_value(base, name, x, gpu), cases)

            best = golden_section(objective, lo, hi)
            current = with_value(current, name, best, gpu)
            if progress:
                progress(f"{name} = {best:.4g}")
    return current


# what one measured step can state, and how to read it off a simulation
STEP_METRICS = {
    "iteration_time_s": lambda m: m.iteration_time_s,
    "tokens_per_s_per_gpu": lambda m: m.tokens_per_s_per_gpu,
    "mfu": lambda m: m.mfu,
}


def sensitivity(before: float | None, after: float | None, ratio: float) -> float:
    """|d log value / d log parameter| from a value ``before`` and ``after`` the parameter was scaled by ``ratio``
    (0 where either is missing). Near 1 a step is all that parameter's kernels and one measurement fixes it; near 0
    a 1% error in the measurement moves the fitted value by 1/sensitivity %."""
    if not before or not after or before <= 0 or after <= 0:
        return 0.0
    return abs(math.log(after / before) / math.log(ratio))


def elasticity(case: dict, framework: Framework, name: str, ratio: float = 0.9) -> float:
    """How much a case's predicted value moves with parameter ``name`` (``sensitivity``): the profile against the
    profile with ``name`` scaled by ``ratio``."""
    before = run_case(case, framework).predicted
    return sensitivity(before, run_case(case, scaled(framework, name, ratio)).predicted, ratio)


def fit_step(
    scenario,
    start: Framework,
    name: str,
    metric: str,
    measured: float,
    progress: Callable[[str], None] | None = None,
) -> tuple[Framework, float, float, bool]:
    """``start`` with its parameter ``name`` fitted so that ``scenario`` simulates to ``measured`` (``metric``, one
    of STEP_METRICS): ``fit_level`` on the scenario's GPU, the squared log error as the objective. One measured step
    identifies one parameter. Returns the profile, the value on that GPU before and after, and whether the search
    stopped at a bound (the measurement lies beyond what that parameter can explain)."""
    from simulator.api import simulate
    from simulator.hardware.gpus import get_gpu
    from simulator.hardware.topology import cluster_spec

    read = STEP_METRICS[metric]

    def objective(framework: Framework) -> float:
        got = read(simulate(scenario, framework=framework).metrics)
        if progress:
            progress(f"{name}: {got:.4g} against {measured:.4g}")
        return math.log(got / measured) ** 2 if got > 0 else math.inf

    return fit_level(start, name, get_gpu(cluster_spec(scenario).node.gpu), objective)
