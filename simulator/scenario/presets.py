"""Model presets by name and Hugging Face ``config.json`` files, turned into the ``model:`` section."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from simulator import paths
from simulator.scenario.files import check_path_value, did_you_mean, read_shipped_yaml
from simulator.scenario.hf_config import read_hf_config

_PRESETS_FILE = Path(__file__).parent / "presets" / "models.yaml"
# keys of the model section that expand_model_section reads and replaces before validation
MODEL_SOURCE_KEYS = ("preset", "hf_config")


@cache
def model_presets() -> dict[str, dict]:
    return read_shipped_yaml(_PRESETS_FILE)


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
            raise ValueError(
                f"unknown model preset {name!r}{did_you_mean(name, sorted(presets))}; "
                f"available: {', '.join(sorted(presets))}"
            )
        base = {"name": name, **presets[name]}
    elif "hf_config" in data:
        given = check_path_value(data.pop("hf_config"), "model.hf_config")
        path = Path(given)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not paths.exists(path, "model.hf_config") and _HUB_ID.match(given):
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
    return merged(base, data)


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def merged(base: dict, overrides: dict) -> dict:
    """``base`` with ``overrides`` on top, subsections merged key by key (``moe: {capacity_factor: 1}`` over a
    preset keeps the preset's experts)."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out
