"""Parallel-layout search: enumerate tensor, pipeline, context and data parallel sizes, virtual stages,
micro-batch size, weight / gradient sharding and activation recompute for a model on N GPUs (``layouts.py``);
screen every candidate with a closed-form estimate built from the simulator's own costs (``screen.py``); confirm
the best with the simulation and say why the best beats the next.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

from simulator.errors import ScenarioError
from simulator.hardware.cluster import Cluster
from simulator.hardware.topology import cluster_spec
from simulator.scenario.schema import Scenario
from simulator.study.layouts import Layout, candidates
from simulator.study.screen import Screen


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

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("layout"))
        d["layout"] = self.layout.label()
        return d


def plan(
    base: Scenario,
    gpus: int,
    top: int = 10,
    options: dict | None = None,
    progress=None,
    batch: int | None = None,
) -> dict:
    """Screen every layout of ``base``'s model (``batch`` sequences per step, default the base's) and confirm
    the best ``top`` with the simulation. Returns the JSON-ready result."""
    from simulator.api import simulate

    spec = cluster_spec(base)
    gpn = spec.node.gpus
    if gpus % gpn and gpus > gpn:
        raise ScenarioError(f"--gpus ({gpus}) is not a whole number of {gpn}-GPU nodes")
    nodes = max(1, gpus // gpn)
    cluster = Cluster(spec, nodes)
    screen = Screen(base, cluster, batch, gpus)
    layouts = candidates(base, gpus, gpn, options, batch)
    if not layouts:
        raise ScenarioError("plan: no layout divides this model, batch and GPU count")
    t0 = time.perf_counter()
    estimates = []
    invalid = 0
    for lay in layouts:
        try:
            estimates.append(screen.estimate(lay))
        except ScenarioError:
            invalid += 1
    rate = len(layouts) / max(time.perf_counter() - t0, 1e-9)
    fitting = sorted((e for e in estimates if e.fits), key=lambda e: e.iteration_s)
    confirmed: list[Confirmed] = []
    for i, e in enumerate(fitting[:top]):
        if progress:
            progress(i, min(top, len(fitting)))
        try:
            s = screen.scenario(e.layout)
            m = simulate(s, cluster=cluster).metrics
        except ScenarioError as err:
            confirmed.append(
                Confirmed(e.layout, e.iteration_s, None, None, None, None, None, None, "invalid", str(err))
            )
            continue
        confirmed.append(
            Confirmed(
                e.layout,
                e.iteration_s,
                m.iteration_time_s,
                m.mfu,
                m.memory_gib["device"],  # what must fit: peak allocation, CUDA context, NCCL buffers
                m.bubble_fraction,
                m.comm["exposed_s"],
                m.host.get("gpu_busy_s"),
                "oom" if m.oom else "ok",
                "",
                m.breakdown,
                s.model_dump(mode="json", exclude_defaults=True),
            )
        )
    ranked = sorted(
        confirmed,
        key=lambda c: (c.status != "ok", c.iteration_time_s if c.iteration_time_s is not None else math.inf),
    )
    return {
        "screened": len(layouts),
        "screened_per_s": rate,
        "screened_invalid": invalid,
        "fit_in_memory": len(fitting),
        "confirmed": len(confirmed),
        "top": [c.to_dict() for c in ranked],
        "why": why(ranked),
    }


def why(ranked: list[Confirmed]) -> str:
    """One sentence on why the best beats the runner-up, from their simulated parts."""
    ok = [c for c in ranked if c.status == "ok"]
    if len(ok) < 2:
        return "only one layout fits" if ok else "no screened layout fits in memory"
    a, b = ok[0], ok[1]
    parts = [
        ("GPU compute", a.compute_s or 0.0, b.compute_s or 0.0),
        ("exposed communication", a.exposed_comm_s or 0.0, b.exposed_comm_s or 0.0),
        (
            "pipeline bubble",
            (a.bubble_fraction or 0.0) * a.iteration_time_s,
            (b.bubble_fraction or 0.0) * b.iteration_time_s,
        ),
    ]
    name, x, y = max(parts, key=lambda p: p[2] - p[1])
    gain = b.iteration_time_s - a.iteration_time_s
    return (
        f"{a.layout.label()} beats {b.layout.label()} by {gain:.3f} s ({100 * gain / b.iteration_time_s:.1f}%), "
        f"mostly in {name}: {x:.3f} s against {y:.3f} s"
    )
