"""YAML file -> validated :class:`Scenario`, with one readable line per problem and no tracebacks."""

from __future__ import annotations

import difflib
from pathlib import Path

from pydantic import ValidationError

from simulator.errors import ScenarioError
from simulator.scenario.files import check_path_value, is_path, read_yaml
from simulator.scenario.resolve import resolve_cluster_degrees
from simulator.scenario.schema import Scenario
from simulator.scenario.shipped import resolve_scenario
from simulator.tables.select import check_choice


def framework_option(framework: str) -> str:
    """``--framework``'s value as a scenario's ``framework:``: a name as it is, a profile file made absolute (a
    relative one is the working directory's, as every command-line path)."""
    return str(Path(framework).resolve()) if is_path(framework) else framework


def load_scenario(
    source: str | Path | dict,
    base_dir: Path | None = None,
    deepspeed_config: str | Path | None = None,
    framework: str | None = None,
) -> Scenario:
    """Load a scenario from a YAML path or an already-parsed dict, validate it and resolve derived values.
    ``framework``: a profile name or file replacing the scenario's (``--framework``; a relative file is the
    working directory's, as every command-line path).

    Raises :class:`ScenarioError` with a message naming the field and the arithmetic.
    """
    if isinstance(source, dict):
        data, label = source, "scenario"
    else:
        path = resolve_scenario(source)
        label = str(path)
        data = read_yaml(path)
        base_dir = base_dir or path.parent
        if not isinstance(data, dict):
            raise ScenarioError(f"{label}: expected a mapping with model, cluster, training, parallelism")
        data.setdefault("name", path.stem)
    ds_path = deepspeed_config or data.get("deepspeed_config")
    ds_gas, ds_sources = None, {}
    if ds_path is not None:
        check_path_value(str(ds_path) if isinstance(ds_path, Path) else ds_path, "deepspeed_config")
        from simulator.scenario.deepspeed import merge_deepspeed_config, read_deepspeed_config

        path = Path(ds_path)
        if not path.is_absolute() and base_dir is not None and not deepspeed_config:
            path = base_dir / path
        # a config handed in beside the scenario (run --deepspeed-config) replaces the scenario's values; one the
        # scenario file names itself must agree with it
        data = merge_deepspeed_config(
            data,
            read_deepspeed_config(path),
            f"deepspeed_config {path.name}",
            override=bool(deepspeed_config),
        )
        ds_gas = data.pop("_deepspeed_gradient_accumulation_steps", None)
        ds_sources = {
            k: f"deepspeed_config {path.name}: {v}" for k, v in data.pop("_deepspeed_sources").items()
        }
        data["deepspeed_config"] = str(path)
    # a stack's own launch file beside the scenario: torchtitan's TOML, Megatron-LM's command line
    for key in ("torchtitan_config", "megatron_args"):
        given = data.get(key)
        if given is None:
            continue
        check_path_value(given, key)
        read, merge = _stack_readers(key)
        path = Path(given)
        path = base_dir / path if not path.is_absolute() and base_dir is not None else path
        data = merge(data, read(path), f"{key} {path.name}")
        data[key] = str(path)
    data = _paths_relative_to(data, base_dir)
    if framework is not None:  # after the scenario's own paths: this one is the command line's
        data = {**data, "framework": framework_option(framework)}
    if isinstance(data.get("kernels"), str):  # a table directory is relative to the scenario file
        data = {**data, "kernels": check_choice(data["kernels"], base_dir=base_dir)}
    try:
        scenario = Scenario.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as e:
        raise ScenarioError(
            "\n".join(_from_deepspeed(format_validation_error(err), err, ds_sources) for err in e.errors())
        ) from None
    except ValueError as e:  # raised by the preset / hf_config expansion before field validation
        raise ScenarioError(f"model: {e}") from None
    scenario = resolve_cluster_degrees(scenario)
    if ds_gas is not None and ds_gas != scenario.gradient_accumulation_steps:
        t, dp = scenario.training, scenario.parallelism.data_parallel
        raise ScenarioError(
            f"deepspeed_config: gradient_accumulation_steps ({ds_gas}) contradicts global_batch_size "
            f"({t.global_batch_size}) / (micro_batch_size ({t.micro_batch_size}) x data_parallel ({dp})) = "
            f"{scenario.gradient_accumulation_steps}"
        )
    return scenario


def _stack_readers(key: str):
    """(read, merge) of a stack's launch file: scenario/torchtitan.py, scenario/megatron_args.py."""
    if key == "torchtitan_config":
        from simulator.scenario.torchtitan import merge_torchtitan_config, read_torchtitan_config

        return read_torchtitan_config, merge_torchtitan_config
    from simulator.scenario.megatron_args import merge_megatron_args, read_megatron_args

    return read_megatron_args, merge_megatron_args


def _from_deepspeed(message: str, err: dict, sources: dict[str, str]) -> str:
    """A field the DeepSpeed config set is named by its ds_config key too (the user wrote that one)."""
    source = sources.get(".".join(str(p) for p in err["loc"]))
    return f"{source} -> {message}" if source else message


def _paths_relative_to(data: dict, base_dir: Path | None) -> dict:
    """Topology, GPU and framework files named by a relative path are found beside the scenario file (names of
    shipped ones are left as they are)."""
    if base_dir is None:
        return data

    def resolved(value):
        if isinstance(value, str) and is_path(value) and not Path(value).is_absolute():
            return str(base_dir / value)
        return value

    cluster = data.get("cluster")
    if isinstance(cluster, dict):
        files = {key: resolved(cluster[key]) for key in ("topology", "gpu") if key in cluster}
        data = {**data, "cluster": {**cluster, **files}}
    if "framework" in data:
        data = {**data, "framework": resolved(data["framework"])}
    return data


def format_validation_error(err: dict) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"]
    if err["type"] == "value_error":  # our validators write complete sentences that name their fields
        msg = msg.removeprefix("Value error, ")
        return (
            msg if not loc or msg.split(" ")[0].rstrip(":").startswith(loc.split(".")[0]) else f"{loc}: {msg}"
        )
    if err["type"] == "extra_forbidden":
        section = _section_of(err["loc"][:-1])
        key = str(err["loc"][-1])
        hint = difflib.get_close_matches(key, section, n=1) if section else []
        return f"{loc}: unknown key" + (f" (did you mean '{hint[0]}'?)" if hint else "")
    if err["type"] == "missing":
        return f"{loc}: required field is missing"
    return f"{loc}: {msg} (got {err.get('input')!r})"


def section_at(loc: tuple):
    """The scenario section (pydantic model) at ``loc``, or None where ``loc`` names a value, a free-form
    mapping or no field."""
    model = Scenario
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        candidates = [a for a in getattr(ann, "__args__", (ann,)) if hasattr(a, "model_fields")]
        if not candidates:
            return None
        model = candidates[0]
    return model


def _section_of(loc: tuple) -> list[str]:
    """Field names of the section at ``loc``, for did-you-mean hints."""
    model = section_at(loc)
    return list(model.model_fields) if model is not None else []
