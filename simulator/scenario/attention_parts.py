"""The sub-sections of ``model:`` that replace a layer's attention with another mixer or shape: multi-head latent
attention (``model.mla``) and the Mamba-2 mixers of a hybrid stack (``model.mamba``)."""

from __future__ import annotations

from pydantic import Field, PositiveInt

from simulator.scenario.section import Section


class MlaConfig(Section):
    """Multi-head latent attention (DeepSeek-V2 / V3; Megatron-Core ``MLATransformerConfig``): queries and keys /
    values pass through low-rank projections, and keys carry a rotary part shared by every head."""

    q_lora_rank: PositiveInt | None = Field(
        None,
        le=2**16,
        description="Query down-projection rank; none = one query projection (DeepSeek-V2-Lite).",
    )
    kv_lora_rank: PositiveInt = Field(512, le=2**16, description="Key / value latent width.")
    qk_nope_head_dim: PositiveInt = Field(
        128, le=4096, description="Per-head query / key width without rotary."
    )
    qk_rope_head_dim: PositiveInt = Field(
        64, le=4096, description="Rotary query / key width (the key's is shared)."
    )
    v_head_dim: PositiveInt = Field(128, le=4096, description="Per-head value width.")


class MambaConfig(Section):
    """The Mamba-2 mixers of a hybrid model (``model.hybrid_pattern``), in Megatron-Core's names
    (megatron/core/transformer/transformer_config.py mamba_*, megatron/core/ssm/mamba_mixer.py, Megatron-LM d98e8a64;
    Hugging Face's Nemotron-H config: ssm_state_size, mamba_head_dim, n_groups, mamba_num_heads, expand,
    conv_kernel, chunk_size). Defaults are Megatron-Core's."""

    state_dim: PositiveInt = Field(128, le=4096, description="SSM state size N (--mamba-state-dim).")
    head_dim: PositiveInt = Field(64, le=4096, description="Per-head width P (--mamba-head-dim).")
    num_groups: PositiveInt = Field(8, le=1024, description="B / C groups G (--mamba-num-groups).")
    num_heads: PositiveInt | None = Field(
        None, le=2**14, description="SSM heads (--mamba-num-heads). Default: expand x hidden_size / head_dim."
    )
    expand: PositiveInt = Field(2, le=16, description="Inner width over hidden_size (Megatron fixes 2).")
    conv_kernel: PositiveInt = Field(4, le=64, description="Causal depthwise convolution width (d_conv).")
    chunk_size: PositiveInt = Field(128, le=4096, description="The SSD kernel's chunk length (chunk_size).")
