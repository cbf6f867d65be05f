"""The whole data flow in one call: scenario -> workload -> strategy -> engine -> timeline -> metrics."""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass

from simulator.costs.collectives import CollectiveModel
from simulator.costs.compute import COMPUTE_BOUND, ComputeModel
from simulator.costs.contention import contention_s, dispatcher_sms, lengthened, sm_slowdown
from simulator.costs.dispatch import task_cost
from simulator.costs.host import HOST_GROUPS, HostModel
from simulator.costs.tables import table_lookups
from simulator.engine.engine import TaskCost, simulate_program
from simulator.errors import ScenarioError
from simulator.frameworks import Framework, get_framework
from simulator.hardware.cluster import Cluster
from simulator.hardware.placement import Placement
from simulator.hardware.topology import cluster_spec
from simulator.metrics.additions import fp8_metrics, moe_metrics, train_metrics
from simulator.metrics.error_bar import families, for_run
from simulator.metrics.metrics import Metrics, finish_metrics, measure
from simulator.metrics.periodic import EVERY_MICROBATCH, NotPeriodic, extrapolate, sample_windows, worth_it
from simulator.metrics.sources import source_seconds, summarise_sources
from simulator.program import Program
from simulator.scenario.loader import load_scenario
from simulator.scenario.parallelism import DUAL_SCHEDULES
from simulator.scenario.schema import MAX_STAGE_MICROBATCHES, ONEBIT_OPTIMIZERS, Scenario
from simulator.strategy import build_program, check_scenario
from simulator.strategy.groups import placement_for
from simulator.tables.lookup import MODELLED
from simulator.tables.select import resolve_tables
from simulator.timeline.timeline import Timeline
from simulator.workload.ops import OpsMemo
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
    host: HostModel  # the host-copy and CPU-step costs (offload)
    compute: ComputeModel  # the kernel costs the run used, with their sources

    def task_phases(self, t, stage: int | None = None):
        """The phases (latency, link demand) the engine ran task ``t`` as."""
        return task_phases(self.comm, self.host, t, stage)

    def op_comm_time_s(self, op) -> float:
        """Seconds of a collective op inside a compute task, as the run costed it."""
        return op_comm_time_s(self.comm, self.host, op)


def cost_model(comm: CollectiveModel, host: HostModel, group: str) -> CollectiveModel | HostModel:
    """Which model costs a transfer on ``group``: host copies (``host``, ``nvme``) or collectives."""
    return host if group in HOST_GROUPS else comm


def op_comm_time_s(comm: CollectiveModel, host: HostModel, op) -> float:
    """Seconds of a collective (or host copy) op inside a compute task, alone on its links."""
    return cost_model(comm, host, op.group).standalone_time_s(op.collective, op.group, op.bytes)


def task_phases(comm: CollectiveModel, host: HostModel, t, stage: int | None):
    return cost_model(comm, host, t.group).phases(t.kind, t.group, t.bytes, stage)


@contextmanager
def _no_cyclic_gc():
    """A pipeline run allocates ~10^5 long-lived objects (tasks, tuples); Python's cyclic collector would walk
    them again and again as they pile up (~20% of the run). Reference counting still frees everything."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def simulate(
    scenario: Scenario | str,
    cluster: Cluster | None = None,
    workload: Workload | None = None,
    framework: Framework | None = None,
    periodic: bool | str = "auto",
) -> Result:
    """Simulate one training iteration. ``scenario`` is a :class:`Scenario` or a path to a YAML file;
    ``cluster`` and ``workload`` replace the ones the scenario describes (what-if studies, tests).

    With many micro-batches (more than six times the pipeline depth) and ``periodic`` on, three shorter runs
    are simulated and the metrics extrapolated, exactly where the schedule is periodic (checked;
    ``simulator/metrics/periodic.py``): ``metrics.periodic`` then says so, and ``timeline`` and ``program``
    are the longest of the three. ``"auto"`` (the default) does so only where the shorter runs cost less than
    replaying every micro-batch (``periodic.worth_it``); ``periodic=False`` replays every micro-batch (traces
    and reports need it)."""
    with _no_cyclic_gc():
        return _simulate(scenario, cluster, workload, framework, periodic)


def with_microbatches(s: Scenario, microbatches: int) -> Scenario:
    """The scenario with ``microbatches`` micro-batches per pipeline per iteration (the global batch changed)."""
    t = s.training
    dp = s.parallelism.data_parallel or 1
    return s.model_copy(
        update={
            "training": t.model_copy(update={"global_batch_size": microbatches * t.micro_batch_size * dp})
        }
    )


def check_full_replay(s: Scenario, periodic: bool | str, why: str) -> None:
    """Every micro-batch of every pipeline chunk is replayed: within MAX_STAGE_MICROBATCHES stage steps (about
    15 s). The periodic replay simulates a few short runs instead, so the limit binds only here."""
    micro = s.gradient_accumulation_steps
    chunks = s.parallelism.pipeline_parallel * s.parallelism.virtual_pipeline_stages
    if micro * chunks <= MAX_STAGE_MICROBATCHES:
        return
    because = (
        "a trace, report or --exact asks for every one" if not periodic else f"no periodic replay: {why}"
    )
    raise ScenarioError(
        f"training: {micro:,} micro-batches x {chunks} pipeline chunks = {micro * chunks:,} stage steps to replay "
        f"one by one ({because}); the simulator's limit is {MAX_STAGE_MICROBATCHES:,}"
    )


def _simulate(scenario, cluster, workload, framework, periodic) -> Result:
    t0 = time.perf_counter()
    s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    cluster = cluster or Cluster(cluster_spec(s), s.cluster.num_nodes)
    framework = framework or (workload.framework if workload else get_framework(s.framework))
    workload = workload or build_workload(s, framework, cluster.gpus_per_node, cluster.gpu)
    placement = placement_for(s)
    kernels, measured_comm, table_info = table_lookups(
        resolve_tables(s.kernels, cluster.gpu.lineage, s.kernels_only), cluster
    )
    comm = CollectiveModel(cluster, placement, s.parallelism.collective_algorithm, measured_comm)
    compute = ComputeModel(
        cluster.gpu,
        s.training.dtype,
        framework,
        kernels,
        placement.world_size,
        s.cluster.gpu_speed_sd,
        workload.fp8.gemm_scale if workload.fp8 else 1.0,
    )
    dispatch = compute.framework.host  # the profile as it applies on this GPU
    host = HostModel(comm, s)
    peak = cluster.gpu.peak_flops(s.training.dtype)  # MFU against the 16-bit dense peak, as NVIDIA states it

    def comm_time(op) -> float:
        return op_comm_time_s(comm, host, op)

    # NCCL's thread blocks hold SMs that compute-bound kernels beside them lose (costs/contention.py)
    sms, channels = cluster.gpu.sm_count, s.memory.nccl_channels if s.cluster.nccl_sm_contention else 0
    # and so do the dispatcher's kernels behind another micro-batch's compute (combined 1F1B, DualPipe)
    behind = sm_slowdown(sms, dispatcher_sms(s)) if s.cluster.nccl_sm_contention else 1.0

    # tasks share ops tuples: cost each once, and add up each one's sources once (workload/ops.py OpsMemo)
    durations, sourced = OpsMemo(), OpsMemo()

    def replay(sc: Scenario, program: Program) -> tuple[Timeline, dict, dict]:
        """The program's timeline and what it adds up (metrics.measure, sources.source_seconds)."""

        def cost_of(ops: tuple) -> TaskCost:
            return task_cost(ops, compute, comm_time, dispatch, s.training.graph_capture, behind)

        def task_duration(task) -> TaskCost:
            return durations.get(task.ops, cost_of)

        stage_of = [r.stage for r in program.ranks]

        def phases(t):
            return task_phases(comm, host, t, stage_of[t.rank])

        timeline = simulate_program(program, task_duration, phases)

        def compute_share(ops) -> float:  # of the GPU seconds the first replay costed for these ops
            total = durations.get(ops, cost_of).seconds
            return (
                sum(compute.op_time_s(op) for op in ops if op.kind in COMPUTE_BOUND) / total if total else 0.0
            )

        extra = contention_s(program, timeline, compute_share, sms, channels) if channels else {}
        if extra:  # the compute beside communication, lengthened, replayed once more (costs/contention.py)

            def with_contention(task) -> TaskCost:
                cost = task_duration(task)
                return lengthened(cost, extra[task.id]) if task.id in extra else cost

            timeline = simulate_program(program, with_contention, phases)
        lo, hi = (timeline.end[w] for w in program.window) if program.window else (0.0, timeline.makespan_s)
        totals = measure(sc, timeline, placement, comm.cross_node_fraction)
        return timeline, totals, source_seconds(timeline, lo, hi, compute.op_cost, comm_source, sourced)

    def finish(totals: dict, sources: dict) -> Metrics:
        metrics = finish_metrics(s, totals, peak)
        metrics.cost_sources, metrics.largest_modelled = summarise_sources(sources)
        metrics.cost_tables = table_info
        return metrics

    def run(program: Program) -> tuple[Timeline, Metrics]:
        timeline, totals, sources = replay(s, program)
        return timeline, finish(totals, sources)

    def comm_source(kind: str, group: str, nbytes: float, stage: int | None) -> str:
        return MODELLED if group in HOST_GROUPS else comm.source(kind, group, nbytes, stage)

    def run_periodic(windows: list[tuple[int, int, int]]) -> tuple[Program, Timeline, Metrics]:
        """Simulate each window's micro-batch counts per pipeline (runs shared between windows) and extrapolate
        to the scenario's from the first window where every total is linear; NotPeriodic where none is."""
        samples: dict[int, tuple] = {}  # micro-batches -> (totals, sources, tasks, events)
        last = None  # the longest run's program and timeline, for the result
        for window in windows:
            for mb in window:
                if mb in samples:
                    continue
                sample = with_microbatches(s, mb)
                program = build_program(sample, workload, cluster)
                if program.window:
                    raise NotPeriodic("an asynchronous schedule reports one steady-state period already")
                timeline, totals, sources = replay(sample, program)
                samples[mb] = (totals, sources, totals.pop("tasks"), totals.pop("events"))
                last = (program, timeline)
            try:
                totals, sources = extrapolate(
                    [(mb, samples[mb][:2]) for mb in window], s.gradient_accumulation_steps
                )
            except NotPeriodic:
                continue
            # what was replayed, not extrapolated
            replayed = {
                "tasks": sum(x[2] for x in samples.values()),
                "events": sum(x[3] for x in samples.values()),
            }
            metrics = finish({**totals, **replayed}, sources)
            metrics.periodic = {"microbatches": s.gradient_accumulation_steps, "simulated": sorted(samples)}
            return *last, metrics
        raise NotPeriodic("no window of micro-batch counts is periodic")

    check_scenario(s)  # on the real micro-batch count, before a periodic replay samples fewer
    windows = []
    if periodic and s.training.optimizer not in ONEBIT_OPTIMIZERS:
        par = s.parallelism
        # DualPipe needs 2 micro-batches a rank at least (schedules/dualpipe.py)
        depth = par.pipeline_parallel * (2 if par.pipeline_schedule in DUAL_SCHEDULES else 1)
        step = 1 if par.pipeline_schedule in EVERY_MICROBATCH or par.pipeline_parallel == 1 else None
        windows = sample_windows(s.gradient_accumulation_steps, depth, step=step)
        steps = s.gradient_accumulation_steps * par.pipeline_parallel * par.virtual_pipeline_stages
        if periodic == "auto" and steps <= MAX_STAGE_MICROBATCHES:  # else only the periodic replay can run it
            windows = worth_it(s.gradient_accumulation_steps, windows)
    try:
        if not windows:
            raise NotPeriodic("too few micro-batches to gain")
        program, timeline, metrics = run_periodic(windows)
    except NotPeriodic as why:
        check_full_replay(s, periodic, str(why))
        program = build_program(s, workload, cluster)
        timeline, metrics = run(program)
    if s.training.optimizer in ONEBIT_OPTIMIZERS:
        metrics.optimizer_phases = _optimizer_phases(s, workload, cluster, metrics, run)
        total = s.training.onebit.total_steps
        if total:
            steps = sum(ph["steps"] for ph in metrics.optimizer_phases)
            metrics.amortised_iteration_time_s = (
                sum(ph["steps"] * ph["iteration_time_s"] for ph in metrics.optimizer_phases) / steps
            )
    metrics.params_billion = workload.total_params / 1e9
    if workload.expert_load is not None:
        metrics.moe = moe_metrics(workload.expert_load, metrics.comm_by_collective)
    if workload.fp8 is not None:
        metrics.fp8 = fp8_metrics(
            workload.fp8, metrics, peak, cluster.gpu.peak_flops(workload.fp8.gemm_dtype)
        )
    if s.training.total_tokens:
        metrics.train = train_metrics(s.training.total_tokens, metrics, s.cluster.price_per_gpu_hour)
    metrics.framework = compute.framework.name
    metrics.framework_fitted = compute.framework.fitted
    on = compute.framework.calibrated_on
    metrics.framework_calibrated_on = on.model_dump() if on is not None else None
    metrics.accuracy = for_run(
        framework,
        cluster.gpu.architecture,
        metrics.gpus,
        cluster.gpu.name,
        s.training.precision,
        families(s.model),
    )
    metrics.wall_s = time.perf_counter() - t0
    return Result(s, workload, program, timeline, cluster, placement, metrics, comm, host, compute)


def _optimizer_phases(
    s: Scenario, workload: Workload, cluster: Cluster, compressed: Metrics, run
) -> list[dict]:
    """1-bit / 0/1 Adam: every kind of step simulated on its own (the result's timeline is the compressed
    step, the steady state), with the number of steps of each kind in ``training.onebit.total_steps``."""
    from simulator.strategy import onebit

    total = s.training.onebit.total_steps
    counts = onebit.step_counts(s.training.optimizer, s.training.onebit, total) if total else {}
    kinds = ("warm-up", "compressed") if s.training.optimizer == "onebit-adam" else onebit.PHASES
    out = []
    for kind in kinds:
        m = compressed if kind == "compressed" else run(build_program(s, workload, cluster, kind))[1]
        out.append(
            {
                "phase": kind,
                "steps": counts.get(kind),
                "iteration_time_s": m.iteration_time_s,
                "bytes_per_gpu": m.comm["bytes_per_gpu"],
                "exposed_comm_s": m.comm["exposed_s"],
            }
        )
    return out
