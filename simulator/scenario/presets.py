"""Model presets by name and Hugging Face ``config.json`` files, turned into the ``model:`` section."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import yaml

_PRESETS_FILE = Path(__file__).parent / "presets" / "models.yaml"


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
        if name not in presets:
            raise ValueError(f"unknown model preset '{name}'; available: {', '.join(sorted(presets))}")
        base = {"name": name, **presets[name]}
    elif "hf_config" in data:
        path = Path(data.pop("hf_config"))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        base = read_hf_config(path)
    return {**base, **data}


# Hugging Face names -> ours. GPT-2 uses its own short names.
_HF_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer"),
    "hidden_size": ("hidden_size", "n_embd"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_query_groups": ("num_key_value_heads",),
    "ffn_hidden_size": ("intermediate_size", "n_inner"),
    "seq_length": ("max_position_embeddings", "n_positions", "seq_length"),
    "vocab_size": ("vocab_size",),
    "tied_embeddings": ("tie_word_embeddings",),
}


def read_hf_config(path: Path) -> dict:
    """Read a Hugging Face ``config.json`` (Llama, Mistral, Qwen2, GPT-2 families) into the model section."""
    if not path.is_file():
        raise ValueError(f"hf_config file not found: {path}")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"hf_config {path} is not valid JSON: line {e.lineno}: {e.msg}") from None
    out: dict = {"name": cfg.get("_name_or_path") or cfg.get("model_type") or path.stem}
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
