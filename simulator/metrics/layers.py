"""Why a small model is slow, per layer: one microbatch on one rank replayed kernel by kernel.

The engine costs a whole step at once (``simulator/costs/dispatch.py``); this view replays one microbatch's
kernels in order through the same recurrence, one op at a time: the host issues each op after the previous
(waiting for the GPU at every sync), a kernel starts when the GPU is free and the host has issued it. Each
block and pass (embedding, the transformer layers, output head; forward, recompute, backward) gets its GPU busy
time, the GPU time lost waiting for the host (host-bound idle), and the collectives the stream waited for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from simulator.costs.dispatch import gpu_times, host_times
from simulator.workload.recompute import chunk_policies


@dataclass
class BlockTime:
    block: (
        str  # embedding | layer (average of the dense layers) | moe layer (of the MoE layers) | output head
    )
    phase: str  # forward | recompute | backward
    gpu_busy_s: float = 0.0
    host_bound_idle_s: float = 0.0
    exposed_comm_s: float = 0.0
    kernels: int = 0
    host_issue_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def microbatch_view(result, comm_time: Callable | None = None) -> list[BlockTime]:
    """Per (block, pass) of one microbatch of the whole model on one rank; the layer rows are per layer (the
    average over the layers of that kind run back to back: the dense, then the MoE ones)."""
    s, w, compute = result.scenario, result.workload, result.compute
    host = compute.framework.host
    comm_time = comm_time or result.op_comm_time_s
    # (block, pass, ops, times run back to back, host waits for the GPU first); recompute ops carry their flag
    kinds = [(("moe layer" if b.moe else "layer"), b, sum(x is b for x in w.layers)) for b in w.kinds]
    plan = [("embedding", "forward", (*w.microbatch_setup, *w.embedding.forward), 1, host.syncs.microbatch)]
    plan += [(name, "forward", b.forward, n, False) for name, b, n in kinds]
    plan += [
        ("output head", "forward", w.head.forward, 1, False),
        ("output head", "backward", w.head.backward, 1, False),
    ]
    policies = chunk_policies(s, len(w.layers))  # the whole model as one chunk (workload/recompute.py)
    for name, b, _ in kinds:
        for policy in dict.fromkeys(policies):  # each policy its layers of this kind take, in order
            n = sum(1 for x, p in zip(w.layers, policies, strict=True) if x is b and p == policy)
            if n:
                plan.append((name, "backward", (*b.recompute_ops(policy), *b.backward), n, False))
    plan.append(("embedding", "backward", w.embedding.backward, 1, False))
    counts = {name: n for name, _, n in kinds}
    rows: dict[tuple[str, str], BlockTime] = {}
    gpu_clock = host_clock = 0.0
    for block, phase, ops, repeat, sync_first in plan:
        gpu, _ = gpu_times(ops, compute, comm_time)
        issue, syncs = (
            host_times(ops, host, s.training.graph_capture)
            if host.active
            else ([0.0] * len(ops), [False] * len(ops))
        )
        for _ in range(repeat):
            if sync_first and host_clock < gpu_clock:
                host_clock = gpu_clock
            for op, g, c, is_sync in zip(ops, gpu, issue, syncs, strict=True):
                op_phase = "recompute" if op.recompute else phase
                row = rows.setdefault((block, op_phase), BlockTime(block, op_phase))
                if is_sync:
                    host_clock = max(host_clock, gpu_clock) + c
                    row.host_issue_s += c
                    continue
                host_clock += c
                row.host_issue_s += c
                start = max(gpu_clock, host_clock)
                row.host_bound_idle_s += start - gpu_clock
                gpu_clock = start + g
                if op.kind == "collective":
                    row.exposed_comm_s += g
                else:
                    row.gpu_busy_s += g
                    row.kernels += op.launches
    out = list(rows.values())
    for r in out:
        if r.block in counts:
            n = counts[r.block]
            for key in ("gpu_busy_s", "host_bound_idle_s", "exposed_comm_s", "host_issue_s"):
                setattr(r, key, getattr(r, key) / n)
            r.kernels //= n
    return out
