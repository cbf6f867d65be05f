"""Model presets by name and Hugging Face ``config.json`` files, turned into the ``model:`` section."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import yaml

from simulator.errors import ScenarioError
from simulator.scenario.files import check_path_value, read_json

_PRESETS_FILE = Path(__file__).parent / "presets" / "models.yaml"
# keys of the model section that expand_model_section reads and replaces before validation
MODEL_SOURCE_KEYS = ("preset", "hf_config")


@cache
def model_presets() -> dict[str, dict]:
    return yaml.safe_load(_PRESETS_FILE.read_text())


def expand_model_section(data, base_dir: Path | None = None):
    """``"llama3-8b"`` or ``{preset: ..., **overrides}`` or ``{hf_config: path, **overrides}`` -> plain dict."""
    if isinstance(data, str):
        data = {"preset": data}
    if not isinstance(data, dict):
        return data
    data = dict(data)
    base: dict = {}
    if "preset" in data:
        name = data.pop("preset")
        presets = model_presets()
        if not isinstance(name, str) or name not in presets:
            raise ValueError(f"unknown model preset {name!r}; available: {', '.join(sorted(presets))}")
        base = {"name": name, **presets[name]}
    elif "hf_config" in data:
        given = check_path_value(data.pop("hf_config"), "model.hf_config")
        path = Path(given)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.exists() and _HUB_ID.match(given):
            raise ValueError(
                f"hf_config '{given}' looks like a Hugging Face hub id; hub ids are not downloaded: save the "
                "model's config.json and give its path"
            )
        base = read_hf_config(path)
        longest = base.pop("max_position_embeddings", "not given")
        if "seq_length" not in data:
            raise ValueError(
                f"seq_length is required with hf_config: config.json's max_position_embeddings ({longest}) is "
                "the longest context the model supports, not the training sequence length (e.g. seq_length: 4096)"
            )
    return {**base, **data}


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


# config.json keys that count experts (Mixtral, Qwen2-MoE, DeepSeek-MoE, DBRX-style configs)
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
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


def read_hf_config(path: Path) -> dict:
    """Read a Hugging Face ``config.json`` (Llama, Mistral, Qwen2, GPT-2 families) into the model section."""
    try:
        cfg = read_json(path, "hf_config")
    except ScenarioError as e:
        raise ValueError(str(e)) from None
    if not isinstance(cfg, dict):
        raise ValueError(f"hf_config {path}: expected a JSON object, got {type(cfg).__name__}")
    experts = next((cfg[k] for k in _MOE_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 1), None)
    if experts:
        raise ValueError(
            f"hf_config {path}: a mixture-of-experts model ({experts} experts, model_type "
            f"{cfg.get('model_type', '?')!r}); expert parallelism and routing are not modelled, and simulating it "
            "as a dense model would be wrong"
        )
    name = cfg.get("_name_or_path") or cfg.get("model_type") or path.stem
    out: dict = {"name": str(name)}
    for ours, theirs in _HF_KEYS.items():
        for key in theirs:
            if cfg.get(key) is not None:
                out[ours] = cfg[key]
                break
    model_type = cfg.get("model_type", "")
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "gelu")
    if model_type == "gpt2":
        out.update(
            activation="gelu", normalization="layernorm", position_embedding="learned", add_bias_linear=True
        )
        out.setdefault("tied_embeddings", True)
    else:  # Llama-style decoders: gated SiLU MLP, RMSNorm, rotary positions
        out["activation"] = "swiglu" if act in ("silu", "swish", "swiglu") else "gelu"
        out["normalization"] = "rmsnorm" if "rms_norm_eps" in cfg else "layernorm"
        out["position_embedding"] = "rope" if "rope_theta" in cfg or "rope_scaling" in cfg else "learned"
        out["add_bias_linear"] = bool(cfg.get("mlp_bias", False))
        out.setdefault("tied_embeddings", False)
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size") if k not in out]
    if missing:
        raise ValueError(f"hf_config {path} lacks {', '.join(missing)}")
    return out
