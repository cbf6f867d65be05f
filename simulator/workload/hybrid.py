"""A hybrid stack's layers (``model.hybrid_pattern``, Megatron-LM's --hybrid-layer-pattern): each symbol is a layer
of its own, its norm, then a Mamba-2 mixer (workload/mamba.py), self-attention alone, the MLP alone or the MoE MLP
alone, then its residual add (Megatron-Core megatron/core/models/hybrid/hybrid_layer_specs.py, d98e8a64: MambaLayer,
and TransformerLayer with IdentityOp for the half it lacks)."""

from __future__ import annotations

from dataclasses import replace

from simulator.scenario.schema import Scenario
from simulator.workload import framework_kernels
from simulator.workload.block import Block, Part, present
from simulator.workload.graph_modules import tagged
from simulator.workload.ops import Op, recomputed
from simulator.workload.recompute import early_stopped, op_policy_recompute, selective_ops, stops_early
from simulator.workload.shape import LayerShape, norm, norm_backward, residual, residual_backward


def parameter_tensors(s: Scenario, kind: str) -> int:
    """Parameter tensors of the layer's middle (for the per-tensor kernels of gradient accumulation): a mixer's
    in_proj, conv weight and bias, dt_bias, A_log, D, gated norm and out_proj; attention's QKV and projection; an
    MLP's two linear layers; and their biases with add_bias_linear."""
    bias = s.model.add_bias_linear
    return {"mamba": 8, "attention": 2, "mlp": 2, "moe": 2}[kind] * (2 if bias and kind != "mamba" else 1)


def hybrid_layer(
    s: Scenario,
    sh: LayerShape,
    fw,
    kind: str,
    middle: Part,
    attn_core: tuple[Op, ...],
    projections: tuple[Op, ...],
) -> Block:
    """A hybrid layer of ``kind`` ("mamba", "attention", "mlp", "moe") around its ``middle``; ``attn_core`` and
    ``projections``: an attention layer's core and QKV ops, which selective recompute may re-run."""
    m, tr = s.model, s.training
    # each kernel's module as Megatron-Core's CUDA graph scopes name them (an MoE layer's are its part's own)
    module = {"attention": "attn", "moe": "moe"}.get(kind, kind)
    first = replace(norm(sh, f"{kind} layer norm"), module="moe_router" if kind == "moe" else module)
    params = middle.params + sh.norm_params
    middle = replace(middle, forward=tagged(middle.forward, module), backward=tagged(middle.backward, module))
    forward = present(first, *middle.forward, residual(sh, f"{kind} layer residual add"))
    tensors = parameter_tensors(s, kind) + sh.norm_params // sh.h
    backward = present(
        residual_backward(sh, f"{kind} layer residual add backward"),
        *middle.backward,
        norm_backward(sh, f"{kind} layer norm backward"),
        framework_kernels.grad_accumulation(
            fw, tr.precision, "layer", params + middle.expert_params, tensors
        ),
    )
    forward, backward = tagged(forward, module), tagged(backward, module)
    moe = kind == "moe"
    if kind == "attention":
        selective = selective_ops(s, attn_core, None, Part((), ()), False, projections)
    elif kind == "mamba":  # Megatron's --recompute-modules name no part of a mixer
        selective = ()
    else:
        selective = selective_ops(s, (), first if moe else None, middle, moe)
    return Block(
        f"{kind} layer",
        forward,
        backward,
        selective,
        params,
        recomputed(early_stopped(forward) if stops_early(s, fw, moe) else forward),
        middle.expert_params,
        moe,
        op_policy_recompute(forward, sh.heads, sh.kv_heads, m.gated)
        if tr.activation_recompute == "selective-op"
        else (),
        kind=kind,
    )
