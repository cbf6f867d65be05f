"""What a sweep varies: a base scenario and the fields set at each point of the grid (the cartesian product of
their values, or the values paired in order with ``zip``), from ``--vary FIELD=v1,v2`` or a sweep file. A varied
field that is not a scenario field is an error before any point runs (:func:`check_field`)."""

from __future__ import annotations

import copy
import difflib
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from simulator import paths
from simulator.errors import ScenarioError
from simulator.scenario.files import is_path, read_yaml
from simulator.scenario.presets import MODEL_SOURCE_KEYS

FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class Sweep:
    """A base scenario (parsed YAML and the directory its relative paths are read from) and the varied fields."""

    base: dict
    base_dir: Path | None
    fields: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]
    zipped: bool = False

    def __post_init__(self):
        if not self.fields:
            raise ScenarioError("sweep: nothing to vary (give --vary FIELD=v1,v2,... or a vary: section)")
        if len(set(self.fields)) != len(self.fields):
            raise ScenarioError(f"sweep: a field is varied twice: {', '.join(self.fields)}")
        for f, vs in zip(self.fields, self.values, strict=True):
            check_field(f)
            if not vs:
                raise ScenarioError(f"sweep: {f}: no values")
            # results.parquet stores numbers as 64-bit integers: said now, not after every point ran
            for v in vs:
                if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
                    raise ScenarioError(
                        f"sweep: {f}: {v} is beyond a 64-bit integer (no scenario field is that large)"
                    )
        if self.zipped and len({len(v) for v in self.values}) > 1:
            lengths = ", ".join(f"{f} ({len(v)})" for f, v in zip(self.fields, self.values, strict=True))
            raise ScenarioError(
                f"sweep: --zip pairs values in order, so every field needs as many: {lengths}"
            )

    @property
    def size(self) -> int:
        if self.zipped:
            return len(self.values[0])
        n = 1
        for v in self.values:
            n *= len(v)
        return n

    def assignments(self) -> Iterator[dict[str, Any]]:
        rows = zip(*self.values, strict=True) if self.zipped else itertools.product(*self.values)
        for row in rows:
            yield dict(zip(self.fields, row, strict=True))


# keys the loader reads before validation (simulator/scenario/presets.py expand_model_section)
_LOADER_KEYS = {("model",): MODEL_SOURCE_KEYS}


def check_field(name: str) -> None:
    """A varied field must be a scenario field: a misspelt one would make every point of the grid invalid for the
    same reason, so it is one error before anything runs (with the nearest field's name)."""
    from simulator.scenario.loader import section_at

    parts = tuple(name.split("."))
    for i, part in enumerate(parts):
        path = parts[:i]
        model = section_at(path)
        if model is None:  # below a value, a free-form mapping or a loader key: nothing to check
            return
        known = [*model.model_fields, *_LOADER_KEYS.get(path, ())]
        if part not in known:
            where = ".".join(path) or "the scenario"
            hint = difflib.get_close_matches(part, known, n=1)
            raise ScenarioError(
                f"vary {name}: {where} has no field {part!r}"
                + (f" (did you mean '{'.'.join((*path, hint[0]))}'?)" if hint else "")
            )


# varying one of these changes the GPUs left for data parallelism
SHAPE_FIELDS = {
    "parallelism.tensor_parallel",
    "parallelism.pipeline_parallel",
    "parallelism.context_parallel",
    "cluster.num_nodes",
    "cluster.topology",
    "cluster.gpus_per_node",
}


def derived_data_parallel(sweep: Sweep) -> tuple[Sweep, bool]:
    """When the grid changes the GPU count or the model-parallel degrees but not data_parallel, data
    parallelism is derived at each point (the base's value would make most points invalid). Returns the sweep
    and whether the base's data_parallel was dropped."""
    par = sweep.base.get("parallelism")
    if (
        not isinstance(par, dict)
        or "data_parallel" not in par
        or "parallelism.data_parallel" in sweep.fields
        or not SHAPE_FIELDS & set(sweep.fields)
    ):
        return sweep, False
    base = copy.deepcopy(sweep.base)
    del base["parallelism"]["data_parallel"]
    return Sweep(base, sweep.base_dir, sweep.fields, sweep.values, sweep.zipped), True


def parse_vary(spec: str) -> tuple[str, tuple[Any, ...]]:
    """``FIELD=v1,v2,...`` -> (field, values); each value is read as YAML (8 -> int, true -> bool)."""
    name, sep, rest = spec.partition("=")
    name = name.strip()
    if not sep or not FIELD.match(name):
        raise ScenarioError(
            f"--vary {spec!r}: expected FIELD=v1,v2,... with FIELD a dotted scenario path "
            "(e.g. parallelism.tensor_parallel=1,2,4)"
        )
    values = tuple(_value(v.strip(), name) for v in rest.split(",") if v.strip())
    if not values:
        raise ScenarioError(f"--vary {name}: no values after '='")
    return name, values


def _value(text: str, name: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise ScenarioError(f"--vary {name}: cannot read value {text!r}") from None


def load_base(path: Path) -> tuple[dict, Path]:
    """The base scenario file (or a shipped scenario's name, as ``run`` takes it), parsed (validated point by point
    later)."""
    from simulator.scenario.shipped import resolve_scenario

    path = resolve_scenario(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: expected a mapping with model, cluster, training, parallelism")
    data.setdefault("name", path.stem)
    return data, path.parent


def load_sweep_file(path: Path) -> tuple[Sweep, dict]:
    """A sweep YAML: ``base:`` (a scenario path, relative to the file, a shipped scenario's name, or an inline
    scenario), ``vary:`` (field -> list of values), optional ``zip: true``, ``out:``, ``report:``. Returns the
    sweep and the options."""
    from simulator.scenario.shipped import resolve_scenario

    path = resolve_scenario(path)  # a shipped scenario's name too, so the message below can say what to add
    data = read_yaml(path)
    if not isinstance(data, dict) or "vary" not in data:
        raise ScenarioError(
            f"{path}: a scenario with no vary: section; give --vary FIELD=v1,v2,... or a sweep file with base: "
            "and vary:"
        )
    unknown = set(data) - {"base", "vary", "zip", "out", "report"}
    if unknown:
        raise ScenarioError(
            f"{path}: unknown keys {', '.join(sorted(unknown))} (expected base, vary, zip, out, report)"
        )
    base = data.get("base")
    if isinstance(base, str):
        if "\x00" in base or not base.strip():
            raise ScenarioError(f"{path}: base: not a usable file name ({base!r})")
        beside = (path.parent / base).resolve()
        # a file beside the sweep file, else (a bare name) a shipped scenario's, as `run` and `sweep NAME` take it
        base_data, base_dir = load_base(
            beside if is_path(base) or paths.exists(beside, "base") else Path(base)
        )
    elif isinstance(base, dict):
        base_data, base_dir = copy.deepcopy(base), path.parent
        base_data.setdefault("name", path.stem)
    else:
        raise ScenarioError(f"{path}: base: must be a scenario file name or a scenario mapping")
    vary = data["vary"]
    if not isinstance(vary, dict) or not vary:
        raise ScenarioError(f"{path}: vary: must map fields to lists of values")
    fields, values = [], []
    for name, vs in vary.items():
        if not isinstance(name, str) or not FIELD.match(name):
            raise ScenarioError(f"{path}: vary: {name!r} is not a dotted scenario path")
        fields.append(name)
        values.append(tuple(vs) if isinstance(vs, list) else (vs,))
    options = {k: data[k] for k in ("out", "report") if k in data}
    for key, value in options.items():
        if not isinstance(value, str) or not value.strip():
            raise ScenarioError(f"{path}: {key}: expected a path (a string), got {value!r}")
    return Sweep(base_data, base_dir, tuple(fields), tuple(values), bool(data.get("zip", False))), options


def assign(base: dict, assignment: dict[str, Any]) -> dict:
    """The base scenario with each dotted field set. ``model`` set to a name means that preset (a ``.json``
    path: that Hugging Face config); the point's name records what was varied."""
    data = copy.deepcopy(base)
    for name, value in assignment.items():
        keys = name.split(".")
        if keys == ["model"] and isinstance(value, str):
            value = {"hf_config": value} if value.endswith(".json") else {"preset": value}
        node = data
        for k in keys[:-1]:
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            elif not isinstance(child, dict):
                raise ScenarioError(f"sweep: {name}: {k} is a value in the base scenario, not a section")
            node = child
        node[keys[-1]] = value
    label = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in assignment.items())
    data["name"] = f"{base.get('name', 'sweep')}[{label}]"
    return data
