"""Communication running beside compute takes SMs from it.

NCCL runs each collective as one kernel of one thread block per channel (NVIDIA/nccl src/enqueue.cc: the launch
grid is ``nChannels`` blocks; src/include/device.h NCCL_MAX_NTHREADS = 640 threads each), and a block stays on
its SM until the collective ends. A GEMM or attention kernel's thread blocks fill an SM's registers and shared
memory, so they do not share an SM with one of NCCL's: while a collective runs on a communication stream, the
compute-bound kernels beside it run on the SMs left, ``SMs - channels`` of them, and take ``SMs / (SMs -
channels)`` of their time (A100: 108 SMs, 16 channels, 1.17x; H100 132, 1.14x). Memory-bound kernels keep
theirs (they need the HBM, which NCCL's copies load far less than they do). Copies to host memory and NVMe run
on the copy engines and take no SM.

The engine plans compute from fixed durations, so this is a second pass: the first timeline says how long each
compute task ran beside communication of its rank; each such task is lengthened by that overlap times its
compute-bound share times the slowdown less one, and the program is replayed once more (one fixed-point step:
the longer tasks change what overlaps them only at their edges)."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable
from itertools import accumulate

from simulator.costs.host import HOST_GROUPS
from simulator.engine.engine import TaskCost
from simulator.program import COMPUTE, Program
from simulator.scenario.schema import FLEX_DISPATCHERS
from simulator.timeline.timeline import Part, Timeline, union


def sm_slowdown(sms: int, channels: int) -> float:
    """How much longer a compute-bound kernel takes beside a collective of ``channels`` thread blocks."""
    if channels <= 0:
        return 1.0
    return sms / max(sms - channels, 1)


DEEPEP_SMS = (
    20  # deepseek-ai/DeepEP deep_ep/buffer.py (v1, 4151890): Buffer.num_sms = 20; DeepSeek-V3 Sec. 3.2.2
)


def dispatcher_sms(s) -> int:
    """SMs an MoE dispatcher's communication holds: DeepEP's ``num_sms`` (parallelism.moe.dispatcher_sms,
    Megatron-Core's moe_flex_dispatcher_num_sms), else NCCL's channels (memory.nccl_channels)."""
    moe = s.parallelism.moe
    if moe.dispatcher in FLEX_DISPATCHERS:  # (HybridEP's own default is not read here: DeepEP's)
        return moe.dispatcher_sms or DEEPEP_SMS
    return s.memory.nccl_channels


# Point-to-point transfers (pipeline sends) run on NCCL_NCHANNELS_PER_NET_PEER channels per peer, 2 by default
# (NCCL 2.12 and later, src/transport/net.cc / docs' environment variables), not a collective's whole set
P2P_CHANNELS = 2


def contention_s(
    program: Program,
    timeline: Timeline,
    compute_share: Callable[[tuple], float],
    sms: int,
    channels: int,
) -> dict[int, float]:
    """Seconds each compute task of ``timeline`` loses to the communication that ran beside it on its rank:
    collectives hold ``channels`` of the ``sms`` SMs, point-to-point transfers P2P_CHANNELS (where both run, the
    collectives count); ``compute_share(ops)``: the fraction of the ops' GPU time in compute-bound kernels."""
    collective, p2p = sm_slowdown(sms, channels) - 1.0, sm_slowdown(sms, min(P2P_CHANNELS, channels)) - 1.0
    if collective <= 0:
        return {}
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    everything: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for t in program.tasks:
        if t.stream != COMPUTE and t.is_collective and t.group not in HOST_GROUPS:
            span = (timeline.start[t.id], timeline.end[t.id])
            everything[t.rank].append(span)
            if t.kind != "send_recv":
                spans[t.rank].append(span)
    busy = {rank: _Busy(union(s)) for rank, s in spans.items()}
    any_busy = {rank: _Busy(union(s)) for rank, s in everything.items()}
    none = _Busy([])
    out: dict[int, float] = {}
    shares: dict[int, float] = {}  # tasks share their ops tuples: one share each
    for t in program.tasks:
        if t.stream != COMPUTE or not t.ops or t.rank not in any_busy:
            continue
        a, b = timeline.start[t.id], timeline.end[t.id]
        beside = any_busy[t.rank].within(a, b)
        if beside <= 0:
            continue
        key = id(t.ops)
        if key not in shares:
            shares[key] = compute_share(t.ops)
        if shares[key] > 0:
            full = busy.get(t.rank, none).within(a, b)
            out[t.id] = shares[key] * (full * collective + (beside - full) * p2p)
    return out


class _Busy:
    """Disjoint sorted intervals, asked for their length inside [a, b] in O(log n)."""

    def __init__(self, spans: list[tuple[float, float]]):
        self.starts = [a for a, _ in spans]
        self.ends = [b for _, b in spans]
        self.before = [0.0, *accumulate(b - a for a, b in spans)]  # length of the first i intervals

    def until(self, x: float) -> float:
        """Length of the intervals before ``x``."""
        i = bisect_right(self.starts, x)  # intervals starting at or before x
        if i == 0:
            return 0.0
        return self.before[i - 1] + min(x, self.ends[i - 1]) - self.starts[i - 1]

    def within(self, a: float, b: float) -> float:
        return self.until(b) - self.until(a) if b > a else 0.0


def lengthened(cost: TaskCost, extra: float) -> TaskCost:
    """``cost`` with ``extra`` GPU seconds (kernels slowed by a collective beside them), in its first segment."""
    parts = (*cost.parts, Part("kernels beside NCCL", "compute", "", 0.0, extra)) if cost.parts else ()
    return cost._replace(
        seconds=cost.seconds + extra,
        parts=parts,
        span_s=cost.span_s + extra if cost.span_s else 0.0,
        first_s=cost.first_s + extra,
    )
