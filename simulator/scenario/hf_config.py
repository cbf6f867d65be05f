"""A Hugging Face ``config.json`` as the ``model:`` section: Llama-style and GPT-2 decoders, and the
mixture-of-experts families (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2 / V3 with multi-head latent
attention, GPT-OSS), each read as its transformers modelling code builds the model (transformers ``models/<type>/
configuration_<type>.py`` and ``modeling_<type>.py``: which keys exist, their defaults, which layers are MoE)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.scenario.files import read_json

# Hugging Face names -> ours. GPT-2 uses its own short names.
_HF_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer"),
    "hidden_size": ("hidden_size", "n_embd"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_query_groups": ("num_key_value_heads",),
    "ffn_hidden_size": ("intermediate_size", "n_inner"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
    "vocab_size": ("vocab_size",),
    "tied_embeddings": ("tie_word_embeddings",),
}
# config.json keys that count experts (Mixtral, Qwen2-MoE, DeepSeek-MoE, DBRX-style configs)
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "gpt_oss")


class HfConfigWarning(UserWarning):
    """A Hugging Face config read with a default where it said nothing."""


# model_types whose MLP is gated with a GELU (GeGLU)
GATED_GELU_TYPES = ("gemma", "gemma2", "gemma3", "gemma3_text")


def read_hf_config(path: Path) -> dict:
    """Read a Hugging Face ``config.json`` into the model section (``ValueError`` naming the key on a problem)."""
    try:
        cfg = read_json(path, "hf_config")
    except ScenarioError as e:
        raise ValueError(str(e)) from None
    if not isinstance(cfg, dict):
        raise ValueError(f"hf_config {path}: expected a JSON object, got {type(cfg).__name__}")
    model_type = str(cfg.get("model_type", ""))
    experts = next((cfg[k] for k in _EXPERT_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 1), None)
    if experts and model_type not in MOE_TYPES:
        raise ValueError(
            f"hf_config {path}: a mixture-of-experts model ({experts} experts) of model_type {model_type!r}, which "
            f"is not read here (mixture-of-experts types read: {', '.join(MOE_TYPES)}); write its model section "
            "with model.moe instead"
        )
    name = cfg.get("_name_or_path") or model_type or path.stem
    out: dict = {"name": str(name)}
    for ours, theirs in _HF_KEYS.items():
        for key in theirs:
            if cfg.get(key) is not None:
                out[ours] = cfg[key]
                break
    given = (
        cfg.get("hidden_act") or cfg.get("activation_function") or cfg.get("mlp_hidden_act")
    )  # Nemotron-H's
    act = str(given or _default_act(model_type))
    if not given and model_type != "gpt2":
        warnings.warn(
            f"hf_config {path}: no hidden_act; a {model_type or 'config'} without one uses {act} "
            f"({'SwiGLU' if act == 'silu' else act} MLP), transformers' default for it",
            HfConfigWarning,
            stacklevel=2,
        )
    if model_type == "gpt2":
        out.update(
            activation="gelu", normalization="layernorm", position_embedding="learned", add_bias_linear=True
        )
        out.setdefault("tied_embeddings", True)
    else:  # Llama-style decoders: gated SiLU MLP, RMSNorm, rotary positions
        out["activation"] = (
            "swiglu"
            if act in ("silu", "swish", "swiglu")
            # Gemma's MLP is gated (transformers models/gemma*/modeling_gemma*.py GemmaMLP: gate_proj, up_proj,
            # down_proj with act_fn = gelu_pytorch_tanh): GeGLU
            else "geglu"
            if model_type in GATED_GELU_TYPES and act.startswith("gelu")
            else "squared-relu"
            if act == "relu2"
            else "gelu"
        )
        out.update(_local_attention(cfg, model_type))
        # GemmaConfig's tie_word_embeddings=True where the file says nothing
        if model_type in GATED_GELU_TYPES:
            out.setdefault("tied_embeddings", True)
        out["normalization"] = "rmsnorm" if "rms_norm_eps" in cfg or model_type in MOE_TYPES else "layernorm"
        out["position_embedding"] = "rope" if "rope_theta" in cfg or "rope_scaling" in cfg else "learned"
        if model_type in MOE_TYPES:
            out["position_embedding"] = "rope"
        out["add_bias_linear"] = bool(cfg.get("mlp_bias", False))
        out.setdefault("tied_embeddings", False)
        if isinstance(cfg.get("head_dim"), int) and model_type not in ("deepseek_v2", "deepseek_v3"):
            out["kv_channels"] = cfg["head_dim"]  # DeepSeek-V3's head_dim is its rotary width, not a head's
    if isinstance(cfg.get("rope_scaling"), dict):
        out["rope_mscale"] = _yarn_factor(cfg["rope_scaling"])
    if model_type in MOE_TYPES:
        _moe(cfg, model_type, out, f"hf_config {path}")
    if model_type == "nemotron_h":
        _hybrid(cfg, out, f"hf_config {path}")
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size") if k not in out]
    if missing:
        raise ValueError(f"hf_config {path} lacks {', '.join(missing)}")
    return out


def _yarn_factor(scaling: dict) -> float:
    """YaRN's attention factor on cos and sin as Megatron-Core computes it (yarn_rotary_pos_embedding.py
    _yarn_get_concentration_factor, Megatron-LM d7288711): 0.1 ln(factor) + 1 where mscale or mscale_all_dim is
    missing, else the ratio of the two scaled alike; 1 for other RoPE scalings."""
    if (scaling.get("rope_type") or scaling.get("type")) != "yarn":
        return 1.0
    factor = float(scaling.get("factor") or 1.0)

    def get(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    mscale, all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale is None or all_dim is None:
        return get(1.0)
    return get(float(mscale)) / get(float(all_dim))


def _hybrid(cfg: dict, out: dict, where: str) -> None:
    """A Nemotron-H config (transformers models/nemotron_h/configuration_nemotron_h.py): the layer pattern, the
    Mamba-2 mixers (ssm_state_size, mamba_head_dim, n_groups, mamba_num_heads, expand, conv_kernel, chunk_size),
    RMSNorm (its epsilon is layer_norm_epsilon), no biases unless stated."""
    pattern = cfg.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(
            f"{where}: a nemotron_h config needs hybrid_override_pattern (a string such as 'M-M*-')"
        )
    out["hybrid_pattern"] = pattern
    out.setdefault("num_layers", len(pattern))
    out["normalization"] = "rmsnorm"
    out["position_embedding"] = "rope"
    out["add_bias_linear"] = bool(cfg.get("mlp_bias", False) or cfg.get("use_bias", False))
    keys = {
        "state_dim": "ssm_state_size",
        "head_dim": "mamba_head_dim",
        "num_groups": "n_groups",
        "num_heads": "mamba_num_heads",
        "expand": "expand",
        "conv_kernel": "conv_kernel",
        "chunk_size": "chunk_size",
    }
    out["mamba"] = {
        ours: _int(cfg, theirs, where) for ours, theirs in keys.items() if cfg.get(theirs) is not None
    }


def _default_act(model_type: str) -> str:
    """transformers' default ``hidden_act`` of a config class where the file leaves it out (Llama, Mistral, Qwen,
    Mixtral, OLMoE and DeepSeek default to SiLU: a gated SiLU MLP); GPT-2's is GeLU."""
    return "gelu" if model_type in ("gpt2", "") else "silu"


def _int(cfg: dict, key: str, where: str, default=None):
    value = cfg.get(key, default)
    if value is None:
        raise ValueError(f"{where}: a {cfg.get('model_type')} config needs {key}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: {key} must be a non-negative integer (got {value!r})")
    return value


def _moe(cfg: dict, model_type: str, out: dict, where: str) -> None:
    """The ``moe`` (and ``mla``) subsections of a mixture-of-experts config, with transformers' defaults."""
    moe: dict = {}
    if model_type == "mixtral":  # MixtralSparseMoeBlock: softmax over the top-2 logits, every layer
        moe["num_experts"] = _int(cfg, "num_local_experts", where, 8)
        moe["top_k"] = _int(cfg, "num_experts_per_tok", where, 2)
        moe["ffn_hidden_size"] = _int(cfg, "intermediate_size", where, 14336)
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        moe["num_experts"] = _int(cfg, "num_experts", where)
        moe["top_k"] = _int(cfg, "num_experts_per_tok", where)
        moe["ffn_hidden_size"] = _int(cfg, "moe_intermediate_size", where)
        moe["layer_freq"] = max(_int(cfg, "decoder_sparse_step", where, 1), 1)
        if cfg.get("mlp_only_layers"):
            raise ValueError(
                f"{where}: mlp_only_layers {cfg['mlp_only_layers']} (dense layers among the MoE ones) cannot be "
                "stated as first_dense_layers and layer_freq"
            )
        if (
            model_type == "qwen2_moe"
        ):  # Qwen2MoeSparseMoeBlock: a shared expert behind a sigmoid gate; QKV bias
            moe["shared_expert_ffn_hidden_size"] = _int(cfg, "shared_expert_intermediate_size", where)
            moe["shared_expert_gate"] = True
            out["qkv_bias"] = bool(cfg.get("qkv_bias", True))
        else:
            out["qk_layernorm"] = True  # Qwen3MoeAttention: q_norm and k_norm over each head
    elif model_type == "gpt_oss":
        # GptOssMLP (transformers models/gpt_oss/modeling_gpt_oss.py): a biased router, top-k experts whose
        # gate_up_proj and down_proj carry biases, as the attention's projections do (attention_bias, default true)
        moe["num_experts"] = _int(cfg, "num_local_experts", where, 128)
        moe["top_k"] = _int(cfg, "num_experts_per_tok", where, 4)
        moe["ffn_hidden_size"] = _int(cfg, "intermediate_size", where, 2880)
        out["add_bias_linear"] = bool(cfg.get("attention_bias", True))
        out["attention_sinks"] = True  # GptOssAttention.sinks: a learnable logit per head
        # GptOssExperts: gate clamped at swiglu_limit, up within +-it, gate * sigmoid(1.702 gate) * (up + 1)
        out["activation"] = "quick-geglu"
        out["activation_clamp"] = float(cfg.get("swiglu_limit", 7.0))
    elif model_type == "olmoe":
        moe["num_experts"] = _int(cfg, "num_experts", where)
        moe["top_k"] = _int(cfg, "num_experts_per_tok", where)
        moe["ffn_hidden_size"] = _int(cfg, "intermediate_size", where)
        out["qk_layernorm"] = True
    else:  # deepseek_v2 / deepseek_v3: DeepseekV2MoE / DeepseekV3MoE, MLA attention
        experts_ffn = _int(cfg, "moe_intermediate_size", where)
        moe["num_experts"] = _int(cfg, "n_routed_experts", where)
        moe["top_k"] = _int(cfg, "num_experts_per_tok", where)
        moe["ffn_hidden_size"] = experts_ffn
        moe["shared_expert_ffn_hidden_size"] = _int(cfg, "n_shared_experts", where, 0) * experts_ffn
        moe["first_dense_layers"] = _int(cfg, "first_k_dense_replace", where, 0)
        moe["layer_freq"] = max(_int(cfg, "moe_layer_freq", where, 1), 1)
        v3 = model_type == "deepseek_v3"
        method = cfg.get("topk_method", "noaux_tc" if v3 else "greedy")
        moe["score_function"] = cfg.get("scoring_func", "sigmoid" if v3 else "softmax")
        if method in ("group_limited_greedy", "noaux_tc"):
            moe["num_groups"] = _int(cfg, "n_group", where)
            moe["group_topk"] = _int(cfg, "topk_group", where)
        moe["expert_bias"] = method == "noaux_tc"
        moe["aux_loss"] = "seq_aux_loss" if cfg.get("seq_aux", True) else "aux_loss"
        out["mla"] = {
            "q_lora_rank": cfg.get("q_lora_rank", 1536 if v3 else None),
            "kv_lora_rank": _int(cfg, "kv_lora_rank", where, 512),
            "qk_nope_head_dim": _int(cfg, "qk_nope_head_dim", where, 128),
            "qk_rope_head_dim": _int(cfg, "qk_rope_head_dim", where, 64),
            "v_head_dim": _int(cfg, "v_head_dim", where, 128),
        }
        out.pop("num_query_groups", None)  # MLA: every head its own keys and values (the key equals heads)
    out["moe"] = moe
    if model_type != "mixtral" and not (model_type.startswith("deepseek") and moe.get("first_dense_layers")):
        # every layer is MoE: intermediate_size (Qwen's upcycling source width) builds no module
        out.pop("ffn_hidden_size", None)
    if model_type == "mixtral":
        out.pop("ffn_hidden_size", None)


def _local_attention(cfg: dict, model_type: str) -> dict:
    """model.sliding_window (or attention_chunk_size) and full_attention_every from a config.json:
    ``sliding_window`` where the model uses it (Qwen2's ``use_sliding_window: false`` turns it off), the full-attention layers from ``layer_types`` (GPT-OSS,
    recent transformers), ``sliding_window_pattern`` (Gemma 3) or Gemma 2's alternation; a window over every layer
    otherwise (Mistral 7B v0.1). Llama 4's chunked attention likewise: ``attention_chunk_size``, its global layers
    the NoPE ones (``no_rope_layers``: 0 where a layer has no rotary embedding and attends to the whole context)."""
    chunk = cfg.get("attention_chunk_size")
    if isinstance(chunk, int) and not isinstance(chunk, bool) and chunk > 0:
        nope = cfg.get("no_rope_layers")
        full = sum(1 for x in nope if not x) if isinstance(nope, list) else 0
        every = {"full_attention_every": max(round(len(nope) / full), 1)} if full else {}
        return {"attention_chunk_size": chunk, **every}
    window = cfg.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return {}
    if cfg.get("use_sliding_window") is False:
        return {}
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        full = sum(1 for t in types if t == "full_attention")
        if full == len(types):
            return {}
        every = {"full_attention_every": max(round(len(types) / full), 1)} if full else {}
        return {"sliding_window": window, **every}
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 1:
        return {"sliding_window": window, "full_attention_every": pattern}
    if model_type == "gemma2":  # transformers Gemma2: every other layer windowed
        return {"sliding_window": window, "full_attention_every": 2}
    return {"sliding_window": window}
