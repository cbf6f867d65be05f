"""The whole data flow in one call: scenario -> workload -> strategy -> engine -> timeline -> metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass

from simulator.costs.collectives import CollectiveModel
from simulator.costs.compute import ComputeModel
from simulator.engine.engine import simulate_program
from simulator.frameworks import Framework, get_framework
from simulator.hardware.cluster import Cluster
from simulator.hardware.placement import Placement
from simulator.hardware.topology import cluster_spec
from simulator.metrics.metrics import Metrics, compute_metrics
from simulator.scenario.loader import load_scenario
from simulator.scenario.schema import Scenario
from simulator.strategy import build_program
from simulator.strategy.program import Program
from simulator.timeline.timeline import Part, Timeline
from simulator.workload.transformer import Workload, build_workload

__all__ = ["Result", "load_scenario", "simulate"]


@dataclass
class Result:
    scenario: Scenario
    workload: Workload
    program: Program
    timeline: Timeline
    cluster: Cluster
    placement: Placement
    metrics: Metrics
    comm: CollectiveModel  # the collective costs the run used (reports reuse its cached patterns)


def placement_for(s: Scenario) -> Placement:
    p = s.parallelism
    shard = p.fsdp.hybrid_shard_size if p.fsdp and p.fsdp.hybrid_shard_size else None
    return Placement(
        p.tensor_parallel, p.context_parallel, p.data_parallel, p.pipeline_parallel, shard, p.rank_order
    )


def split_parts(ops, compute: ComputeModel, comm: CollectiveModel) -> tuple[float, tuple[Part, ...]]:
    """Seconds of a compute task and, when it holds collectives, its parts in order. A collective that
    ``overlaps`` the kernel before or after it hides behind that kernel; only what outlasts it adds time."""
    if not any(op.kind == "collective" for op in ops):
        return compute.ops_time_s(ops), ()
    parts: list[Part] = []
    run: list = []
    budget = 0.0  # time of the last kernel that "previous"-overlapping collectives can still hide behind
    for i, op in enumerate((*ops, None)):
        if op is not None and op.kind != "collective":
            run.append(op)
            continue
        if run:
            budget = compute.op_time_s(run[-1])
            parts.append(Part("kernels", "compute", "", 0.0, compute.ops_time_s(tuple(run))))
            run = []
        if op is None:
            break
        seconds = comm.standalone_time_s(op.collective, op.group, op.bytes)
        hidden = 0.0
        if op.overlaps == "previous":
            hidden = min(seconds, budget)
            budget -= hidden
        elif op.overlaps == "next":
            following = next((o for o in ops[i + 1 :] if o.kind != "collective"), None)
            hidden = min(seconds, compute.op_time_s(following)) if following else 0.0
        parts.append(Part(op.name, op.collective, op.group, op.bytes, seconds - hidden, hidden))
    return sum(p.duration_s for p in parts), tuple(parts)


def simulate(
    scenario: Scenario | str,
    cluster: Cluster | None = None,
    workload: Workload | None = None,
    framework: Framework | None = None,
) -> Result:
    """Simulate one training iteration. ``scenario`` is a :class:`Scenario` or a path to a YAML file;
    ``cluster`` and ``workload`` replace the ones the scenario describes (what-if studies, tests)."""
    t0 = time.perf_counter()
    s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    cluster = cluster or Cluster(cluster_spec(s), s.cluster.num_nodes)
    workload = workload or build_workload(s)
    program = build_program(s, workload, cluster.gpu)
    placement = placement_for(s)
    comm = CollectiveModel(cluster, placement, s.parallelism.collective_algorithm)
    compute = ComputeModel(cluster.gpu, s.training.precision, framework or get_framework(s.framework))
    durations: dict[int, tuple[float, tuple[Part, ...]]] = {}  # tasks share ops tuples: cost each once

    def task_duration(task) -> tuple[float, tuple[Part, ...]]:
        key = id(task.ops)
        if key not in durations:
            durations[key] = split_parts(task.ops, compute, comm)
        return durations[key]

    stage_of = [r.stage for r in program.ranks]
    timeline = simulate_program(
        program, task_duration, lambda t: comm.phases(t.kind, t.group, t.bytes, stage_of[t.rank])
    )
    metrics = compute_metrics(
        s, timeline, placement, cluster.gpu.peak_flops(s.training.precision), comm.cross_node_fraction
    )
    metrics.params_billion = workload.total_params / 1e9
    metrics.wall_s = time.perf_counter() - t0
    return Result(s, workload, program, timeline, cluster, placement, metrics, comm)
