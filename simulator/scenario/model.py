"""``model:``: the decoder-only transformer, in Megatron-LM's argument names (a preset or a Hugging Face config
expands into these fields)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, ValidationInfo, model_validator

from simulator.scenario.presets import expand_model_section
from simulator.scenario.section import Section


class ModelConfig(Section):
    """A decoder-only transformer, in Megatron-LM's argument names."""

    name: str = Field("custom", description="Preset name or a label for reports.")
    num_layers: PositiveInt = Field(le=4096)
    hidden_size: PositiveInt = Field(le=2**18)
    num_attention_heads: PositiveInt = Field(le=2**12)
    num_query_groups: PositiveInt | None = Field(
        None, description="Key/value heads (grouped-query attention). Default: num_attention_heads."
    )
    ffn_hidden_size: PositiveInt | None = Field(
        None,
        le=2**20,
        description="MLP width. Default: 4 x hidden_size (gelu), 8/3 x hidden_size rounded up to 64 (swiglu).",
    )
    activation: Literal["gelu", "swiglu", "relu", "squared-relu"] = "gelu"
    seq_length: PositiveInt = Field(le=2**24)
    vocab_size: PositiveInt = Field(le=2**22)
    tied_embeddings: bool = Field(
        True, description="Share input embedding and output layer (Megatron default)."
    )
    attention: Literal["auto", "standard", "flash"] = Field(
        "auto",
        description="standard = unfused QK^T, softmax, dropout, context; flash = one fused kernel; auto = what the "
        "framework profile runs by default (FlashAttention in PyTorch SDPA, llm-foundry and Megatron-Core; the "
        "unfused layer in Megatron-LM before 2023); standard on GPUs without FlashAttention (V100).",
    )
    position_embedding: Literal["learned", "rope", "alibi"] = "learned"
    normalization: Literal["layernorm", "rmsnorm"] = "layernorm"
    add_bias_linear: bool = True

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data, info: ValidationInfo):
        return expand_model_section(data, (info.context or {}).get("base_dir"))

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        a, g = self.num_attention_heads, self.query_groups
        if self.hidden_size % a:
            raise ValueError(
                f"model.hidden_size ({self.hidden_size}) is not divisible by num_attention_heads ({a})"
            )
        if a % g:
            raise ValueError(f"model.num_attention_heads ({a}) is not divisible by num_query_groups ({g})")
        return self

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        if self.ffn_hidden_size:
            return self.ffn_hidden_size
        if self.activation == "swiglu":  # Llama convention: 2/3 of 4h, rounded up to a multiple of 64
            return -(-int(8 * self.hidden_size / 3) // 64) * 64
        return 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads
