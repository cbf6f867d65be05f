"""Everything a run reports, derived from the timeline (not assumed by a formula).

FLOP conventions
  * model FLOPs (MFU): the FLOPs of forward + backward the model needs, counted per operation from the
    workload (2mnk per GEMM; attention counted in full, s^2, as Megatron-LM's MFU formula does); backward = 2 x
    forward. For a standard GPT this equals 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) (Megatron-Core).
  * hardware FLOPs (HFU): model FLOPs plus the forward work re-run by activation recomputation.
  * ``tflops_per_gpu_narayanan_eq3``: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) / (time x GPUs), the convention of
    Narayanan et al. SC21 Eq. 3 (it counts a full recompute pass whatever the recompute mode).
Breakdown: each moment of the compute stream is booked to forward, backward or optimizer: a running task to its
own phase, an idle gap to the phase of the dependency it waited for (an exposed gradient all-reduce counts as
backward, a ZeRO-3 forward all-gather as forward), as DeepSpeed's and Megatron's timers measure them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field

from simulator.costs.collectives import ring_bytes_per_rank
from simulator.costs.host import COPIES, HOST_GROUPS
from simulator.hardware.placement import Placement
from simulator.metrics.flops import narayanan_eq3_flops
from simulator.metrics.rank import rank_metrics
from simulator.program import COMPUTE
from simulator.scenario.schema import DUAL_SCHEDULES, Scenario
from simulator.timeline.timeline import Timeline


@dataclass
class Metrics:
    iteration_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    samples_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    tflops_per_gpu_narayanan_eq3: float
    bubble_fraction: float
    breakdown: dict[str, float]
    comm: dict[str, float]
    comm_by_collective: dict[str, dict[str, float]]
    memory_gib: dict[str, float]
    oom: bool
    events: int  # SimPy events (collectives and host copies run in simulated time; compute tasks are planned)
    host_oom: bool = False  # offloaded states exceed a node's host memory
    # 1-bit / 0/1 Adam: each kind of step (warm-up, compressed, local) and the average over total_steps
    optimizer_phases: list[dict] = field(default_factory=list)
    amortised_iteration_time_s: float | None = None
    stages: list[dict] = field(default_factory=list)  # per simulated rank: bubble, p2p time, memory, OOM
    # calibration: share of compute / communication time measured, interpolated or modelled; the largest
    # modelled ops; which table was used (simulator/metrics/sources.py)
    cost_sources: dict[str, dict[str, float]] = field(default_factory=dict)
    largest_modelled: list[dict] = field(default_factory=list)
    cost_tables: dict = field(default_factory=dict)
    # the host thread: GPU busy time of the compute stream and GPU time lost waiting for the host to issue
    # kernels, per GPU and iteration (simulator/costs/dispatch.py)
    host: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    framework: str = ""  # the framework-generation profile the run used
    framework_fitted: str = ""  # how that profile was made (its ``fitted``): a calibrated one names its step
    framework_calibrated_on: dict | None = None  # calibrate step's profile: that step's GPU, precision, GPUs
    gpus: int = 0
    strategy: str = ""
    tasks: int = 0  # tasks replayed (compute and communication, every micro-batch of every simulated rank)
    ranks_simulated: int = 0  # ranks replayed; the others behave as one of them
    attention: str = (
        ""  # the attention the model ran: flash or standard (model.attention, or its framework's)
    )
    params_billion: float = 0.0
    # many micro-batches: the run was simulated at these micro-batch counts and extrapolated to the scenario's
    # (exact where the schedule is periodic; simulator/metrics/periodic.py); None when every one was replayed
    periodic: dict | None = None
    # mixture-of-experts runs: the busiest expert-parallel rank's load, tokens dropped by the capacity, and the
    # time of the expert-parallel communication (all-to-all / all-gather over ep, etp and their groups)
    moe: dict | None = None
    # FP8 runs: the recipe and library, and the model FLOP/s against the FP8 (or FP4) dense peak beside ``mfu``,
    # which is against the 16-bit peak as NVIDIA and Megatron-Core state it
    fp8: dict | None = None
    # with training.total_tokens: days, GPU-hours and (with cluster.price_per_gpu_hour) dollars to train
    train: dict | None = None
    # the error bar: the error of its cell on measured runs the code had not seen (simulator/validation/accuracy.py)
    accuracy: dict | None = None

    def to_dict(self) -> dict:
        return _plain(asdict(self))


def _plain(x):
    """numpy scalars -> Python numbers, recursively, so the dict serialises as JSON."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if hasattr(x, "item"):
        return x.item()
    return x


def layout_label(s: Scenario) -> str:
    """Every parallel degree above 1, data parallel always: ``TP8+SP x PP16x2 x CP2 x DP64``."""
    p = s.parallelism
    parts = []
    if p.tensor_parallel > 1:
        parts.append(f"TP{p.tensor_parallel}" + ("+SP" if p.sequence_parallel else ""))
    if p.pipeline_parallel > 1:
        v, name = p.virtual_pipeline_stages, DUAL_SCHEDULES.get(p.pipeline_schedule)
        parts.append(f"PP{p.pipeline_parallel}" + (f" {name}" if name else f"x{v}" if v > 1 else ""))
    if p.context_parallel > 1:
        parts.append(f"CP{p.context_parallel}")
    parts.append(f"DP{p.data_parallel}")
    return " x ".join(parts)


def measure(s: Scenario, timeline: Timeline, placement: Placement, cross_node_fraction=None) -> dict:
    """``cross_node_fraction(op, group)`` (from the collective model) splits each collective's bytes into those
    crossing node boundaries and those staying inside a node.

    What a run adds up (seconds, FLOPs, bytes, counts, memory) as a tree of plain numbers; every rate and
    fraction of :class:`Metrics` is computed from it by :func:`finish_metrics`. Once a schedule is periodic these
    totals grow linearly with the micro-batches, which is what lets ``simulator/metrics/periodic.py``
    extrapolate them."""
    program = timeline.program
    tasks = program.tasks
    lo, hi = 0.0, timeline.makespan_s
    if program.window:  # asynchronous schedules: one steady-state period between two weight updates
        lo, hi = timeline.end[program.window[0]], timeline.end[program.window[1]]
        tasks = [t for t in tasks if lo <= timeline.start[t.id] < hi]  # count what starts inside the period
    gpus = placement.world_size
    weights = [r.count / gpus for r in program.ranks]  # share of the GPUs each simulated rank stands for

    # FLOPs per GPU from what the representative ranks executed, weighted by how many real ranks each stands for
    model_flops = hw_flops = 0.0
    flops_of: dict[int, tuple[float, float]] = {}  # tasks share ops tuples: (model, hardware) FLOPs of each
    counts = [r.count for r in program.ranks]
    by_rank: dict[int, list] = defaultdict(list)
    for t in tasks:
        by_rank[t.rank].append(t)
        if t.stream != COMPUTE or t.kind == "optimizer":
            continue
        key = id(t.ops)
        got = flops_of.get(key)
        if got is None:
            got = flops_of[key] = (
                sum(op.model_flops for op in t.ops if not op.recompute),
                sum(op.model_flops for op in t.ops),
            )
        count = counts[t.rank]
        hw_flops += got[1] * count
        if t.kind != "recompute":  # recompute ops inside a backward step are flagged on the op
            model_flops += got[0] * count
    breakdown: dict[str, float] = {}
    ranks: list[dict] = []
    comm = dict.fromkeys(
        (
            "exposed_s",
            "overlapped_s",
            "total_s",
            "bytes_per_gpu",
            "bytes_cross_node_per_gpu",
            "bytes_host_per_gpu",
        ),
        0.0,
    )
    gpu_busy = host_bound = 0.0
    by_coll: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for rank, rank_tasks in sorted(by_rank.items()):
        w = weights[rank]
        r = rank_metrics(timeline, rank_tasks, lo, hi)
        if rank == 0:
            breakdown = r["breakdown"]
        ranks.append(
            {
                "rank": program.ranks[rank].label,
                "weight": w,
                "pipeline_idle_s": r["pipeline_idle"],
                "busy_s": r["busy"],
                "p2p_s": r["collectives"].get("send_recv:pp", {}).get("time_s", 0.0),
                "exposed_comm_s": r["exposed"],
                "memory_gib": program.ranks[rank].memory.gib(),
            }
        )
        gpu_busy += w * r["gpu_busy"]
        host_bound += w * r["host_bound"]
        comm["exposed_s"] += w * r["exposed"]
        comm["overlapped_s"] += w * r["overlapped"]
        comm["total_s"] += w * r["total"]
        for key, d in r["collectives"].items():
            op, group = key.split(":")
            for name, value in d.items():
                by_coll[key][name] += w * value
            if group in HOST_GROUPS:  # copies to / from host memory and NVMe: not network traffic
                if op in COPIES:
                    by_coll[key]["bytes_pcie_per_gpu"] += w * d["bytes"]
                    comm["bytes_host_per_gpu"] += w * d["bytes"]
                continue
            n = placement.group_size(group)
            sent = w * ring_bytes_per_rank(op, n, d["bytes"])
            by_coll[key]["bytes_sent_per_gpu"] += sent
            comm["bytes_per_gpu"] += sent
            if cross_node_fraction is not None:
                cross = sent * cross_node_fraction(op, group)
                by_coll[key]["bytes_cross_node_per_gpu"] += cross
                by_coll[key]["bytes_intra_node_per_gpu"] += sent - cross
                comm["bytes_cross_node_per_gpu"] += cross
    for d in by_coll.values():
        d.pop("bytes", None)
    return {
        "time_s": hi - lo,
        "model_flops_per_gpu": model_flops / gpus,
        "hardware_flops_per_gpu": hw_flops / gpus,
        "breakdown": {f"{k}_s": breakdown.get(k, 0.0) for k in ("forward", "backward", "optimizer")},
        "comm": comm,
        "comm_by_collective": {k: dict(v) for k, v in sorted(by_coll.items())},
        "ranks": ranks,
        "gpu_busy_s": gpu_busy,
        "host_bound_idle_s": host_bound,
        # the rank with the largest device total (its breakdown is reported)
        "memory_gib": max((r.memory for r in program.ranks), key=lambda m: m.device).gib(),
        "events": timeline.events,
        "tasks": len(program.tasks),
        "ranks_simulated": len(program.ranks),
        "gpus": gpus,
        "strategy": f"{program.strategy}, {layout_label(s)}",
    }


def _oom(memory_gib: dict) -> tuple[bool, bool]:
    """(GPU out of memory, host out of memory) of one rank's memory in GiB (``MemoryBreakdown.gib``)."""
    return memory_gib["device"] > memory_gib["capacity"], memory_gib["host"] > memory_gib["host_capacity"] > 0


def finish_metrics(s: Scenario, m: dict, peak_flops: float) -> Metrics:
    """:class:`Metrics` from the totals of :func:`measure`: rates per second of the iteration, fractions."""
    T, gpus = m["time_s"], m["gpus"]
    tokens = s.training.global_batch_size * s.model.seq_length
    stages = []
    bubble = 0.0
    for r in m["ranks"]:
        idle, busy = r["pipeline_idle_s"], r["busy_s"]
        fraction = idle / (idle + busy) if idle + busy > 0 else 0.0
        bubble += r["weight"] * fraction
        stages.append(
            {
                "rank": r["rank"],
                "bubble_fraction": fraction,
                "p2p_s": r["p2p_s"],
                "exposed_comm_s": r["exposed_comm_s"],
                "memory_peak_gib": r["memory_gib"]["peak"],
                "oom": _oom(r["memory_gib"])[0],
            }
        )
    # the rank with the largest device total, chosen here from every rank's memory (extrapolated rank by rank
    # where the schedule is periodic: which rank is largest can change with the micro-batches)
    memory = max((r["memory_gib"] for r in m["ranks"]), key=lambda g: g["device"], default=m["memory_gib"])
    return Metrics(
        iteration_time_s=T,
        tokens_per_s=tokens / T,
        tokens_per_s_per_gpu=tokens / T / gpus,
        samples_per_s=s.training.global_batch_size / T,
        model_tflops_per_gpu=m["model_flops_per_gpu"] / T / 1e12,
        hardware_tflops_per_gpu=m["hardware_flops_per_gpu"] / T / 1e12,
        mfu=m["model_flops_per_gpu"] / T / peak_flops,
        hfu=m["hardware_flops_per_gpu"] / T / peak_flops,
        tflops_per_gpu_narayanan_eq3=narayanan_eq3_flops(s) / T / gpus / 1e12,
        bubble_fraction=bubble,
        breakdown=dict(m["breakdown"]),
        comm=dict(m["comm"]),
        comm_by_collective={k: dict(v) for k, v in m["comm_by_collective"].items()},
        memory_gib=dict(memory),
        oom=_oom(memory)[0],
        host_oom=any(_oom(r["memory_gib"])[1] for r in m["ranks"]),
        events=m["events"],
        tasks=m["tasks"],
        ranks_simulated=m["ranks_simulated"],
        gpus=gpus,
        strategy=m["strategy"],
        attention=s.model.attention,
        stages=stages,
        host={
            "gpu_busy_s": m["gpu_busy_s"],
            "host_bound_idle_s": m["host_bound_idle_s"],
            "gpu_busy_fraction": m["gpu_busy_s"] / T if T > 0 else 0.0,
        },
    )
