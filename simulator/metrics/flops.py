"""FLOP conventions of published runs, each a closed form of the scenario, so a measured TFLOP/s can be compared
in the publisher's own terms (the simulator's own MFU sums each kernel's FLOPs: metrics.py)."""

from __future__ import annotations

from simulator.scenario.schema import Scenario


def megatron_flops(s: Scenario) -> float:
    """FLOPs per iteration as Megatron-LM reports them since 2025-03 (megatron/training/training.py,
    ``num_floating_point_operations``, core_v0.13.0; Megatron-Bridge's ``flop_utils.py`` the same): causal
    attention (half the score matrix), the MLP of each dense layer, ``top_k`` routed experts and the shared
    experts of each MoE layer (gated MLPs x 3/2), multi-head latent attention's projections, multi-token
    prediction, and the logits; the router, the permutation and any padding are not counted. 3x forward."""
    m = s.model
    B, seq, h, V = s.training.global_batch_size, m.seq_length, m.hidden_size, m.vocab_size
    if m.hybrid_pattern:
        return hybrid_flops(s)
    mtp = m.mtp_layers
    L = m.num_layers + mtp
    moe_layers = m.moe_layers + (mtp if m.moe is not None and m.is_moe_layer(m.num_layers - 1) else 0)
    dense_layers = L - moe_layers
    g = 1.5 if m.gated else 1.0
    mlp = m.ffn_size * g * dense_layers
    if m.moe is not None:
        mlp += (m.expert_ffn_size * m.moe.top_k + m.moe.shared_expert_ffn_hidden_size) * g * moe_layers
    n = m.num_attention_heads
    if m.mla is not None:
        c = m.mla
        q = (
            c.q_lora_rank * (h + n * (c.qk_nope_head_dim + c.qk_rope_head_dim) + 1)
            if c.q_lora_rank
            else (h * n * (c.qk_nope_head_dim + c.qk_rope_head_dim))
        )
        attention = (
            6
            * L
            * (
                q
                + c.kv_lora_rank * (h + n * (c.qk_nope_head_dim + c.v_head_dim) + 1)
                + h * c.qk_rope_head_dim
                + n * c.v_head_dim * h
                + seq * n * (c.qk_nope_head_dim + c.qk_rope_head_dim) / 2
                + seq * n * c.v_head_dim / 2
            )
        )
    else:
        kv = m.query_groups / n
        attention = 12 * L * h * h * ((1 + kv + seq / (2 * h)) * (m.head_dim * n / h))
    per_token = 12 * L * h * mlp / L + attention + 6 * mtp * (3 * h + 2 * h * h) + 6 * h * V * (mtp + 1)
    return B * seq * per_token


def hybrid_flops(s: Scenario) -> float:
    """A hybrid stack's FLOPs per iteration as Megatron-LM counts them (training.py ``hybrid_flops``, d98e8a64):
    attention layers' projections and causal core, MLP and MoE layers, Mamba layers (in_proj, the scan as
    7 d_inner N a token with d_inner = 2 h, out_proj), the logits; 3x forward."""
    m = s.model
    B, seq, h, V = s.training.global_batch_size, m.seq_length, m.hidden_size, m.vocab_size
    tokens = B * seq
    g = 1.5 if m.gated else 1.0
    c = m.mamba_config
    d_in = 2 * h  # Megatron's formula fixes it (its heads are mamba_num_heads)
    mamba = 2 * tokens * h * (2 * d_in + 2 * c.num_groups * c.state_dim + m.mamba_heads)
    mamba += 7 * tokens * d_in * c.state_dim + 2 * tokens * d_in * h
    p = m.head_dim * m.num_attention_heads / h
    attention = (
        4 * tokens * h * p * (h + h * m.query_groups / m.num_attention_heads) + 2 * B * seq * seq * h * p
    )
    mlp = 4 * m.ffn_size * g * tokens * h
    moe = 0.0
    if m.moe is not None:
        moe = 4 * tokens * h * (m.expert_ffn_size * m.moe.top_k + m.moe.shared_expert_ffn_hidden_size) * g
    fwd = (
        m.layers_of("attention") * attention
        + m.layers_of("mlp") * mlp
        + m.layers_of("mamba") * mamba
        + m.layers_of("moe") * moe
        + 2 * tokens * h * V
    )
    return 3 * fwd


def narayanan_eq3_flops(s: Scenario) -> float:
    """Narayanan et al. SC21 Eq. 3: FLOPs per iteration with full recompute, 96 B s l h^2 (1 + s/6h + V/16lh)."""
    m = s.model
    if (
        m.hybrid_pattern
    ):  # the convention counts a GPT's 72 B s l h^2 (...) and its recomputed forward: 4/3 of it
        return 4 / 3 * hybrid_flops(s)
    B, sq, L, h, V = s.training.global_batch_size, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    return 96 * B * sq * L * h * h * (1 + sq / (6 * h) + V / (16 * L * h))
