"""The program pieces every strategy adds: a unit's forward, its backward (after its recomputation), and the
optimizer step, with the framework's per-micro-batch host work and syncs."""

from __future__ import annotations

from simulator.program import COMPUTE, Program
from simulator.scenario.schema import Scenario
from simulator.strategy.units import Unit
from simulator.workload.memory import MOMENT_BYTES
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


def recompute_name(u: Unit) -> str:
    """The name of a unit's recomputation task, with its policy."""
    return f"{u.name} recompute" + {"full": "", "selective": " (attention)", "op": " (per-op)"}.get(
        u.recompute, ""
    )


def add_backward(
    p: Program, s: Scenario, u: Unit, mb: int, deps=(), rank: int = 0, ops: tuple | None = None
) -> int:
    """Backward of one unit, preceded by its recomputation when activation recompute asks for it (the unit's
    policy: workload/recompute.py)."""
    again = u.block.recompute_ops(u.recompute) if u.is_layer else ()
    if again:
        rid = p.add(
            rank,
            COMPUTE,
            "recompute",
            "backward",
            recompute_name(u),
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


def optimizer_step_bytes(s: Scenario, framework) -> float:
    """Bytes the optimizer step streams per parameter: the table above, or for Adam the profile's
    ``optimizer_step_bytes`` where it states an unfused step (Composer's DecoupledAdamW and clipping: 92)."""
    opt = "sgd" if s.training.optimizer == "sgd" else "adam"
    # moments kept narrower than fp32 (training.optimizer_moments): each is read and written in that dtype
    narrower = 4 * (4 - MOMENT_BYTES[s.training.optimizer_moments]) if opt == "adam" else 0
    if opt == "adam" and framework is not None and framework.optimizer_step_bytes:
        return framework.optimizer_step_bytes - narrower
    return _OPTIMIZER_BYTES[(opt, s.training.precision != "fp32")] - narrower


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
    per_param = optimizer_step_bytes(s, w.framework if w is not None else None)
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


def overlaps_a2a(s: Scenario) -> bool:
    """Does the run use Megatron-Core's combined 1F1B (an MoE model with parallelism.moe.overlap_a2a)?"""
    return s.model.moe is not None and s.parallelism.moe.overlap_a2a


def microbatch_order(s: Scenario) -> list[tuple[str, int, int]]:
    """The order of a run without pipeline stages: ("F", mb, -1) and ("B", mb, -1) in turn, or with Megatron-Core's
    combined 1F1B (parallelism.moe.overlap_a2a; core_v0.14.0 combined_1f1b.py,
    ``combined_1f1b_schedule_for_no_pipelining``) the first forward alone, then each forward merged with the
    previous micro-batch's backward ("FB", mb, mb - 1), then the last backward alone."""
    gas = s.gradient_accumulation_steps
    if not overlaps_a2a(s):
        return [step for mb in range(gas) for step in (("F", mb, -1), ("B", mb, -1))]
    return [("F", 0, -1), *(("FB", mb, mb - 1) for mb in range(1, gas)), ("B", gas - 1, -1)]


def add_combined(
    p: Program, s: Scenario, us: list[Unit], mb_f: int, mb_b: int, first_ops: tuple[Op, ...]
) -> int:
    """One combined 1F1B step without pipelining (``microbatch_order``), unit by unit as Megatron-Core's
    ``combined_forward_backward_step`` runs it: the forward's embedding, the backward's output layer, each forward
    layer with the backward's layer in the same place from the end merged (strategy/pipeline/combined.py), the
    forward's output layer, the backward's embedding. ``first_ops``: the embedding's forward with the
    micro-batch's setup. Returns the last task."""
    from simulator.strategy.pipeline.combined import merge_layers

    layers = [u for u in us if u.is_layer]
    head, emb = us[-1], us[0]
    add_forward(p, emb, mb_f, ops=first_ops)
    add_backward(p, s, head, mb_b)
    for f, b in zip(layers, reversed(layers), strict=True):
        again = b.block.recompute_ops(b.recompute)
        ops = merge_layers(f.block.forward, (*again, *b.block.backward))
        p.add(
            0,
            COMPUTE,
            "backward",
            "backward",
            f"{f.name} F{mb_f} + {b.name} B{mb_b}",
            (),
            ops=ops,
            microbatch=mb_f,
        )
    add_forward(p, head, mb_f)
    return add_backward(p, s, emb, mb_b)
