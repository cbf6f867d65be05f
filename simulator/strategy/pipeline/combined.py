"""One combined 1F1B step: a forward and a backward of two micro-batches, layer beside layer, each one's
expert-parallel all-to-alls behind the other's compute (Megatron-Core ``--overlap-moe-expert-parallel-comm``).

Megatron-Core pairs forward layer i with the backward's i-th layer and runs (core_v0.14.0,
megatron/core/models/common/model_chunk_schedule_plan.py, ``TransformerLayerSchedulePlan.run``)::

    comm stream:  combine_bwd | dispatch_fwd -> dispatch_bwd   | combine_fwd
    comp stream:  attn_fwd    | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | attn_bwd

so each layer pair is three windows, each as long as the longer of its compute and its communication. A layer's
ops split at its expert-parallel collectives (the dispatcher's, group ep / etp): forward into attention (up to
the dispatch), dispatch, experts (with the shared expert), combine and what follows; backward likewise in
reverse. The merged task holds the pieces in that order, the all-to-alls marked ``behind``: each hides behind the
compute after it up to the window's end (``costs/dispatch.py``); other collectives (tensor parallelism's) block
as they do in any step. Layers without a partner (a chunk's embedding, output layer, unequal chunks) run after.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.strategy.pipeline.chunk_ops import Piece
from simulator.workload.ops import Op

WINDOW = Op("(combined 1F1B window)", "memory", overlaps="boundary", launches=0)


def is_expert_comm(op: Op) -> bool:
    """A collective of the MoE token dispatcher (its all-to-alls, count and ETP gathers)."""
    return op.kind == "collective" and op.group.startswith(("ep", "etp"))


def is_expert_compute(op: Op) -> bool:
    """A routed or shared expert's kernel (what runs between dispatch and combine); not a recomputation re-run
    ahead of the backward (selective recompute's moe_act)."""
    return op.kind != "collective" and not op.recompute and op.name.startswith(("expert", "shared expert"))


def split_layer(ops: tuple[Op, ...]) -> tuple[tuple[Op, ...], ...] | None:
    """(before the first dispatcher collective, the first cluster of them, the experts, the second cluster, the
    rest) of one layer's forward (or backward: combine's gradients first); None for a dense layer."""
    comm = [i for i, op in enumerate(ops) if is_expert_comm(op)]
    experts = [i for i, op in enumerate(ops) if is_expert_compute(op)]
    if not comm or not experts:
        return None
    a, x0, x1 = comm[0], experts[0], experts[-1]
    before = [i for i in comm if i < x0]
    after = [i for i in comm if i > x1]
    if not before or not after:
        return None
    b = after[-1] + 1
    return ops[:a], ops[a:x0], ops[x0 : after[0]], ops[after[0] : b], ops[b:]


def behind(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """The dispatcher's collectives of ``ops`` on the communication stream; DeepEP's NVLink forward stays beside
    its RDMA transfer."""
    return tuple(
        replace(op, overlaps="behind") if is_expert_comm(op) and op.overlaps != "alongside" else op
        for op in ops
    )


def merge_layers(fwd: tuple[Op, ...], bwd: tuple[Op, ...]) -> tuple[Op, ...]:
    """One forward layer and one backward layer in Megatron-Core's three windows (module docstring)."""
    f, b = split_layer(fwd), split_layer(bwd)
    if f is None or b is None:
        return (*fwd, *bwd)
    attn_f, dispatch_f, mlp_f, combine_f, post_f = f
    pre_b, combine_b, mlp_b, dispatch_b, attn_b = b
    return (
        *pre_b,
        *behind(combine_b),
        *attn_f,
        WINDOW,
        *behind(dispatch_f),
        *mlp_b,
        *behind(dispatch_b),
        *mlp_f,
        WINDOW,
        *behind(combine_f),
        *post_f,
        *attn_b,
        WINDOW,
    )


def combined_ops(fwd: list[Piece], bwd: list[Piece]) -> tuple[Op, ...]:
    """A forward and a backward step (each as ``chunk_pieces`` gives it) as one task: the forward's pieces before
    its first layer and the backward's before its first layer, then the layers pairwise, then the rest of each."""
    f_layers = [ops for is_layer, ops in fwd if is_layer]
    b_layers = [ops for is_layer, ops in bwd if is_layer]
    first_f = next((i for i, (is_layer, _) in enumerate(fwd) if is_layer), len(fwd))
    first_b = next((i for i, (is_layer, _) in enumerate(bwd) if is_layer), len(bwd))
    out: list[Op] = [op for _, ops in fwd[:first_f] for op in ops]
    out += [op for _, ops in bwd[:first_b] for op in ops]
    pairs = min(len(f_layers), len(b_layers))
    for i in range(pairs):
        out += merge_layers(f_layers[i], b_layers[i])
    out += [op for ops in f_layers[pairs:] for op in ops]
    out += [op for is_layer, ops in fwd[first_f:] if not is_layer for op in ops]
    out += [op for ops in b_layers[pairs:] for op in ops]
    out += [op for is_layer, ops in bwd[first_b:] if not is_layer for op in ops]
    return tuple(out)
