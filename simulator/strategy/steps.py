"""The program pieces every strategy adds: a unit's forward, its backward (after its recomputation), and the
optimizer step, with the framework's per-micro-batch host work and syncs."""

from __future__ import annotations

from simulator.program import COMPUTE, Program
from simulator.scenario.schema import Scenario
from simulator.strategy.units import Unit
from simulator.workload.ops import Op, host_op, memory_op
from simulator.workload.transformer import Workload


def add_forward(
    p: Program, u: Unit, mb: int, deps=(), rank: int = 0, ops: tuple | None = None, sync: bool = False
) -> int:
    return p.add(
        rank,
        COMPUTE,
        "forward",
        "forward",
        f"{u.name} forward",
        deps,
        ops=ops or u.block.forward,
        microbatch=mb,
        sync=sync,
    )


def with_setup(w: Workload, ops: tuple[Op, ...], cache: dict) -> tuple[Op, ...]:
    """``ops`` preceded by the framework's per-microbatch host work (data, masks), one tuple per ``ops``."""
    if not w.microbatch_setup:
        return ops
    key = id(ops)
    if key not in cache:
        cache[key] = (*w.microbatch_setup, *ops)
    return cache[key]


def microbatch_sync(w: Workload) -> bool:
    """Does each microbatch's forward start with the host waiting for the GPU (a blocking input copy)?"""
    return w.framework.host.syncs.microbatch


def add_backward(
    p: Program, s: Scenario, u: Unit, mb: int, deps=(), rank: int = 0, ops: tuple | None = None
) -> int:
    """Backward of one unit, preceded by its recomputation when activation recompute asks for it (the unit's
    policy: workload/recompute.py)."""
    again = u.block.recompute_ops(u.recompute) if u.is_layer else ()
    if again:
        what = {"full": "", "selective": " (attention)", "op": " (per-op)"}.get(u.recompute, "")
        rid = p.add(
            rank,
            COMPUTE,
            "recompute",
            "backward",
            f"{u.name} recompute{what}",
            deps,
            ops=again,
            microbatch=mb,
        )
        deps = (rid,)
    return p.add(
        rank,
        COMPUTE,
        "backward",
        "backward",
        f"{u.name} backward",
        deps,
        ops=ops or u.block.backward,
        microbatch=mb,
    )


# Bytes an optimizer step streams per parameter: Adam reads and writes fp32 master weight, momentum and
# variance (24), reads the fp32 gradient (4) and writes the 16-bit weight (2) = 30; fp32 training skips the copy.
_OPTIMIZER_BYTES = {("adam", True): 30, ("adam", False): 28, ("sgd", True): 18, ("sgd", False): 12}


def add_optimizer(
    p: Program,
    s: Scenario,
    params: float,
    deps=(),
    rank: int = 0,
    w: Workload | None = None,
    tensors: int = 0,
    tensor_host_s: float = 0.0,
) -> int:
    """The optimizer step over ``params`` parameters (``tensors`` parameter tensors, for the framework's
    per-tensor host work, plus ``tensor_host_s`` per tensor for the strategy's own); with a host model it starts
    by reading the overflow flag / gradient norm on the host where the framework does (a sync)."""
    opt = "sgd" if s.training.optimizer == "sgd" else "adam"
    per_param = _OPTIMIZER_BYTES[(opt, s.training.precision != "fp32")]
    op = memory_op(
        f"{s.training.optimizer} step ({params / 1e6:.1f}M params)",
        params * per_param,
        f"{opt}_step",  # per element: one row of the table per parameter count
        round(params),
        1,
    )
    ops: tuple = (op,)
    sync = False
    if w is not None and w.framework.host.active:
        host = w.framework.host
        per_tensor = host.optimizer_tensor_s + tensor_host_s
        if tensors and per_tensor:
            ops = (host_op(f"optimizer loops over {tensors} tensors", tensors * per_tensor), op)
        sync = host.syncs.optimizer
    return p.add(rank, COMPUTE, "optimizer", "optimizer", "optimizer step", deps, ops=ops, sync=sync)
