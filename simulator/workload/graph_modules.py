"""Which layer module each kernel belongs to, in the names of Megatron-Core's per-layer CUDA graph scopes
(``CudaGraphModule``, megatron/core/transformer/enums.py, Megatron-LM d98e8a64: attn, mlp, moe, moe_router,
moe_preprocess, mamba; ``--cuda-graph-modules``, formerly ``--cuda-graph-scope``), so that a scoped capture
(``training.cuda_graph_modules``) issues only those kernels from a graph (costs/dispatch.py).

- ``attn``: the input norm, the attention and its residual add (TransformerLayer's self-attention half);
- ``mlp``: the pre-MLP norm, a dense MLP and its residual add;
- ``moe_router``: an MoE layer's pre-MLP norm and router (scores, top-k, aux loss);
- ``moe_preprocess``: the dispatcher's work before the host waits for the token counts, other than moving the
  tokens (the counts' all-gather, the local permutation);
- ``moe``: the rest of the MoE layer (dispatch, experts, combine, shared expert); the host's wait for the token
  counts is kept in ``moe``: only a drop-and-pad layer, which has none, can be captured whole (Megatron's
  ``moe`` scope: "drop-and-pad MoE layers only");
- ``mamba``: a hybrid's Mamba-2 layer, norm to residual.
"""

from __future__ import annotations

from simulator.workload.ops import Op

MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")


def tagged(ops: tuple[Op, ...], module: str) -> tuple[Op, ...]:
    """``ops`` with ``module`` where they have none yet."""
    return tuple(op if op.module else op.with_module(module) for op in ops)


def dispatch_modules(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """A dispatcher's forward ops: what it does before the host waits for the token counts, other than moving the
    tokens (the counts' all-gather, the routing map's, the local permutation: MoELayer.preprocess and the
    dispatcher's dispatch_preprocess), is ``moe_preprocess``; the wait, the token collectives and what follows
    ``moe``."""
    out = []
    before = True
    for op in ops:
        before = before and op.kind != "sync"
        moves = op.kind == "collective" and ("tokens" in op.name or "dispatch" in op.name)
        out.append(op.with_module("moe_preprocess" if before and not moves else "moe"))
    return tuple(out)
