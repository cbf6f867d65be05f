"""Activation recompute as the frameworks state it: which layers of a model chunk are recomputed and how, what the
recomputation re-runs, and what the chunk's layers keep for backward.

Policies of one layer:
  * ``none``: everything kept.
  * ``selective``: attention's core recomputed (Korthikanti et al. 2022 Sec. 5; with FlashAttention it keeps
    nothing of size s^2 anyway).
  * ``full``: only the layer input kept; the whole forward re-run before the backward. Megatron-LM
    (megatron/core/transformer/transformer_block.py ``_checkpointed_forward``, core_r0.9.0 to core_v0.13.0):
    ``--recompute-method uniform --recompute-num-layers N`` checkpoints the input of every group of N layers and
    re-runs the group at once (every layer recomputed; N layers' activations live at the backward's peak);
    ``block`` recomputes only the first N layers of each model chunk (pipeline stage, or virtual chunk) and keeps
    the others whole.
  * ``op``: torchtitan's per-op selective checkpointing (torchtitan/models/llama3/infra/parallelize.py
    ``_apply_ac_to_transformer_block``, v0.2.2): the outputs of the ops on its save list are kept (matmuls,
    scaled-dot-product attention, reduce-scatter), except every second matmul (``mm_count % 2 == 0``: recomputed),
    counted as torchtitan runs them (wq, wk, wv, wo, w1, w3, w2: wk, wo and w3 re-run); everything else (norms,
    activations, residual adds, all-gathers) is re-run.
torchtitan's ``selective_ac_option: N`` (here ``selective-layer`` with ``recompute.every: N``) recomputes every
N-th layer in full and keeps the others.
"""

from __future__ import annotations

from simulator.scenario.schema import Scenario
from simulator.workload.block import Part
from simulator.workload.memory import activation_bytes_per_layer
from simulator.workload.ops import Op, linear, recomputed


def selective_ops(
    s: Scenario,
    attn_core: tuple[Op, ...],
    moe_norm: Op | None,
    mlp: Part,
    moe: bool,
    projections: tuple[Op, ...] = (),
):
    """What Megatron-Core's selective recompute re-runs of a layer before its backward, module by module
    (--recompute-modules, core_v0.13.0 transformer_layer.py / experts.py): core_attn the unfused attention core
    (FlashAttention stores nothing it would re-run); layernorm the norms not fused into the next linear layer
    (with Transformer Engine the input norm and a dense layer's pre-MLP norm are fused, an MoE layer's pre-MLP
    norm, which the router reads, is not); moe_act the experts' activation; mlp a dense layer's whole MLP, moe an
    MoE layer's (router, dispatch, experts, combine: its all-to-alls again), shared_experts the shared expert
    (each checkpointed from its input, tensor_parallel.checkpoint); mla_up_proj multi-head latent attention's
    up-projections and rotary (``projections``: the layer's query / key / value projections), its queries, keys
    and values discarded after the attention (multi_latent_attention.py ``qkv_up_checkpoint``,
    CheckpointWithoutOutput, Megatron-LM d98e8a64)."""
    mods = set(s.training.recompute.modules)
    ops: list[Op] = []
    if "mla_up_proj" in mods and s.model.mla is not None:
        ops += [op for op in projections if "up-projection" in op.name or "rotary" in op.name]
    if "core_attn" in mods and s.model.attention == "standard":
        ops += attn_core
    if "layernorm" in mods and moe_norm is not None:
        ops.append(moe_norm)
    if moe and "moe" in mods:
        ops += mlp.forward
    else:
        if "moe_act" in mods:
            ops += mlp.activations
        if "shared_experts" in mods:
            ops += mlp.shared
    if not moe and "mlp" in mods:
        ops += mlp.forward
    return recomputed(tuple(ops))


def chunk_policies(s: Scenario, count: int) -> tuple[str, ...]:
    """The policy of each of a model chunk's ``count`` transformer layers, in order (Megatron counts
    ``recompute_num_layers`` per chunk; a run without pipeline parallelism is one chunk)."""
    tr = s.training
    mode, rc = tr.activation_recompute, tr.recompute
    if mode == "full" and rc.method == "block":
        return tuple("full" if i < rc.num_layers else "none" for i in range(count))
    if mode == "selective-layer":  # torchtitan: layers counted from 1, every N-th checkpointed
        return tuple("full" if (i + 1) % rc.every == 0 else "none" for i in range(count))
    if mode == "selective-op":
        return ("op",) * count
    return (mode,) * count


def group_size(s: Scenario) -> int:
    """Layers re-run together by one full recomputation (Megatron's uniform method: recompute_num_layers)."""
    rc = s.training.recompute
    return rc.num_layers if rc.method == "uniform" else 1


def op_policy_recompute(forward: tuple[Op, ...], heads: int, kv_heads: int, gated: bool) -> tuple[Op, ...]:
    """What torchtitan's per-op policy re-runs of a layer's forward: every op but the saved ones, i.e. all but
    FlashAttention, the reduce-scatters, the expert-parallel all-to-alls and every other matmul in the order
    torchtitan runs them (memory.torchtitan_matmuls): of a Llama block wk, wo and w3 are re-run, wq, wv, w1 and
    w2 kept (torchtitan v0.2.2 models/*/infra/parallelize.py ``_op_sac_save_list``, with
    distributed/activation_checkpoint.py's ``mm_count``). The layer's fused GEMMs stand for torchtitan's separate
    ones: the QKV projection for wq, wk, wv (``heads`` and ``kv_heads`` on this rank), a gated MLP's or shared
    expert's up projection for w1 and w3. An MoE router is re-run without counting (v0.2.2 forces it); the routed
    experts' GEMMs (``torch._grouped_mm``, not ``aten.mm`` and not on the save list) are re-run without counting
    too."""
    out = []
    matmuls = 0
    for op in forward:
        routed = op.name.startswith(("experts ", "expert "))
        if (
            op.kind == "gemm"
            and op.linear
            and op.direction == "forward"
            and op.kernel == "gemm"
            and not routed
        ):
            if "router" in op.name:
                out.append(op)
                continue
            for part in _torchtitan_parts(op, heads, kv_heads, gated):
                matmuls += 1
                if matmuls % 2 == 0:
                    out.append(part)
            continue
        if op.kind == "flash_attention" or (
            op.kind == "collective" and op.collective in ("reduce_scatter", "all_to_all")
        ):
            continue
        out.append(op)
    return recomputed(tuple(out))


def _torchtitan_parts(op: Op, heads: int, kv_heads: int, gated: bool) -> tuple[Op, ...]:
    """The separate matmuls torchtitan runs for one of the layer's fused GEMMs (op_policy_recompute)."""
    if op.name == "qkv projection":
        q = op.n * heads // (heads + 2 * kv_heads)
        kv = (op.n - q) // 2
        return tuple(
            linear(f"{name} projection", op.m, n, op.k) for name, n in (("wq", q), ("wk", kv), ("wv", kv))
        )
    if op.name in ("mlp up projection", "shared expert fc1") and gated:
        prefix = "shared expert " if op.name.startswith("shared") else ""
        return (
            linear(f"{prefix}w1 projection", op.m, op.n // 2, op.k),
            linear(f"{prefix}w3 projection", op.m, op.n // 2, op.k),
        )
    return (op,)


def early_stopped(forward: tuple[Op, ...]) -> tuple[Op, ...]:
    """What torch's non-reentrant checkpoint re-runs of a layer's forward with early stopping (torch
    torch/utils/checkpoint.py ``_recomputation_hook``: the pack hook raises ``_StopRecomputationError`` once the
    last tensor the backward needs is saved again; torch 2.1 to 2.13): autograd saves an op's inputs before the op
    runs, so recomputation stops at the layer's last linear layer (MLP-down), before its GEMM, and skips it with
    what follows (the output's all-reduce or reduce-scatter, the residual add), none of which saves a tensor."""
    last = max(
        (i for i, op in enumerate(forward) if op.kind == "gemm" and op.linear and op.direction == "forward"),
        default=None,
    )
    return forward if last is None else forward[:last]


def stops_early(s: Scenario, framework, moe: bool) -> bool:
    """Does a fully recomputed layer stop before its last linear layer (``early_stopped``)? Where the framework
    checkpoints with torch's non-reentrant checkpoint (``checkpoint_early_stop``) and that layer is a plain aten op:
    a custom autograd Function (FP8's Float8Linear or Transformer Engine, a torch.compile'd block) saves its tensors
    only after its forward has run, and an MoE layer saves after its last GEMM (the unpermute). Not for torchtitan's
    per-op policy either: the last matmul it re-runs (w3) comes before w2, which it keeps."""
    tr = s.training
    return framework.checkpoint_early_stop and not moe and tr.precision != "fp8" and not tr.compile


def chunk_activation_bytes(s: Scenario, layers: list[tuple[str, bool, str]]) -> tuple[float, float]:
    """(bytes a chunk's layers keep from forward to backward, bytes more at the backward's peak while a
    recomputation has its layers' activations live) for one micro-batch; ``layers``: (policy, is MoE, kind: a
    Block's) each."""
    kept = 0.0
    peak = 0.0
    group = group_size(s)
    # the layer being recomputed at the peak: an MoE one where there is one; of a hybrid stack the largest kind
    worst = (any(moe for _, moe, _ in layers), "layer")
    if any(kind != "layer" for _, _, kind in layers):
        worst = max(
            {(moe, kind) for _, moe, kind in layers},
            key=lambda x: activation_bytes_per_layer(s, recompute="none", moe=x[0], kind=x[1]),
        )
    for policy, moe, kind in layers:
        if policy == "full":
            kept += activation_bytes_per_layer(s, recompute="full", moe=moe, kind=kind) / group
            peak = max(
                peak, group * activation_bytes_per_layer(s, recompute="none", moe=worst[0], kind=worst[1])
            )
        else:
            own = activation_bytes_per_layer(s, recompute=policy, moe=moe, kind=kind)
            kept += own
            if policy == "op":
                peak = max(peak, activation_bytes_per_layer(s, recompute="none", moe=moe, kind=kind) - own)
    return kept, peak


def largest_layer_bytes(s: Scenario, layers: list[tuple[str, bool, str]]) -> float:
    """What the largest of a chunk's layers keeps for one micro-batch (``layers``: (policy, is MoE, kind) each)."""
    return max((chunk_activation_bytes(s, [x])[0] for x in set(layers)), default=0.0)
