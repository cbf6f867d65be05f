"""What a compute task costs the GPU and the host thread that issues it.

Eager PyTorch issues every kernel from one host thread per rank: a Python module call, ATen dispatch and
``cudaLaunchKernel`` in forward; the autograd engine (and Python custom ``Function.backward``) in backward. The
GPU runs a kernel once it is free *and* the kernel has been issued. A task is a sequence of kernels i = 1..n with
host issue times c_i and GPU times g_i; if the host starts issuing at H and the GPU is free from B, kernel i
ends at e_i = max(e_{i-1}, H + c_1 + ... + c_i) + g_i, so

    end = max(B + sum g, H + span),   span = max_i (c_1 + ... + c_i + g_i + ... + g_n)

which the engine evaluates in O(1) per task (``simulator/engine/engine.py``). The per-kernel host costs are
the framework profile's (``simulator/frameworks/*.yaml``, ``host:``); with CUDA graphs a task is one graph
launch.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.costs.compute import COMPUTE_BOUND, ComputeModel
from simulator.engine.engine import TaskCost
from simulator.frameworks import HostProfile
from simulator.timeline.timeline import Part
from simulator.workload.ops import Op


def op_host_s(op: Op, host: HostProfile) -> float:
    """Host seconds to issue ``op``: per kernel by pass, per collective call, or the op's own host work (a
    sync's own latency)."""
    if op.kind in ("host", "sync"):
        return op.host_s
    if op.kind == "collective":
        return host.collective_s
    per_kernel = host.forward_kernel_s if op.direction == "forward" else host.backward_kernel_s
    return per_kernel * op.launches


def gpu_times(
    ops: tuple[Op, ...],
    compute: ComputeModel,
    comm_time: Callable[[Op], float],
    behind_slowdown: float = 1.0,
) -> tuple[list[float], list[Part]]:
    """GPU seconds of each op in order (a collective: the part the stream waits for) and the task's parts
    (runs of kernels and the collectives the stream waits for; empty without collectives). A collective that
    ``overlaps`` the kernel before or after it hides behind that kernel (host work between them, such as DeepSpeed
    ZeRO-3's module hooks, is no kernel: it looks past it); only what outlasts it adds time. One
    that runs ``behind`` (combined 1F1B, ``strategy/pipeline/combined.py``) hides behind the kernels after it up to
    the end of its window (a ``boundary`` op or a blocking collective), sharing them with the other ``behind``
    collectives of that window. Its kernels hold SMs meanwhile (NCCL's channels, DeepEP's ``num_sms``): the
    window's compute-bound kernels run ``behind_slowdown`` times longer while it runs (costs/contention.py), and
    the window takes the longer of its two streams, the slowed kernels and the collective."""
    parts: list[Part] = []
    gpu: list[float] = []
    run_s = 0.0
    in_run = False
    budget = 0.0  # time of the last kernel that "previous"-overlapping collectives can still hide behind
    beside = 0.0  # time of the last collective, which an "alongside" collective runs beside
    window: float | None = None  # kernel time of the window that "behind" collectives hide behind
    extra = sent = 0.0  # what the window's kernels slow by beside them; its collectives' seconds so far
    slowed = 0.0  # what a "behind" collective's SMs cost the kernels it hides behind
    has_collective = False
    for i, op in enumerate(ops):
        if _ends_window(op):
            window = None
        if op.kind != "collective":
            g = compute.op_time_s(op)
            gpu.append(g)
            run_s += g
            in_run = True
            # host work (a framework's hooks) runs no kernel a collective could hide behind
            if op.kind != "host":
                budget = g
            continue
        has_collective = True
        if in_run:
            parts.append(Part("kernels", "compute", "", 0.0, run_s))
            run_s, in_run = 0.0, False
        seconds = comm_time(op)
        hidden = 0.0
        if op.overlaps == "previous":
            hidden = min(seconds, budget)
            budget -= hidden
        elif op.overlaps == "next":
            following = next((o for o in ops[i + 1 :] if o.kind not in ("collective", "host")), None)
            hidden = min(seconds, compute.op_time_s(following)) if following else 0.0
        elif (
            op.overlaps == "alongside"
        ):  # two transfers of one kernel on other links (DeepEP: RDMA and NVLink)
            hidden = min(seconds, beside)
        elif op.overlaps == "behind":
            if window is None:
                window, bound = _window_kernels_s(ops, i, compute)
                extra = (bound / window if window else 0.0) * (behind_slowdown - 1.0)
                sent = 0.0
            grew = _beyond(sent + seconds, window, extra) - _beyond(sent, window, extra)
            exposed = min(grew, max(sent + seconds - window, 0.0) - max(sent - window, 0.0))
            sent += seconds
            slowed = grew - exposed
            hidden = seconds - exposed
        beside = seconds
        gpu.append(seconds - hidden + slowed)
        parts.append(Part(op.name, op.collective, op.group, op.bytes, seconds - hidden, hidden))
        if slowed > 0:
            parts.append(Part("kernels beside communication", "compute", "", 0.0, slowed))
        slowed = 0.0
    if has_collective and in_run:
        parts.append(Part("kernels", "compute", "", 0.0, run_s))
    return gpu, parts if has_collective else []


def _beyond(sent: float, kernels: float, extra: float) -> float:
    """How much longer than its ``kernels`` seconds a window runs with ``sent`` seconds of collectives behind them:
    the longer of its two streams, the kernels slowed by ``extra`` of the time a collective runs beside them."""
    return max(sent, kernels + min(sent, kernels) * extra) - kernels


def _ends_window(op: Op) -> bool:
    """Does ``op`` end the window ``behind`` collectives hide in: a ``boundary`` marker or a collective the stream
    waits for?"""
    return op.overlaps == "boundary" or (
        op.kind == "collective" and op.overlaps not in ("behind", "alongside")
    )


def _window_kernels_s(ops: tuple[Op, ...], start: int, compute: ComputeModel) -> tuple[float, float]:
    """Kernel seconds after ``ops[start]`` up to the end of its window (a ``boundary`` op or a blocking
    collective), and those of its compute-bound kernels."""
    total = bound = 0.0
    for op in ops[start + 1 :]:
        if _ends_window(op):
            break
        if op.kind != "collective":
            g = compute.op_time_s(op)
            total += g
            bound += g if op.kind in COMPUTE_BOUND else 0.0
    return total, bound


def host_times(
    ops: tuple[Op, ...], host: HostProfile, cuda_graphs: bool | frozenset[str] = False
) -> tuple[list[float], list[bool]]:
    """Host seconds to issue each op, and which ops are syncs (the host waits for the GPU there). With CUDA
    graphs (``True``) one launch issues every kernel (a captured graph holds no sync); host work outside kernels
    remains. With a set of modules (``training.cuda_graph_modules``: Megatron-Core's per-layer graphs of those
    modules alone) each run of kernels of those modules is one launch, the rest is issued kernel by kernel and its
    syncs stay."""
    if cuda_graphs is True:
        issue = [op.host_s if op.kind == "host" else 0.0 for op in ops]
        if issue:
            issue[0] += host.graph_launch_s
        return issue, [False] * len(ops)
    if not cuda_graphs:
        return [op_host_s(op, host) for op in ops], [op.kind == "sync" for op in ops]
    issue, syncs = [], []
    graph = None  # the graph the previous op went out in: the next op of the same graph costs no launch
    for op in ops:
        captured = op.module in cuda_graphs
        this = GRAPH_OF.get(op.module, op.module) if captured else None
        if captured:
            issue.append(
                (op.host_s if op.kind == "host" else 0.0) + (0.0 if this == graph else host.graph_launch_s)
            )
        else:
            issue.append(op_host_s(op, host))
        syncs.append(op.kind == "sync" and not captured)
        graph = this
    return issue, syncs


# one graph per module of each layer, the router's preprocessing in the router's (Megatron-Core captures
# moe_preprocess only together with moe_router)
GRAPH_OF = {"moe_preprocess": "moe_router"}


def task_cost(
    ops: tuple[Op, ...],
    compute: ComputeModel,
    comm_time: Callable[[Op], float],
    host: HostProfile | None = None,
    cuda_graphs: bool | frozenset[str] = False,
    behind_slowdown: float = 1.0,
) -> TaskCost:
    """GPU seconds of a compute task, its parts, and how its host thread issues it (``TaskCost``)."""
    if not ops:
        return TaskCost(0.0)
    gpu, parts = gpu_times(ops, compute, comm_time, behind_slowdown)
    total = sum(gpu)
    parts_t = tuple(parts)
    if host is None or not host.active:
        return TaskCost(total, parts_t, first_s=total)
    issue, syncs = host_times(ops, host, cuda_graphs)
    segments: list[list[tuple[float, float]]] = [[]]
    between = 0.0  # latency of the syncs inside the task
    for c, g, is_sync in zip(issue, gpu, syncs, strict=True):
        if is_sync:
            segments.append([])
            between += c
        else:
            segments[-1].append((c, g))
    first = _segment(segments[0])
    if len(segments) == 1:
        return TaskCost(total, parts_t, first[1], first[2], first[3], first[0])
    later = [_segment(seg) for seg in segments[1:]]
    then = between + sum(seg[2] for seg in later)
    slack = later[-1][2] - later[-1][1]
    return TaskCost(total, parts_t, first[1], first[2], first[3], first[0], then, slack)


def _segment(items: list[tuple[float, float]]) -> tuple[float, float, float, float]:
    """(GPU seconds, host seconds, span, lead) of kernels (host issue seconds, GPU seconds) issued back to back:
    span = max_i (issued up to i + GPU time from i on); lead = host time before the first kernel can start."""
    total = sum(g for _, g in items)
    span = lead = issued = 0.0
    remaining = total
    first = True
    for c, g in items:
        issued += c
        if issued + remaining > span:
            span = issued + remaining
        if first and g > 0:
            lead, first = issued, False
        remaining -= g
    return total, issued, span, lead
