"""A real DeepSpeed JSON config as input: its batch, precision, optimizer and ZeRO settings fill the scenario.

Fields the simulator does not model are listed in one warning, never silently ignored; a value that contradicts
the scenario is an error naming both. ``"auto"`` (Hugging Face Trainer style) means: take the scenario's value.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.scenario.files import read_json


class DeepSpeedConfigWarning(UserWarning):
    """Fields of a DeepSpeed config that the simulator does not model."""


# zero_optimization keys modelled, under the same names in parallelism.zero
ZERO_KEYS = {
    "reduce_scatter",
    "use_multi_rank_bucket_allreduce",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "overlap_comm",
    "stage3_prefetch_bucket_size",
    "stage3_max_live_parameters",
    "stage3_param_persistence_threshold",
    "stage3_max_reuse_distance",
    "stage3_model_persistence_threshold",
    "contiguous_gradients",
    "sub_group_size",
    "zero_quantized_weights",
    "zero_hpz_partition_size",
    "zero_quantized_gradients",
}
# offload sub-keys modelled (same names in parallelism.zero.offload_*); the rest are neutral or unmodelled
OFFLOAD_KEYS = {
    "offload_optimizer": {
        "device",
        "pin_memory",
        "buffer_count",
        "buffer_size",
        "pipeline_read",
        "pipeline_write",
    },
    "offload_param": {"device", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu"},
}
AIO_KEYS = {"block_size", "queue_depth", "thread_count"}
CHECKPOINTING_KEYS = {"partition_activations", "cpu_checkpointing"}
# data_types.grad_accum_dtype spellings DeepSpeed accepts (deepspeed/inference/config.py DtypeEnum, v0.16.5)
DTYPES = {
    **dict.fromkeys(("fp32", "float32", "float", "torch.float32"), "fp32"),
    **dict.fromkeys(("fp16", "float16", "half", "torch.float16"), "fp16"),
    **dict.fromkeys(("bf16", "bfloat16", "bfloat", "torch.bfloat16"), "bf16"),
}
# DeepSpeed optimizer type (lower case) -> (training.optimizer, optimizer.params keys modelled in training.onebit)
OPTIMIZERS = {
    "adam": ("adam", set()),
    "adamw": ("adamw", set()),
    "sgd": ("sgd", set()),
    "fusedadam": ("adam", set()),
    "cpuadam": ("adam", set()),
    "deepspeedcpuadam": ("adam", set()),
    "onebitadam": ("onebit-adam", {"freeze_step"}),
    "zerooneadam": (
        "zero-one-adam",
        {"var_freeze_step", "var_update_scaler", "local_step_scaler", "local_step_clipper"},
    ),
}
# keys that change nothing the simulator measures (logging, checkpoint layout, numerics of loss scaling)
NEUTRAL = {
    "steps_per_print",
    "wall_clock_breakdown",
    "gradient_clipping",
    "prescale_gradients",
    "scheduler",
    "zero_allow_untested_optimizer",
    "dump_state",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "flops_profiler",
    "comms_logger",
    "zero_optimization.allgather_partitions",
    "zero_optimization.round_robin_gradients",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.offload_optimizer.fast_init",
    "zero_optimization.offload_param.nvme_path",
    "activation_checkpointing.contiguous_memory_optimization",
    "activation_checkpointing.number_checkpoints",
    "activation_checkpointing.synchronize_checkpoint_boundary",
    "activation_checkpointing.profile",
    "fp16.loss_scale",
    "fp16.loss_scale_window",
    "fp16.initial_scale_power",
    "fp16.hysteresis",
    "fp16.min_loss_scale",
    "fp16.auto_cast",
    "optimizer.params",
}


# sections that DeepSpeed reads as JSON objects (deepspeed/runtime/config.py, v0.16.4: get_*_config(param_dict))
OBJECT_SECTIONS = (
    "fp16",
    "bf16",
    "optimizer",
    "optimizer.params",
    "scheduler",
    "zero_optimization",
    "zero_optimization.offload_optimizer",
    "zero_optimization.offload_param",
    "activation_checkpointing",
    "aio",
    "data_types",
)


def read_deepspeed_config(path: str | Path) -> dict:
    """A DeepSpeed JSON config, checked for its shape: an object whose sections are objects."""
    path = Path(path)
    ds = read_json(path, "deepspeed_config")
    if not isinstance(ds, dict):
        raise ScenarioError(f"deepspeed_config: {path}: expected a JSON object, got {json.dumps(ds)[:60]}")
    for name in OBJECT_SECTIONS:
        parent, _, key = name.rpartition(".")
        section = ds.get(parent, {}) if parent else ds
        value = section.get(key) if isinstance(section, dict) else None
        if value is not None and not isinstance(value, dict):
            example = ' (e.g. "bf16": {"enabled": true})' if name in ("fp16", "bf16") else ""
            raise ScenarioError(
                f"deepspeed_config: {path}: {name} must be an object{example}, got {json.dumps(value)[:60]}"
            )
    return ds


def merge_deepspeed_config(
    data: dict, ds: dict, label: str = "deepspeed_config", override: bool = False
) -> dict:
    """The scenario dict with the DeepSpeed config's settings filled in (or checked against it). A value the
    scenario states otherwise is a contradiction, unless ``override`` (``run --deepspeed-config``: the config
    the user hands in on the command line replaces the scenario's values, each replacement said once)."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    # the sections the config fills must be mappings before anything is merged into them
    for name, value in (("training", data.get("training")), ("parallelism", data.get("parallelism"))):
        if value is not None and not isinstance(value, dict):
            raise ScenarioError(
                f"{name}: expected a mapping of its fields beside {label}, got {type(value).__name__} ({str(value)[:40]!r})"
            )
    zero_given = (data.get("parallelism") or {}).get("zero")
    if zero_given is not None and not isinstance(zero_given, dict):
        raise ScenarioError(
            f"parallelism.zero: expected a mapping of its fields beside {label}, got {type(zero_given).__name__}"
        )
    training = data.setdefault("training", {})
    parallelism = data.setdefault("parallelism", {})
    zero = dict(parallelism.get("zero") or {})
    for key in ("offload_optimizer", "offload_param"):
        if zero.get(key) is not None and not isinstance(zero[key], dict):
            raise ScenarioError(
                f"parallelism.zero.{key}: expected a mapping such as {{device: cpu}} beside {label}, got "
                f"{type(zero[key]).__name__} ({str(zero[key])[:40]!r})"
            )
    unmodelled: list[str] = []

    sources: dict[str, str] = {}  # scenario field -> the ds_config key that set it, for validation messages
    replaced: list[str] = []  # with override: the scenario values the config replaced

    def put(section: dict, key: str, value, source: str, where: str | None = None) -> None:
        if value == "auto" or value is None:
            return
        where = where or (
            "training"
            if section is training
            else "parallelism"
            if section is parallelism
            else "parallelism.zero"
        )
        if key in section and section[key] != value:
            if not override:
                raise ScenarioError(f"{label}: {source} ({value}) contradicts {where}.{key} ({section[key]})")
            replaced.append(f"{source} {value} replaces {where}.{key} {section[key]}")
        section[key] = value
        sources[f"{where}.{key}"] = source

    put(training, "global_batch_size", ds.get("train_batch_size"), "train_batch_size")
    put(
        training,
        "micro_batch_size",
        ds.get("train_micro_batch_size_per_gpu"),
        "train_micro_batch_size_per_gpu",
    )
    if (ds.get("fp16") or {}).get("enabled") is True:
        put(training, "precision", "fp16", "fp16.enabled")
    if (ds.get("bf16") or {}).get("enabled") is True:
        put(training, "precision", "bf16", "bf16.enabled")
    opt = str((ds.get("optimizer") or {}).get("type") or "").lower()
    if opt:
        if opt in OPTIMIZERS:
            mapped, keys = OPTIMIZERS[opt]
            put(training, "optimizer", mapped, "optimizer.type")
            params = ds["optimizer"].get("params") or {}
            onebit = {k: v for k, v in params.items() if k in keys}
            if onebit:
                training["onebit"] = {**(training.get("onebit") or {}), **onebit}
        else:
            unmodelled.append(f"optimizer.type={ds['optimizer']['type']}")
    ckpt = ds.get("activation_checkpointing") or {}
    for key, value in ckpt.items():
        if key in CHECKPOINTING_KEYS:
            put(training, key, value, f"activation_checkpointing.{key}")
        elif f"activation_checkpointing.{key}" not in NEUTRAL:
            unmodelled.append(f"activation_checkpointing.{key}")
    aio = {}
    for key, value in (ds.get("aio") or {}).items():
        if key in AIO_KEYS:
            aio[key] = value
        else:
            unmodelled.append(f"aio.{key}")
    if aio:
        zero["aio"] = aio
    for key, value in (ds.get("data_types") or {}).items():
        if key == "grad_accum_dtype":
            dtype = DTYPES.get(str(value)) if value is not None else None
            if value is not None and dtype is None:
                raise ScenarioError(
                    f"{label}: data_types.grad_accum_dtype {value!r} is not one of fp32, fp16, bf16"
                )
            put(zero, "grad_accum_dtype", dtype, "data_types.grad_accum_dtype")
        else:
            unmodelled.append(f"data_types.{key}")
    gas = ds.get("gradient_accumulation_steps")
    zopt = ds.get("zero_optimization", {}) or {}
    if "stage" in zopt:
        put(parallelism, "zero_stage", zopt["stage"], "zero_optimization.stage")
    for key, value in zopt.items():
        if key == "stage":
            continue
        if key in ZERO_KEYS:
            put(zero, key, value, f"zero_optimization.{key}")
        elif key in OFFLOAD_KEYS and isinstance(value, dict):
            section = dict(zero.get(key) or {})
            for sub, v in value.items():
                name = f"zero_optimization.{key}.{sub}"
                if sub in OFFLOAD_KEYS[key]:
                    put(section, sub, v, name, f"parallelism.zero.{key}")
                elif name not in NEUTRAL:
                    unmodelled.append(name)
            zero[key] = section
        elif key == "cpu_offload" and value is True:  # DeepSpeed < 0.3.16 spelling of offload_optimizer: cpu
            zero["offload_optimizer"] = {**(zero.get("offload_optimizer") or {}), "device": "cpu"}
        elif f"zero_optimization.{key}" not in NEUTRAL:
            unmodelled.append(f"zero_optimization.{key}")
    if zero:
        parallelism["zero"] = zero
    for key, value in ds.items():
        if (
            key
            in (
                "train_batch_size",
                "train_micro_batch_size_per_gpu",
                "gradient_accumulation_steps",
                "zero_optimization",
                "optimizer",
                "activation_checkpointing",
                "aio",
                "data_types",
            )
            or key in NEUTRAL
        ):
            continue
        if key in ("fp16", "bf16"):
            unmodelled += [
                f"{key}.{k}" for k in (value or {}) if k != "enabled" and f"{key}.{k}" not in NEUTRAL
            ]
            continue
        unmodelled.append(key)
    if unmodelled:
        warnings.warn(
            f"{label}: not modelled, ignored: {', '.join(sorted(unmodelled))}",
            DeepSpeedConfigWarning,
            stacklevel=2,
        )
    if replaced:
        warnings.warn(f"{label}: {'; '.join(replaced)}", DeepSpeedConfigWarning, stacklevel=2)
    if gas not in (None, "auto"):
        data["_deepspeed_gradient_accumulation_steps"] = gas
    data["_deepspeed_sources"] = sources
    return data
