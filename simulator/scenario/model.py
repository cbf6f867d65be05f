"""``model:``: the decoder-only transformer, in Megatron-LM's argument names (a preset or a Hugging Face config
expands into these fields)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, ValidationInfo, model_validator

from simulator.scenario.attention_parts import MambaConfig, MlaConfig
from simulator.scenario.moe_config import MoeConfig
from simulator.scenario.presets import expand_model_section
from simulator.scenario.section import Section

HYBRID_SYMBOLS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def windowed_keys(seq: int, window: int) -> float:
    """Keys a causal sliding window of ``window`` (at most ``seq``) attends to over ``seq`` queries, all together:
    query i sees min(i + 1, w) of them, w (w + 1) / 2 + (s - w) w."""
    return window * (window + 1) / 2 + (seq - window) * window


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
        description="MLP width. Default: 4 x hidden_size (gelu), 8/3 x hidden_size rounded up to 64 (swiglu, geglu).",
    )
    activation: Literal["gelu", "swiglu", "geglu", "quick-geglu", "relu", "squared-relu"] = Field(
        "gelu",
        description="The MLP's activation; swiglu, geglu and quick-geglu are gated (a gate and an up projection, "
        "SiLU or GELU of the gate times the up: Llama's and Gemma's MLPs, Megatron-Core gated_linear_unit with silu "
        "/ gelu; quick-geglu: x sigmoid(1.702 x) of the gate times (up + 1), GPT-OSS, Megatron-LM --quick-geglu).",
    )
    activation_clamp: float | None = Field(
        None,
        gt=0,
        le=1e4,
        description="Clamp of a gated activation's inputs: the gate at most this, the up half within +-this "
        "(GPT-OSS 7; Hugging Face swiglu_limit, Megatron-Core activation_func_clamp_value): Megatron-Core's MoE "
        "experts clamp eagerly before the fused activation (workload/elementwise.py). None: no clamp.",
    )
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
    sliding_window: PositiveInt | None = Field(
        None,
        le=2**24,
        description="Attention window in tokens of the layers that use one (Mistral 7B v0.1, Gemma 2 / 3, GPT-OSS; "
        "Hugging Face sliding_window): each query attends to the last sliding_window tokens. None: every layer "
        "attends to all earlier tokens.",
    )
    attention_chunk_size: PositiveInt | None = Field(
        None,
        le=2**24,
        description="Chunked local attention (Llama 4; Hugging Face attention_chunk_size): the sequence is cut into "
        "chunks of this many tokens and each query attends to the earlier tokens of its own chunk. None: no chunks.",
    )
    full_attention_every: PositiveInt | None = Field(
        None,
        le=2**10,
        description="With sliding_window or attention_chunk_size: every n-th layer attends to the whole context "
        "(Gemma 2 and GPT-OSS: 2, Gemma 3: 6, Llama 4's NoPE layers: 4; Hugging Face layer_types, "
        "sliding_window_pattern, no_rope_layers). None: every layer windowed or chunked.",
    )
    attention_sinks: bool = Field(
        False,
        description="A learnable logit per attention head in each softmax's denominator (GPT-OSS's sinks; "
        "Megatron-Core softmax_type learnable, a parameter per head): Transformer Engine runs them in cuDNN's fused "
        "attention at its rate; FlashAttention-2 has none, so where the stack's kernel is FlashAttention-2 or "
        "MPT's Triton kernel, attention auto is the unfused layer (as Hugging Face runs GPT-OSS eagerly).",
    )
    position_embedding: Literal["learned", "rope", "alibi"] = "learned"
    rope_mscale: float = Field(
        1.0,
        gt=0,
        le=100,
        description="YaRN's attention factor on RoPE's cos and sin (Megatron-Core _yarn_get_concentration_factor: "
        "0.1 ln(factor) + 1 where the config names no mscale, GPT-OSS 1.347 at factor 32; mscale / mscale_all_dim "
        "otherwise, DeepSeek-V3 1.0). Other than 1, Megatron-Core applies RoPE unfused.",
    )
    normalization: Literal["layernorm", "rmsnorm"] = "layernorm"
    add_bias_linear: bool = True
    kv_channels: PositiveInt | None = Field(
        None,
        le=2**14,
        description="Per-head width (Megatron --kv-channels, HF head_dim). Default: hidden_size / heads.",
    )
    qkv_bias: bool | None = Field(None, description="Biases on Q, K and V (Qwen2). Default: add_bias_linear.")
    qk_layernorm: bool = Field(False, description="RMSNorm on each head's queries and keys (Qwen3, OLMoE).")
    mla: MlaConfig | None = Field(
        None, description="Multi-head latent attention instead of Q, K, V projections."
    )
    moe: MoeConfig | None = Field(None, description="Mixture-of-experts MLPs.")
    hybrid_pattern: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="A hybrid stack, one symbol per layer (Megatron-LM --hybrid-layer-pattern, formerly "
        "--hybrid-override-pattern; Hugging Face hybrid_override_pattern): M a Mamba-2 mixer, * self-attention, - "
        "the MLP, E the MoE MLP, each a layer of its own with its norm and residual (Nemotron-H: "
        "M-M-M-M*-M-...). Its length is num_layers. None: every layer is attention then an MLP.",
    )
    mamba: MambaConfig | None = Field(
        None, description="The Mamba-2 mixers of hybrid_pattern's M layers (default: Megatron-Core's)."
    )
    mtp_layers: int = Field(
        0,
        ge=0,
        le=16,
        description="Multi-token prediction depth (DeepSeek-V3, Megatron --mtp-num-layers): each depth is one more "
        "transformer layer and output-layer pass on the last pipeline stage; not in the parameter count.",
    )

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data, info: ValidationInfo):
        return expand_model_section(data, (info.context or {}).get("base_dir"))

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        a, g = self.num_attention_heads, self.query_groups
        if self.hidden_size % a and self.kv_channels is None and self.mla is None:
            raise ValueError(
                f"model.hidden_size ({self.hidden_size}) is not divisible by num_attention_heads ({a}); give "
                "kv_channels (the per-head width) if the model's heads are not hidden_size / heads wide"
            )
        if a % g:
            raise ValueError(f"model.num_attention_heads ({a}) is not divisible by num_query_groups ({g})")
        if self.mla is not None and self.num_query_groups not in (None, a):
            raise ValueError(
                f"model.num_query_groups ({self.num_query_groups}): multi-head latent attention gives every head its "
                f"own keys and values (leave num_query_groups unset or {a})"
            )
        if self.sliding_window is not None and self.attention_chunk_size is not None:
            raise ValueError(
                "model.sliding_window and attention_chunk_size: a layer's attention is windowed or chunked, not both"
            )
        if self.hybrid_pattern is not None:
            self._check_hybrid(self.hybrid_pattern)
        if self.activation_clamp is not None and not self.gated:
            raise ValueError(
                f"model.activation_clamp ({self.activation_clamp}) clamps a gated activation's two halves; "
                f"activation {self.activation} is not gated (swiglu, geglu or quick-geglu)"
            )
        if self.rope_mscale != 1.0 and self.position_embedding != "rope" and self.mla is None:
            raise ValueError(
                f"model.rope_mscale ({self.rope_mscale}) scales rotary embeddings; position_embedding is "
                f"{self.position_embedding}"
            )
        moe = self.moe
        if moe is not None and moe.first_dense_layers >= self.num_layers:
            raise ValueError(
                f"model.moe.first_dense_layers ({moe.first_dense_layers}) leaves no MoE layer of num_layers "
                f"({self.num_layers})"
            )
        return self

    def _check_hybrid(self, pattern: str) -> None:
        """Megatron-LM's own checks of a hybrid pattern (hybrid_layer_allocation.py, d98e8a64), and what the
        simulator does not model of it, each refused by name."""
        bad = sorted(set(pattern) - set(HYBRID_SYMBOLS))
        if bad:
            known = {"|": "pipeline stage boundaries", "/": "multi-token prediction", "G": "gated delta net"}
            what = "; ".join(f"{c!r} ({known[c]}, not modelled)" if c in known else repr(c) for c in bad)
            raise ValueError(
                f"model.hybrid_pattern: {what} is not a layer the simulator knows; use M (Mamba-2), * (attention), "
                "- (MLP) and E (MoE)"
            )
        if len(pattern) != self.num_layers:
            raise ValueError(
                f"model.hybrid_pattern has {len(pattern)} layers but num_layers is {self.num_layers}: one symbol per "
                "layer (Megatron takes the count from the pattern)"
            )
        if ("E" in pattern) != (self.moe is not None):
            raise ValueError(
                "model.hybrid_pattern: E layers need model.moe"
                if "E" in pattern
                else "model.moe is set but hybrid_pattern has no E (MoE) layer"
            )
        for field, value in (
            ("mla", self.mla),
            ("sliding_window", self.sliding_window),
            ("attention_chunk_size", self.attention_chunk_size),
        ):
            if value is not None:
                raise ValueError(f"model.{field} with hybrid_pattern is not modelled")
        if self.mtp_layers:
            raise ValueError("model.mtp_layers with hybrid_pattern is not modelled")
        if self.moe is not None and (self.moe.first_dense_layers or self.moe.layer_freq != 1):
            raise ValueError(
                "model.moe.first_dense_layers / layer_freq: a hybrid pattern places its MoE layers itself (E)"
            )
        c = self.mamba_config
        if self.mamba_heads % c.num_groups:
            raise ValueError(
                f"model.mamba: num_heads ({self.mamba_heads}) is not divisible by num_groups ({c.num_groups}), as "
                "Megatron's MambaMixer requires"
            )

    def layer_kind(self, i: int) -> str:
        """What layer ``i`` (from 0) is: "layer" (attention then an MLP or MoE MLP) unless ``hybrid_pattern`` gives
        a layer of its own: "mamba", "attention", "mlp" or "moe"."""
        return HYBRID_SYMBOLS[self.hybrid_pattern[i]] if self.hybrid_pattern else "layer"

    @property
    def mamba_config(self) -> MambaConfig:
        return self.mamba or MambaConfig()

    @property
    def mamba_heads(self) -> int:
        c = self.mamba_config
        return c.num_heads or c.expand * self.hidden_size // c.head_dim

    @property
    def mamba_inner(self) -> int:
        """The mixer's inner width d_inner: heads x head_dim (MambaMixer: num_heads x head_dim where heads are
        given, else expand x hidden_size)."""
        return self.mamba_heads * self.mamba_config.head_dim

    def layers_of(self, kind: str) -> int:
        return sum(self.layer_kind(i) == kind for i in range(self.num_layers))

    @property
    def attention_layers(self) -> int:
        """Layers with self-attention (every layer but a hybrid's M, - and E ones)."""
        return self.num_layers if not self.hybrid_pattern else self.hybrid_pattern.count("*")

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def windowed_layers(self) -> int:
        """Layers whose attention is windowed (``sliding_window``) or chunked (``attention_chunk_size``)."""
        if self.sliding_window is None and self.attention_chunk_size is None:
            return 0
        every = self.full_attention_every
        return self.num_layers - (self.num_layers // every if every else 0)

    def attention_work_share(self, seq: int) -> float:
        """A layer's causal attention work at ``seq`` tokens, averaged over the layers, as a share of full causal
        attention's, whose query i sees i + 1 keys, (s + 1) / 2 on average: a windowed query sees min(i + 1, w),
        (w (w + 1) / 2 + (s - w) w) / s on average; a chunked one (i mod c) + 1, (q c (c + 1) / 2 + r (r + 1) / 2) / s
        with s = q c + r (Llama 4: modeling_llama4.py's chunked causal mask)."""
        w, c, n = self.sliding_window, self.attention_chunk_size, self.windowed_layers
        if not n or (w or c) >= seq:
            return 1.0
        if w is not None:
            keys = windowed_keys(seq, w)
        else:
            q, r = divmod(seq, c)
            keys = q * c * (c + 1) / 2 + r * (r + 1) / 2
        windowed = keys / seq / ((seq + 1) / 2)
        return (self.num_layers - n + n * windowed) / self.num_layers

    @property
    def gated(self) -> bool:
        """A gated MLP (SwiGLU, GeGLU): two up projections, the activation of one times the other."""
        return self.activation in ("swiglu", "geglu", "quick-geglu")

    @property
    def ffn_size(self) -> int:
        if self.ffn_hidden_size:
            return self.ffn_hidden_size
        if self.gated:  # Llama convention: 2/3 of 4h, rounded up to a multiple of 64
            return -(-int(8 * self.hidden_size / 3) // 64) * 64
        return 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        """Per-head query / key width (with MLA the non-rotary and rotary parts together)."""
        if self.mla is not None:
            return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def v_head_dim(self) -> int:
        """Per-head value width (the attention output is heads x this wide)."""
        return self.mla.v_head_dim if self.mla is not None else self.head_dim

    @property
    def has_qkv_bias(self) -> bool:
        return self.add_bias_linear if self.qkv_bias is None else self.qkv_bias

    @property
    def expert_ffn_size(self) -> int:
        """Width of one routed expert's MLP (the dense MLP's without MoE)."""
        return (self.moe.ffn_hidden_size or self.ffn_size) if self.moe else self.ffn_size

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` (from 0) has a mixture-of-experts MLP."""
        m = self.moe
        if self.hybrid_pattern is not None:
            return self.hybrid_pattern[i] == "E"
        if m is None or i < m.first_dense_layers:
            return False
        return (i - m.first_dense_layers + 1) % m.layer_freq == 0

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))
