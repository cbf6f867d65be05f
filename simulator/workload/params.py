"""Parameter counts of the whole model (all tensor-, expert- and pipeline-parallel shards together): total, and
active per token for mixture-of-experts models.

The formulas are the modules' weight shapes (Megatron-LM's GPT layer; Hugging Face's Mixtral, Qwen2-MoE,
Qwen3-MoE, OLMoE and DeepSeek-V2 / V3 modelling code): attention's projections (or multi-head latent attention's
low-rank ones), the MLP (gated: up and gate fused, then down), two norms per layer, the router and the routed
and shared experts of MoE layers, the embedding, the untied output layer and the final norm.
tests/test_moe_models.py checks them against the published totals of eight MoE models.
"""

from __future__ import annotations

from simulator.scenario.model import ModelConfig
from simulator.scenario.schema import Scenario


def norm_params(m: ModelConfig, width: int | None = None) -> int:
    """One LayerNorm (weight and bias) or RMSNorm (weight) over ``width`` (default: hidden_size)."""
    n = m.hidden_size if width is None else width
    return 2 * n if m.normalization == "layernorm" else n


def attention_params(m: ModelConfig) -> int:
    """One layer's attention projections (whole layer, every head)."""
    h, a = m.hidden_size, m.num_attention_heads
    out_bias = h if m.add_bias_linear else 0
    # learnable softmax offsets, one per head (Megatron-Core dot_product_attention.py softmax_offset, d98e8a64)
    out_bias += a if m.attention_sinks else 0
    if m.mla is not None:
        c = m.mla
        qk = c.qk_nope_head_dim + c.qk_rope_head_dim
        if c.q_lora_rank is None:  # one query projection
            q = h * a * qk
        else:  # down-projection, its norm, up-projection (DeepSeek q_a_proj, q_a_layernorm, q_b_proj)
            q = h * c.q_lora_rank + norm_params(m, c.q_lora_rank) + c.q_lora_rank * a * qk
        # kv_a_proj_with_mqa (latent + the shared rotary key), kv_a_layernorm, kv_b_proj (keys and values)
        kv = (
            h * (c.kv_lora_rank + c.qk_rope_head_dim)
            + norm_params(m, c.kv_lora_rank)
            + c.kv_lora_rank * a * (c.qk_nope_head_dim + c.v_head_dim)
        )
        return q + kv + a * c.v_head_dim * h + out_bias
    d, g = m.head_dim, m.query_groups
    qkv_out = a * d + 2 * g * d
    qkv_bias = qkv_out if m.has_qkv_bias else 0
    qk_norm = 2 * norm_params(m, d) if m.qk_layernorm else 0  # one norm over a head's width, for Q and for K
    return h * qkv_out + qkv_bias + a * d * h + out_bias + qk_norm


def mlp_params(m: ModelConfig, ffn: int) -> int:
    """One MLP of width ``ffn``: the up projection (with the gate for SwiGLU) and the down projection."""
    h = m.hidden_size
    f_up = 2 * ffn if m.gated else ffn
    bias = (f_up + h) if m.add_bias_linear else 0
    return h * f_up + ffn * h + bias


def router_params(m: ModelConfig) -> int:
    """The router's weight (and DeepSeek-V3's per-expert score bias, a parameter in DeepSeek's code)."""
    e = m.moe.num_experts
    return e * m.hidden_size + (e if m.moe.expert_bias else 0)


def shared_expert_params(m: ModelConfig) -> int:
    moe = m.moe
    if not moe.shared_expert_ffn_hidden_size:
        return 0
    gate = m.hidden_size if moe.shared_expert_gate else 0
    return mlp_params(m, moe.shared_expert_ffn_hidden_size) + gate


def layer_params(m: ModelConfig, i: int, active: bool = False) -> int:
    """Layer ``i``: attention, two norms, and its MLP; for an MoE layer the router, the routed experts (``top_k``
    of them when ``active``) and the shared experts."""
    kind = m.layer_kind(i)
    if kind == "mamba":  # a hybrid stack's layers of their own (model.hybrid_pattern): one norm each
        return norm_params(m) + mamba_mixer_params(m)
    if kind == "attention":
        return norm_params(m) + attention_params(m)
    if kind == "mlp":
        return norm_params(m) + mlp_params(m, m.ffn_size)
    base = attention_params(m) + 2 * norm_params(m) if kind == "layer" else norm_params(m)
    if not m.is_moe_layer(i):
        return base + mlp_params(m, m.ffn_size)
    moe = m.moe
    experts = moe.top_k if active else moe.num_experts
    return base + router_params(m) + experts * mlp_params(m, m.expert_ffn_size) + shared_expert_params(m)


def mamba_widths(m: ModelConfig) -> tuple[int, int, int, int]:
    """(d_inner, heads, groups x state, in_proj outputs 2 d_inner + 2 G N + H) of one whole Mamba-2 mixer."""
    c = m.mamba_config
    d_in, heads, gn = m.mamba_inner, m.mamba_heads, c.num_groups * c.state_dim
    return d_in, heads, gn, 2 * d_in + 2 * gn + heads


def mamba_mixer_params(m: ModelConfig, t: int = 1) -> int:
    """One Mamba-2 mixer on one of ``t`` tensor-parallel ranks (Megatron-Core MambaMixer.__init__, Megatron-LM
    d98e8a64; heads and groups split over the ranks): in_proj to z, x, B, C and dt (2 d_inner + 2 G N + H), the
    depthwise convolution's weight and bias over x, B and C, dt_bias, A_log and D per head, the gated norm over
    d_inner, out_proj; the linear layers' biases with add_bias_linear (out_proj's whole on every rank)."""
    c, h = m.mamba_config, m.hidden_size
    d_in, heads, gn, proj = mamba_widths(m)
    bias = (proj // t + h) if m.add_bias_linear else 0
    split = h * proj + (d_in + 2 * gn) * (c.conv_kernel + 1) + 3 * heads + d_in + d_in * h
    return split // t + bias


def embedding_params(m: ModelConfig) -> int:
    return m.vocab_size * m.hidden_size + (
        m.seq_length * m.hidden_size if m.position_embedding == "learned" else 0
    )


def parameter_count(s: Scenario) -> int:
    """Exact parameter count of the model described by the scenario (whole model)."""
    m = s.model
    head = 0 if m.tied_embeddings else m.vocab_size * m.hidden_size
    layers = sum(layer_params(m, i) for i in range(m.num_layers))
    return layers + embedding_params(m) + head + norm_params(m)


def active_parameter_count(s: Scenario, embedding: bool = True) -> int:
    """Parameters one token uses: every dense parameter and ``top_k`` routed experts per MoE layer (equal to the
    total for a dense model). ``embedding=False`` leaves out the input embedding, which is looked up, not
    multiplied (DeepSeek's convention for its "activated" counts; Mistral, Qwen and AI2 count it)."""
    m = s.model
    head = 0 if m.tied_embeddings else m.vocab_size * m.hidden_size
    layers = sum(layer_params(m, i, active=True) for i in range(m.num_layers))
    return layers + (embedding_params(m) if embedding else 0) + head + norm_params(m)


def tensors_per_layer(m) -> int:
    """Parameter tensors of one layer: QKV, projection, MLP in and out weights (and their biases), two norms
    (weight, and bias for LayerNorm). Megatron fuses Q, K, V and the SwiGLU gate and up projections."""
    norm_tensors = 2 if m.normalization == "layernorm" else 1
    return 4 + (4 if m.add_bias_linear else 0) + 2 * norm_tensors
