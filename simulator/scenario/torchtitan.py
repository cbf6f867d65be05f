"""A torchtitan TOML job config as input (``torchtitan_config:``): its batch, sequence, parallelism, activation
checkpointing and compile settings fill the scenario, as ``deepspeed_config:`` does for DeepSpeed.

Keys and meanings are torchtitan's own, read from torchtitan/config/job_config.py at 238fa995 (2026-02-23, the last
commit configured by TOML; the keys are listed in tests/data/torchtitan-238fa995-job-config-keys.txt) and from how
torchtitan uses them (torchtitan/distributed/parallel_dims.py, torchtitan/train.py):

- ``[training] local_batch_size`` is one data-parallel rank's batch per step; ``global_batch_size`` (default -1:
  local x data-parallel degree) makes gradient accumulation; ``seq_len`` the sequence. Without pipelining a
  micro-batch is ``local_batch_size``; with it, ``[parallelism] pipeline_parallel_microbatch_size``.
  ``mixed_precision_param`` bfloat16 / float32, ``mixed_precision_reduce`` float32 (FSDP's fp32 gradient reduction).
- ``[parallelism]``: ``data_parallel_replicate_degree`` x ``data_parallel_shard_degree`` data-parallel ranks
  (a shard degree above 1: FSDP2, HSDP with replication; -1: every rank the other degrees leave; replication
  alone: DDP); ``fsdp_reshard_after_forward`` (default / always reshard, never keeps the gathered weights);
  ``tensor_parallel_degree`` (torchtitan's TP runs the norms sequence-parallel), ``enable_async_tensor_parallel``;
  ``pipeline_parallel_degree`` with ``pipeline_parallel_schedule`` (1F1B, Interleaved1F1B with
  ``pipeline_parallel_layers_per_stage``, GPipe); ``context_parallel_degree``; ``expert_parallel_degree``.
- ``[activation_checkpoint] mode``: none, full, selective.
- ``[compile] enable`` (``training.compile`` before 2025-08-20): torch.compile of each block.

Keys torchtitan has but the simulator does not model (logging, checkpointing, the optimizer's learning rate, ...)
are neutral; a modelled section's key that is not mapped is listed in one warning, never silently dropped. A value
the scenario states otherwise is an error naming both.
"""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.scenario.files import mapping_sections, read_bytes


class TorchtitanConfigWarning(UserWarning):
    """Keys of a torchtitan config that the simulator does not model."""


# torch.distributed.pipelining schedule names (get_schedule_class, case-insensitive) -> parallelism.pipeline_schedule
SCHEDULES = {
    "1F1B": "1f1b",
    "Interleaved1F1B": "interleaved-1f1b",
    "GPipe": "gpipe",
    "DualPipeV": "dualpipev",
}
RECOMPUTE = ("none", "full", "selective")  # activation_checkpoint.mode, training.activation_recompute alike
# sections whose keys the simulation cannot use (logging, checkpoints, data, the learning rate): not warned about
NEUTRAL_SECTIONS = {
    "job", "profiling", "metrics", "checkpoint", "lr_scheduler", "optimizer", "comm", "memory_estimation",
    "fault_tolerance", "experimental", "validation", "debug", "quantize", "float8", "mx", "model",
}  # fmt: skip
NEUTRAL_KEYS = {
    "training.dataset", "training.dataset_path", "training.steps", "training.max_norm", "training.seed",
    "training.deterministic", "training.gc_freq", "training.gc_debug", "training.enable_cpu_offload",
    "training.warmup_steps", "training.dataloader", "parallelism.disable_loss_parallel",
    "parallelism.pipeline_parallel_split_points",
    "parallelism.module_fqns_per_model_part", "parallelism.pipeline_parallel_first_stage_less_layers",
    "parallelism.pipeline_parallel_last_stage_less_layers", "parallelism.context_parallel_rotate_method",
    "parallelism.expert_tensor_parallel_degree", "activation_checkpoint.selective_ac_option",
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", "compile.components",
    "activation_checkpoint.preserve_rng_state", "activation_checkpoint.early_stop",
}  # fmt: skip


def read_torchtitan_config(path: str | Path) -> dict:
    """A torchtitan TOML job config: one clear error for a file that is not TOML or whose sections are not
    tables."""
    path = Path(path)
    raw = read_bytes(path, limit=4 * 2**20)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ScenarioError(f"torchtitan_config: {path}: not a TOML file ({e})") from None
    for name in ("training", "parallelism", "activation_checkpoint", "compile"):
        if name in data and not isinstance(data[name], dict):
            raise ScenarioError(
                f"torchtitan_config: {path}: [{name}] must be a table, got {data[name]!r:.60}"
            )
    return data


def _int(tt: dict, section: str, key: str, default: int | None, low: int = 1) -> int | None:
    value = (tt.get(section) or {}).get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ScenarioError(
            f"torchtitan_config: {section}.{key} must be a whole number >= {low}, got {value!r:.40}"
        )
    return value


def _choice(tt: dict, section: str, key: str, default, allowed) -> str | bool:
    """A string setting as ``allowed`` spells it (matched without case, as torchtitan's consumers do), or with
    ``allowed`` of booleans a boolean; one line naming it else."""
    value = (tt.get(section) or {}).get(key, default)
    kind = bool if all(isinstance(a, bool) for a in allowed) else str
    if isinstance(value, kind):
        if kind is bool:
            return value
        for a in allowed:
            if a.lower() == value.lower():
                return a
    shown = ", ".join(str(a).lower() if kind is bool else a for a in allowed)
    raise ScenarioError(f"torchtitan_config: {section}.{key} must be one of {shown}, got {value!r:.40}")


def _world(data: dict) -> int:
    """The scenario's GPU count (a shard degree of -1 takes what the other degrees leave)."""
    from simulator.hardware.topology import load_topology

    cluster = data.get("cluster") or {}
    gpn = cluster.get("gpus_per_node") or load_topology(cluster.get("topology", "dgx-h100")).node.gpus
    return int(cluster.get("num_nodes", 1)) * int(gpn)


def merge_torchtitan_config(data: dict, tt: dict, label: str = "torchtitan_config") -> dict:
    """The scenario dict with the torchtitan config's settings filled in, each checked against what the scenario
    already states."""
    data = mapping_sections(data, ("model", "training", "parallelism"), label)
    model, training = data.setdefault("model", {}), data.setdefault("training", {})
    par = data.setdefault("parallelism", {})

    def put(section: dict, where: str, key: str, value, source: str) -> None:
        if key in section and section[key] != value:
            raise ScenarioError(f"{label}: {source} ({value}) contradicts {where}.{key} ({section[key]})")
        section[key] = value

    t, p = tt.get("training") or {}, tt.get("parallelism") or {}
    tp = _int(tt, "parallelism", "tensor_parallel_degree", 1)
    pp = _int(tt, "parallelism", "pipeline_parallel_degree", 1)
    cp = _int(tt, "parallelism", "context_parallel_degree", 1)
    replicate = _int(tt, "parallelism", "data_parallel_replicate_degree", 1)
    if p.get("data_parallel_shard_degree", -1) == -1:  # the ranks the other degrees leave
        world = _world(data)
        shard, left = divmod(world, tp * pp * cp * replicate)
        if left or not shard:
            raise ScenarioError(
                f"{label}: data_parallel_shard_degree -1 takes the ranks the other degrees leave, but "
                f"{world} GPUs / (tensor {tp} x pipeline {pp} x context {cp} x replicate {replicate}) is "
                "not a whole number"
            )
    else:
        shard = _int(tt, "parallelism", "data_parallel_shard_degree", 1)
    dp = replicate * shard
    for key, value in (("tensor_parallel", tp), ("pipeline_parallel", pp), ("context_parallel", cp)):
        put(par, "parallelism", key, value, f"parallelism.{key}_degree")
    put(
        par, "parallelism", "data_parallel", dp, "data_parallel_replicate_degree x data_parallel_shard_degree"
    )
    if shard > 1:  # FSDP2 over the shard degree, replicated across the replicate degree (HSDP)
        fsdp = dict(par.get("fsdp") or {})
        if replicate > 1:
            put(fsdp, "parallelism.fsdp", "hybrid_shard_size", shard, "data_parallel_shard_degree")
        reshard = _choice(
            tt, "parallelism", "fsdp_reshard_after_forward", "default", ("default", "always", "never")
        )
        put(
            fsdp,
            "parallelism.fsdp",
            "reshard_after_forward",
            reshard != "never",
            "fsdp_reshard_after_forward",
        )
        reduce = _choice(tt, "training", "mixed_precision_reduce", "float32", ("float32", "bfloat16"))
        if reduce == "float32":
            put(fsdp, "parallelism.fsdp", "reduce_in_fp32", True, "training.mixed_precision_reduce")
        par["fsdp"] = fsdp
    if tp > 1:
        put(par, "parallelism", "sequence_parallel", True, "parallelism.tensor_parallel_degree")
        if _choice(tt, "parallelism", "enable_async_tensor_parallel", False, (True, False)):
            put(par, "parallelism", "tp_comm_overlap", "async", "parallelism.enable_async_tensor_parallel")
    ep = _int(tt, "parallelism", "expert_parallel_degree", 1)
    if ep > 1:
        put(par, "parallelism", "expert_parallel", ep, "parallelism.expert_parallel_degree")
    local = _int(tt, "training", "local_batch_size", 8)
    if pp > 1:
        schedule = SCHEDULES[
            _choice(tt, "parallelism", "pipeline_parallel_schedule", "1F1B", tuple(SCHEDULES))
        ]
        put(par, "parallelism", "pipeline_schedule", schedule, "pipeline_parallel_schedule")
        if (
            schedule == "dualpipev"
        ):  # two stages a rank in a V (ScheduleDualPipeV, torchtitan's "v" stage style)
            put(par, "parallelism", "virtual_pipeline_stages", 2, "pipeline_parallel_schedule DualPipeV")
        if schedule == "interleaved-1f1b":
            per_stage = _int(tt, "parallelism", "pipeline_parallel_layers_per_stage", None)
            layers = model.get("num_layers")
            # a preset's, where the scenario names one
            if layers is None and isinstance(model.get("preset"), str):
                from simulator.scenario.presets import model_presets

                layers = model_presets().get(model["preset"], {}).get("num_layers")
            if per_stage is None or not isinstance(layers, int) or layers % (pp * per_stage):
                raise ScenarioError(
                    f"{label}: Interleaved1F1B: give pipeline_parallel_layers_per_stage dividing the model's "
                    f"num_layers ({layers}) / pipeline_parallel_degree ({pp})"
                )
            put(par, "parallelism", "virtual_pipeline_stages", layers // (pp * per_stage), "layers_per_stage")
        micro = _int(tt, "parallelism", "pipeline_parallel_microbatch_size", 1)
    else:
        micro = local
    put(training, "training", "micro_batch_size", micro, "training.local_batch_size")
    given = t.get("global_batch_size", -1)
    given = local * dp if given == -1 else _int(tt, "training", "global_batch_size", None)
    put(training, "training", "global_batch_size", given, "training.global_batch_size")
    if "seq_len" in t:
        put(model, "model", "seq_length", _int(tt, "training", "seq_len", None), "training.seq_len")
    param = _choice(tt, "training", "mixed_precision_param", "bfloat16", ("bfloat16", "float32"))
    precision = {"bfloat16": "bf16", "float32": "fp32"}[param]
    put(training, "training", "precision", precision, "mixed_precision_param")
    mode = _choice(tt, "activation_checkpoint", "mode", "selective", RECOMPUTE)
    put(training, "training", "activation_recompute", mode, "activation_checkpoint.mode")
    old = _choice(tt, "training", "compile", False, (True, False))  # torchtitan before 2025-08-20
    compiled = _choice(tt, "compile", "enable", old, (True, False))
    put(training, "training", "compile", compiled, "compile.enable")
    mapped = {
        "training.local_batch_size", "training.global_batch_size", "training.seq_len", "training.compile",
        "training.mixed_precision_param", "training.mixed_precision_reduce", "activation_checkpoint.mode",
        "compile.enable", "parallelism.enable_async_tensor_parallel", "parallelism.pipeline_parallel_schedule",
        "parallelism.fsdp_reshard_after_forward",
        "parallelism.pipeline_parallel_layers_per_stage", "parallelism.pipeline_parallel_microbatch_size",
        *(f"parallelism.{k}_degree" for k in ("tensor_parallel", "pipeline_parallel", "context_parallel",
          "data_parallel_replicate", "data_parallel_shard", "expert_parallel")),
    }  # fmt: skip
    unmodelled = sorted(
        f"{section}.{key}"
        for section, keys in tt.items()
        if section not in NEUTRAL_SECTIONS and isinstance(keys, dict)
        for key in keys
        if f"{section}.{key}" not in mapped | NEUTRAL_KEYS
    )
    if unmodelled:
        warnings.warn(
            f"{label}: not modelled, ignored: {', '.join(unmodelled)}", TorchtitanConfigWarning, stacklevel=2
        )
    return data
