"""Parallel-layout search: enumerate tensor, pipeline, context and data parallel sizes, virtual stages,
micro-batch size, weight / gradient sharding and activation recompute for a model on N GPUs (``layouts.py``);
screen every candidate with a closed-form estimate built from the simulator's own costs (``screen.py``); confirm
the best with the simulation and say why the best beats the next.
"""

from __future__ import annotations

import math
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from itertools import islice

from simulator.errors import NothingFits, ScenarioError
from simulator.hardware.cluster import Cluster
from simulator.hardware.topology import cluster_spec
from simulator.metrics.error_bar import families
from simulator.scenario.schema import Scenario
from simulator.study.layout import Layout
from simulator.study.layouts import candidates, why_none
from simulator.study.screen import Screen
from simulator.study.screen_check import accuracy_line, screen_accuracy  # noqa: F401  (plan's API)
from simulator.study.stacks import screen_for


@dataclass
class Confirmed:
    layout: Layout
    estimate_s: float
    iteration_time_s: float | None
    mfu: float | None
    memory_gib: float | None
    bubble_fraction: float | None
    exposed_comm_s: float | None
    compute_s: float | None
    status: str
    reason: str = ""
    breakdown: dict = field(default_factory=dict)
    scenario: dict = field(default_factory=dict)  # the layout as a runnable scenario (non-default fields)
    same_time: list[str] = field(default_factory=list)  # sharding / recompute variants simulated the same

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("layout"))
        d["layout"] = self.layout.label()
        return d


# Confirmed layouts of one shape (TP, PP, CP, DP, virtual stages, micro-batch, EP) that simulate this close differ
# only in sharding or recompute where those cost nothing: the faster is shown, the others named beside it
SAME_TIME = 0.005


def plan(
    base: Scenario,
    gpus: int,
    top: int = 10,
    options: dict | None = None,
    progress=None,
    batch: int | None = None,
) -> dict:
    """Screen every layout of ``base``'s model (``batch`` sequences per step, default the base's) and confirm
    the best ``top`` distinct ones with the simulation. ``options`` narrows the search (see layouts.candidates)
    and may set ``max_memory_gib``, a per-GPU budget below the GPU's memory, ``jobs``, processes that confirm
    at once, and ``dask``, 'local' or a scheduler address to confirm on (``jobs`` at once, as sweep --dask).
    Returns the JSON-ready result."""
    o = options or {}
    spec = cluster_spec(base)
    gpn = spec.node.gpus
    if gpus % gpn and gpus > gpn:
        raise ScenarioError(f"--gpus ({gpus}) is not a whole number of {gpn}-GPU nodes")
    nodes = max(1, gpus // gpn)
    cluster = Cluster(spec, nodes)
    screen = screen_for(base, cluster, batch, gpus, o.get("stack"))
    budget_gib = o.get("max_memory_gib")
    if budget_gib is not None:
        screen.capacity = min(screen.capacity, budget_gib * 2**30)
    capacity_gib = screen.capacity / 2**30
    screen.prune = True  # what cannot fit is not timed
    layouts = candidates(base, gpus, gpn, o, batch)
    if not layouts:
        hsdp = (
            "; HSDP shards over 1, 2, 4 or 8 whole nodes and needs two replicas or more"
            if "hsdp" in o.get("shardings", ())
            else ""
        )
        raise ScenarioError(
            f"plan: no layout divides this model, batch and GPU count (within the constraints given{hsdp}): "
            + why_none(base, gpus, gpn, o, batch)
        )
    t0 = time.perf_counter()
    estimates = []
    invalid = 0
    reasons: dict[str, int] = {}  # why layouts were refused, the first few
    for lay in layouts:
        try:
            estimates.append(screen.estimate(lay, bound=True))
        except ScenarioError as e:
            invalid += 1
            if len(reasons) < 3:
                reasons[str(e).splitlines()[0]] = reasons.get(str(e).splitlines()[0], 0) + 1
    if not estimates:
        raise NothingFits(
            f"plan: every one of the {len(layouts):,} layouts screened is invalid for this model and cluster, e.g. "
            + "; ".join(reasons)
        )
    t1 = time.perf_counter()
    estimates = refine(screen, estimates, 3 * top)
    t2 = time.perf_counter()
    rate = len(layouts) / max(t2 - t0, 1e-9)
    fitting = sorted((e for e in estimates if e.fits), key=lambda e: e.iteration_s)
    if not fitting:
        lean = min(estimates, key=lambda e: e.memory_gib)
        raise NothingFits(
            f"plan: none of the {len(estimates):,} valid layouts fits in {capacity_gib:.1f} GiB per GPU by the "
            f"estimate; the leanest, {lean.layout.label()}, needs {lean.memory_gib:.1f} GiB: more GPUs (or "
            "memory per GPU), a smaller micro-batch, recompute or sharding"
        )
    confirmed: list[Confirmed] = []
    folded = 0
    jobs = max(1, int(o.get("jobs", 1)))
    pool = None
    stack = ExitStack()
    if o.get("dask"):
        from simulator.study.sweep import dask_client

        client = stack.enter_context(dask_client(o["dask"], jobs))

        def confirm_all(todo: list) -> list:
            return client.gather(client.map(_confirm, todo, pure=False))
    elif jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=jobs)

        def confirm_all(todo: list) -> list:
            return list(pool.map(_confirm, todo)) if len(todo) > 1 else [_confirm(sc, cluster) for sc in todo]
    else:

        def confirm_all(todo: list) -> list:
            return [_confirm(sc, cluster) for sc in todo]

    # confirm layouts until ``top`` differ in shape or simulated time (at most 3 x top simulations): the screen
    # cannot tell sharding variants of one shape apart (their estimates tie), the simulation can. With ``jobs``
    # processes, as many are simulated at once and folded in estimate order, as one by one would.
    refused: dict[str, int] = {}  # fitting by the estimate, refused by the scenario's own checks: not counted

    def loadable():
        """The fitting layouts whose scenario loads (at most 3 x top of them), in estimate order."""
        taken = 0
        for e in fitting:
            if taken >= 3 * top:
                return
            try:
                sc = screen.scenario(e.layout)
            except ScenarioError as err:
                why_not = str(err).splitlines()[0]
                refused[why_not] = refused.get(why_not, 0) + 1
                continue
            taken += 1
            yield e, sc

    queue = loadable()
    try:
        while len(confirmed) < top:
            pairs = list(islice(queue, min(jobs, top - len(confirmed))))
            if not pairs:
                break
            if progress:
                progress(len(confirmed), min(top, len(fitting)))
            batch_ = [e for e, _ in pairs]
            scenarios = [sc for _, sc in pairs]
            todo = scenarios
            done = confirm_all(todo)
            outcomes = iter(done)
            for e, sc in zip(batch_, scenarios, strict=True):
                got = next(outcomes)
                if isinstance(got, (ScenarioError, str)):
                    confirmed.append(
                        Confirmed(
                            e.layout, e.iteration_s, None, None, None, None, None, None, "invalid", str(got)
                        )
                    )
                    continue
                c = _confirmed(e, sc, got, capacity_gib, budget_gib)
                twin = _twin(c, confirmed)
                if twin is None:
                    confirmed.append(c)
                else:  # simulated the same as a confirmed layout of its shape: named beside it
                    twin.same_time.append(e.layout.variant_label())
                    folded += 1
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        stack.close()
    if not confirmed and refused:
        raise NothingFits(
            f"plan: the {sum(refused.values()):,} layouts that fit by the estimate and were tried are all refused by "
            "the scenario's own checks, e.g. " + "; ".join(list(refused)[:3])
        )
    ranked = sorted(
        confirmed,
        key=lambda c: (c.status != "ok", c.iteration_time_s if c.iteration_time_s is not None else math.inf),
    )
    fit = len(fitting) - sum(refused.values())  # those the scenario checks refused do not fit
    # the profile the pick runs on (per layout where the plan chose each one's stack)
    picked = ranked[0].scenario.get("framework", base.framework) if ranked else base.framework
    return {
        "screened": len(layouts),
        "screened_per_s": rate,
        "zero3_replay_s": t2 - t1,  # of the screen: DeepSpeed's coordinator replayed where ZeRO-3 could rank
        "screened_invalid": invalid + sum(refused.values()),
        "fit_in_memory": fit,
        "collapsed": folded,
        "confirmed": len(confirmed),
        "memory_budget_gib": capacity_gib,
        "top": [c.to_dict() for c in ranked],
        "screen_accuracy": screen_accuracy(ranked),
        "why": why(ranked, fit),
        "error_bar": (bar := error_bar(picked, cluster.gpu.architecture, gpus, families(base.model))),
        "caveat": caveat(picked, bar),
    }


def refine(screen: Screen, estimates: list, need: int) -> list:
    """Replay DeepSpeed's ZeRO-3 coordinator (the screen's costliest step) only for the layouts whose lower bound
    could still rank among the ``need`` best that plan may simulate: the ``need``-th best exact estimate that fits
    caps them; a layout above it keeps its bound, and its exact time, never earlier than the bound, ranks below the
    cut too."""
    exact = sorted(e.iteration_s for e in estimates if e.fits and not e.bound)
    cut = exact[need - 1] if len(exact) >= need else math.inf
    return [
        screen.estimate(e.layout) if e.bound and e.fits and e.iteration_s <= cut else e for e in estimates
    ]


def error_bar(framework: str, architecture: str, gpus: int, kinds: tuple[str, ...] = ()) -> dict | None:
    """The profile's error on measured runs the code had not seen, at this GPU generation and job size, for a
    model of the families ``kinds`` (metrics/error_bar.py)."""
    from simulator.frameworks import get_framework
    from simulator.metrics.error_bar import for_run

    return for_run(get_framework(framework), architecture, gpus, kinds=kinds)


def caveat(framework: str, bar: dict | None) -> str:
    """What validation says of the profile the plan simulated with: ``bar``, its error on held-out measured runs,
    then its ``accuracy`` note (docs/validation.md)."""
    from simulator.frameworks import get_framework

    profile = get_framework(framework)
    text = profile.accuracy or "no published run validates this profile"
    g = (bar or {}).get("speed")
    if g:
        text = (
            f"{g['median_abs_pct']:.1f}% median, {g['p90_abs_pct']:.1f}% p90 |error| on {g['n']:,} measured runs the "
            f"code had not seen ({g['scope']}{' [' + g['note'] + ']' if g.get('note') else ''}, mean signed "
            f"{g['mean_signed_pct']:+.1f}%: + is simulated faster); {text}"
        )
    return f"caveat ({profile.name} profile): {text}; docs/validation.md"


def _confirm(s: Scenario, cluster: Cluster | None = None) -> dict | str:
    """The simulated numbers plan keeps for one layout (a process-pool worker builds its own cluster), or the
    reason it is invalid."""
    from simulator.api import simulate

    try:
        m = simulate(s, cluster=cluster).metrics
    except ScenarioError as err:
        return str(err)
    return {
        "iteration_time_s": m.iteration_time_s,
        "mfu": m.mfu,
        "device_gib": m.memory_gib["device"],  # what must fit: peak allocation, CUDA context, NCCL buffers
        "bubble_fraction": m.bubble_fraction,
        "exposed_s": m.comm["exposed_s"],
        "gpu_busy_s": m.host.get("gpu_busy_s"),
        "oom": m.oom,
        "breakdown": m.breakdown,
    }


def _confirmed(e, s: Scenario, m: dict, capacity_gib: float, budget_gib: float | None) -> Confirmed:
    status, reason = "ok", ""
    if m["oom"] or m["device_gib"] > capacity_gib:
        status = "oom"
        reason = (
            f"simulated {m['device_gib']:.2f} GiB per GPU > {capacity_gib:.2f} GiB"
            f"{' (--max-memory-gib)' if budget_gib is not None else ''}; the screen estimated "
            f"{e.memory_gib:.2f} GiB (the simulation adds the allocator's peak, CUDA context and NCCL buffers)"
        )
    return Confirmed(
        e.layout,
        e.iteration_s,
        m["iteration_time_s"],
        m["mfu"],
        m["device_gib"],
        m["bubble_fraction"],
        m["exposed_s"],
        m["gpu_busy_s"],
        status,
        reason,
        m["breakdown"],
        s.model_dump(mode="json", exclude_defaults=True),
    )


def _twin(c: Confirmed, others: list[Confirmed]) -> Confirmed | None:
    """A confirmed layout of ``c``'s shape that simulated within SAME_TIME of it (the faster is kept)."""
    if c.status != "ok":
        return None
    for o in others:
        gap = abs(o.iteration_time_s - c.iteration_time_s) if o.status == "ok" else math.inf
        if gap <= SAME_TIME * min(o.iteration_time_s, c.iteration_time_s) and shape(o.layout) == shape(
            c.layout
        ):
            return o
    return None


def shape(lay: Layout) -> tuple:
    return (lay.tp, lay.pp, lay.cp, lay.dp, lay.v, lay.mbs, lay.ep, lay.etp, lay.schedule)


def why(ranked: list[Confirmed], fitting: int | None = None) -> str:
    """One sentence on why the best beats the runner-up, from their simulated parts (or that they tie);
    ``fitting``: how many layouts fit by the estimate."""
    ok = [c for c in ranked if c.status == "ok"]
    if len(ok) < 2:
        if not ok:
            return "no simulated layout runs: each is out of memory or invalid (their rows say why)"
        if fitting is not None and fitting > 1 and len(ranked) == 1:
            return f"one layout simulated (--top 1) of the {fitting:,} that fit by the estimate"
        return "only one layout fits" if fitting in (None, 1) else "only one simulated layout fits in memory"
    a, b = ok[0], ok[1]
    gain = b.iteration_time_s - a.iteration_time_s
    if gain <= SAME_TIME * b.iteration_time_s:
        lighter, other = (a, b) if (a.memory_gib or 0) <= (b.memory_gib or 0) else (b, a)
        return (
            f"{a.layout.label()} and {b.layout.label()} take the same time within {SAME_TIME:.1%} "
            f"({seconds(a.iteration_time_s)} and {seconds(b.iteration_time_s)}); {lighter.layout.label()} needs "
            f"less memory ({lighter.memory_gib:.1f} against {other.memory_gib:.1f} GiB per GPU)"
        )
    parts = [
        ("GPU compute", a.compute_s or 0.0, b.compute_s or 0.0),
        ("exposed communication", a.exposed_comm_s or 0.0, b.exposed_comm_s or 0.0),
        (
            "pipeline bubble",
            (a.bubble_fraction or 0.0) * a.iteration_time_s,
            (b.bubble_fraction or 0.0) * b.iteration_time_s,
        ),
    ]
    # what is left: the GPU waiting on the host or on a dependency (ZeRO-3's host waits for a reduce-scatter);
    # none where the parts overlap (a tensor-parallel all-reduce inside a step is busy time and exposed at once)
    rest = [max(0.0, c.iteration_time_s - sum(p[i] for p in parts)) for i, c in ((1, a), (2, b))]
    parts.append(("GPU waiting on the host or a dependency", rest[0], rest[1]))
    name, x, y = max(parts, key=lambda p: p[2] - p[1])
    return (
        f"{a.layout.label()} beats {b.layout.label()} by {seconds(gain)} ({100 * gain / b.iteration_time_s:.1f}%), "
        f"mostly in {name}: {seconds(x)} against {seconds(y)}"
    )


def seconds(s: float) -> str:
    """A time with the digits that matter: 12.3 s, 0.452 s, 3.21 ms, 45.6 us."""
    if s == 0:
        return "0 s"
    if s < 0:
        return "-" + seconds(-s)
    if s >= 10:
        return f"{s:.1f} s"
    if s >= 0.1:
        return f"{s:.3f} s"
    if s >= 1e-4:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"
