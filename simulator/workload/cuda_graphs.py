"""GPU memory that Megatron-Core's per-layer CUDA graphs hold beyond eager execution: their static inputs.

Read in Megatron-LM d98e8a64 (megatron/core/transformer/cuda_graphs.py ``TECudaGraphHelper``, the
``--cuda-graph-impl transformer_engine`` path that NVIDIA's 2025-26 recipes take with ``--cuda-graph-modules``) and
Transformer Engine 2.20 (transformer_engine/pytorch/graph.py ``make_graphed_callables``):

- A layer is graphed where one of ``--cuda-graph-modules`` is in it (cuda_graphs.py l.2136-2173 ``_layer_is_graphable``):
  ``attn`` a layer with self-attention, ``moe`` / ``moe_router`` / ``moe_preprocess`` an MoE layer, ``mlp`` a dense
  MLP layer, ``mamba`` a Mamba layer. Each graphed layer is one callable, captured once per micro-batch (all M with
  pipeline parallelism, one without: l.2597-2603).
- Each capture's sample arguments are the layer's static inputs (l.2387-2440; module.py l.246-271): the hidden
  states, ``(s / cp / tp-if-sequence-parallel) x b x h`` in bf16, and, where the layer's self-attention is graphed,
  the attention mask, a bool ``b x (s / cp) x s`` tensor (transformer_layer.py l.1212-1234). They are allocated
  outside the graphs' memory pool and live as long as the graphs; on replay the layer's input is copied into them
  (graph.py l.1050), so they sit beside the eager copy of the same hidden states.
- With ``_reuse_graph_input_output_buffers`` (TE 2.7 and later, cuda_graphs.py l.2658-2686) a set is reused once
  its micro-batch's backward has run (l.2450-2565): there are as many sets as graphed (layer, micro-batch)
  forwards in flight at once, which the strategies count as they count activations (pipeline/memory.py).

Left out: the graphs' private pool holds the captured layers' activations and temporaries, which eager execution
allocates too (a permanent reservation rather than an addition, not modelled), and the graphs themselves. Without
``cuda_graph_modules`` (``training.cuda_graphs`` alone: Megatron's ``local`` whole-layer graphs, whose outputs are
the next graph's inputs with no copy, cuda_graphs.py l.1250-1296, or ``full_iteration``, one graph over the step)
no static inputs are counted."""

from __future__ import annotations

from simulator.scenario.schema import Scenario

MOE_MODULES = frozenset({"moe", "moe_router", "moe_preprocess"})


def graphed(modules: frozenset[str], kind: str, moe: bool) -> tuple[bool, bool]:
    """(the layer is captured, its self-attention is) for a Block of ``kind`` (workload/block.py) under
    ``--cuda-graph-modules`` ``modules``."""
    attention = kind in ("layer", "attention") and "attn" in modules
    if kind == "mamba":
        return "mamba" in modules, False
    ffn = (moe and bool(modules & MOE_MODULES)) or (not moe and kind in ("layer", "mlp") and "mlp" in modules)
    return attention or (kind != "attention" and ffn), attention


def static_input_bytes(s: Scenario, kind: str, moe: bool) -> float:
    """Bytes of one graphed layer's static inputs for one micro-batch (0 for a layer not captured)."""
    modules = s.training.graph_capture  # a set of modules only for per-module graphs
    if not isinstance(modules, frozenset):
        return 0.0
    captured, attention = graphed(modules, kind, moe)
    if not captured:
        return 0.0
    m, p, b = s.model, s.parallelism, s.training.micro_batch_size
    local = m.seq_length // p.context_parallel  # the sequence on this rank
    rows = local // (p.tensor_parallel if p.sequence_parallel else 1)  # and its tensor-parallel share
    hidden = 2.0 * rows * b * m.hidden_size
    return hidden + (float(b * local * m.seq_length) if attention else 0.0)


def mean_static_input_bytes(s: Scenario) -> float:
    """static_input_bytes averaged over the model's layers (the planner's screen, study/screen.py)."""
    m = s.model
    if not isinstance(s.training.graph_capture, frozenset):
        return 0.0
    if m.hybrid_pattern:
        kinds = [m.layer_kind(i) for i in range(m.num_layers)]
        total = sum(static_input_bytes(s, k, k == "moe") for k in kinds)
    else:
        moe = m.moe_layers if m.moe is not None else 0
        total = moe * static_input_bytes(s, "layer", True)
        total += (m.num_layers - moe) * static_input_bytes(s, "layer", False)
    return total / m.num_layers
