"""A planned layout as the frameworks take it: Megatron-LM command-line arguments, a DeepSpeed config (with the
Megatron-DeepSpeed arguments for TP / PP), or a torchtitan TOML. Where a framework has no switch for part of the
layout, a comment line says so and names the nearest one.

Names are the frameworks' own, read from their source:
- Megatron-LM megatron/training/arguments.py (core_r0.12.0; every option written is checked against the parser of
  core_v0.15.0, tests/data/megatron-lm-core_v0.15.0-options.txt): --tensor-model-parallel-size,
  --pipeline-model-parallel-size, --num-layers-per-virtual-pipeline-stage, --context-parallel-size,
  --expert-model-parallel-size, --expert-tensor-parallel-size, --sequence-parallel, --use-distributed-optimizer,
  --use-torch-fsdp2, --recompute-granularity / --recompute-method / --recompute-num-layers, --recompute-modules,
  --tp-comm-overlap, --overlap-grad-reduce, --overlap-param-gather, --moe-token-dispatcher-type (allgather,
  alltoall, flex) with --moe-enable-deepep, --moe-grouped-gemm, and the model's --num-layers, --hidden-size,
  --ffn-hidden-size, --num-attention-heads, --group-query-attention / --num-query-groups,
  --max-position-embeddings, --vocab-size, --swiglu, --normalization RMSNorm, --position-embedding-type rope,
  --disable-bias-linear, --softmax-type learnable, --untie-embeddings-and-output-weights, --num-experts,
  --moe-router-topk, --moe-ffn-hidden-size, --moe-shared-expert-intermediate-size;
  --overlap-moe-expert-parallel-comm (core_v0.14.0).
- DeepSpeed deepspeed/runtime/config.py and zero/config.py (v0.16.4; every key written is checked against the keys
  its parser reads, tests/data/deepspeed-v0.16.4-config-keys.txt): train_batch_size,
  train_micro_batch_size_per_gpu, gradient_accumulation_steps, bf16.enabled, zero_optimization.stage.
- torchtitan torchtitan/config/job_config.py (238fa995, the last TOML-configured commit; every key written is checked
  against JobConfig's, tests/data/torchtitan-238fa995-job-config-keys.txt, and read back by
  scenario/torchtitan.py): [training] local_batch_size, global_batch_size,
  seq_len; [parallelism] data_parallel_replicate_degree, data_parallel_shard_degree, fsdp_reshard_after_forward,
  tensor_parallel_degree, pipeline_parallel_degree, pipeline_parallel_schedule (1F1B, Interleaved1F1B),
  pipeline_parallel_layers_per_stage, pipeline_parallel_microbatch_size, context_parallel_degree,
  expert_parallel_degree, enable_async_tensor_parallel; [activation_checkpoint] mode (none, selective, full);
  [compile] enable.
Overlap switches, recompute modules and torch.compile come from the planned scenario where it sets them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from simulator.study.layout import OFFLOAD, STAGES

FRAMEWORKS = ("megatron", "deepspeed", "torchtitan")


def emit_text(row: dict, framework: str) -> str:
    """The text for ``framework`` of one of plan's rows (its layout fields and runnable scenario): Megatron-LM's
    arguments (with '#' comment lines), DeepSpeed's config as JSON alone (JSON has no comments: what it cannot say
    is in ``emit_notes``), torchtitan's TOML (with '#' comments)."""
    if framework not in FRAMEWORKS:
        raise ValueError(framework)
    return {"megatron": megatron, "deepspeed": deepspeed, "torchtitan": torchtitan}[framework](row)


def emit_notes(row: dict, framework: str) -> list[str]:
    """What goes beside the emitted file rather than in it (DeepSpeed's: the Megatron-DeepSpeed arguments for TP /
    PP and what the config has no key for)."""
    return deepspeed_notes(row) if framework == "deepspeed" else []


def _common(row: dict) -> dict:
    s = row["scenario"]
    training, model = s.get("training", {}), s.get("model", {})
    batch = training.get("global_batch_size")
    gas = batch // (row["mbs"] * row["dp"]) if batch else None
    return {
        "batch": batch,
        "gas": gas,
        "seq": model.get("seq_length"),
        "layers": model.get("num_layers"),
        "precision": training.get("precision", "bf16"),
        "recipe": (training.get("fp8") or {}).get("recipe", "delayed"),
        "op_fuser": (training.get("fp8") or {}).get("op_fuser", False),
        "tp_overlap": s.get("parallelism", {}).get("tp_comm_overlap", False),
        "a2a_overlap": s.get("parallelism", {}).get("moe", {}).get("overlap_a2a", False),
        "compile": training.get("compile", False),
        "modules": training.get("recompute", {}).get("modules"),
        "act_offload": training.get("activation_offload_layers", 0),
    }


def megatron(row: dict) -> str:
    c = _common(row)
    args = [
        f"--tensor-model-parallel-size {row['tp']}",
        f"--pipeline-model-parallel-size {row['pp']}",
    ]
    notes = []
    if row.get("schedule"):  # DeepSeek's schedules: no Megatron-LM switch; the stages as 1F1B would run them
        notes.append(
            f"# {row['schedule']} is DeepSeek's schedule (deepseek-ai/DualPipe; DualPipeV also torchtitan's): Megatron-LM "
            "has no switch for it; these arguments run the layout's stages with 1F1B"
        )
        row = {**row, "v": 1, "first": 0}
    # uneven stages: Megatron asks for the virtual stages per rank (arguments.py, core_v0.15.0)
    if row.get("first"):
        args += [
            f"--decoder-first-pipeline-num-layers {row['first']}",
            f"--decoder-last-pipeline-num-layers {row['last']}",
        ]
        if row["v"] > 1:
            args.append(f"--num-virtual-stages-per-pipeline-rank {row['v']}")
    elif row["v"] > 1:
        if c["layers"]:
            args.append(f"--num-layers-per-virtual-pipeline-stage {c['layers'] // (row['pp'] * row['v'])}")
        else:
            notes.append(f"# {row['v']} virtual stages per rank: set --num-layers-per-virtual-pipeline-stage")
    if row["cp"] > 1:
        args.append(f"--context-parallel-size {row['cp']}")
    if row.get("ep", 1) > 1:
        args.append(f"--expert-model-parallel-size {row['ep']}")
    if row.get("etp", 1) > 1:
        args.append(f"--expert-tensor-parallel-size {row['etp']}")
    if row["tp"] > 1:
        args.append("--sequence-parallel")
    args += [f"--micro-batch-size {row['mbs']}"]
    if c["batch"]:
        args.append(f"--global-batch-size {c['batch']}")
    if c["seq"]:
        args.append(f"--seq-length {c['seq']}")
    args.append({"bf16": "--bf16", "fp16": "--fp16"}.get(c["precision"], "--bf16"))
    args += low_precision_args(c)
    # Megatron-Core's fused loss (language_module.py compute_language_model_loss)
    loss = row["scenario"].get("training", {}).get("cross_entropy_fusion")
    if loss in ("native", "te"):
        args += ["--cross-entropy-loss-fusion", f"--cross-entropy-fusion-impl {loss}"]
    sharding = row["sharding"]
    if sharding == "zero1":
        args.append("--use-distributed-optimizer")
    elif sharding == "fsdp":
        args.append("--use-torch-fsdp2")
    elif sharding == "hsdp":
        args.append("--use-torch-fsdp2")
        notes.append(
            f"# HSDP (shard groups of {row['shard']} ranks, {row['dp'] // row['shard']} replicas) has no Megatron-LM "
            "switch: --emit torchtitan states it; Megatron's --use-torch-fsdp2 shards over all data-parallel ranks"
        )
    elif sharding.startswith(("zero2", "zero3")):
        args.append("--use-distributed-optimizer")
        notes.append(
            f"# {sharding} is DeepSpeed's (--emit deepspeed); Megatron-LM's nearest is the distributed optimizer"
            " (ZeRO-1)"
        )
    if row["recompute"] == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    elif row["recompute"] == "selective":
        args.append("--recompute-granularity selective")
        if c["modules"]:
            args.append("--recompute-modules " + " ".join(c["modules"]))
    # a CLI option from core_v0.16.0 only (arguments.py: a positive count sets cpu_offloading)
    if c["act_offload"]:
        notes.append(
            f"# activation offloading: --cpu-offloading-num-layers {c['act_offload']} (Megatron-Core 0.16+; before, "
            "TransformerConfig.cpu_offloading_num_layers, as NeMo sets it)"
        )
    if c["tp_overlap"] in (True, "te") and row["tp"] > 1:
        args.append("--tp-comm-overlap")
    elif c["tp_overlap"] == "async":
        notes.append("# async TP is PyTorch's (torchtitan); Megatron-Core's overlap is --tp-comm-overlap")
    if c["a2a_overlap"]:
        args.append("--overlap-moe-expert-parallel-comm")
    training = row["scenario"].get("training", {})
    moments = training.get("optimizer_moments", "fp32")
    if moments != "fp32":  # Transformer Engine's precision-aware FusedAdam (arguments.py)
        args += [
            "--use-precision-aware-optimizer",
            f"--exp-avg-dtype {moments}",
            f"--exp-avg-sq-dtype {moments}",
        ]
    if training.get("activation_fp8_input_store"):
        notes.append(
            "# SwiGLU's input in FP8 is TransformerConfig.activation_func_fp8_input_store: Megatron-LM's parser has "
            "no switch for it (arguments.py lists it among the fields without one)"
        )
    model = row["scenario"].get("model", {})
    if model.get("activation_clamp") or model.get("rope_mscale", 1.0) != 1.0:
        notes.append(
            "# the activation's clamp and YaRN's attention factor are TransformerConfig fields "
            "(activation_func_clamp_value, yarn_*): Megatron-Bridge sets them from the Hugging Face config"
        )
    if model.get("activation") == "geglu":
        notes.append(
            "# GeGLU is Megatron-Core's gated_linear_unit with gelu: Megatron-LM's parser has no switch for it"
        )
    par = row["scenario"].get("parallelism", {})
    if model.get("moe"):  # Megatron's default dispatcher (allgather) is not ours
        moe = par.get("moe", {})
        dispatcher = moe.get("dispatcher", "alltoall")
        if dispatcher == "deepep":
            args += ["--moe-token-dispatcher-type flex", "--moe-enable-deepep"]
        elif dispatcher == "hybridep":  # Megatron-LM main (after core_v0.15.0): moe_flex_dispatcher_backend
            args += ["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend hybridep"]
        elif dispatcher in ("alltoall", "allgather"):
            args.append(f"--moe-token-dispatcher-type {dispatcher}")
        else:
            notes.append(f"# the {dispatcher} dispatcher is DeepSpeed-MoE's: no Megatron-LM switch")
        if moe.get("grouped_gemm", True):
            args.append("--moe-grouped-gemm")
        if moe.get("dispatcher_sms"):
            args.append(f"--moe-deepep-num-sms {moe['dispatcher_sms']}")  # core_v0.15.0's name
        if moe.get("fused_grouped_mlp"):  # experts.py l.454 (d98e8a64): the kernels need the interleaved GLU
            args += ["--use-transformer-engine-op-fuser", "--moe-mlp-glu-interleave-size 32"]
            notes.append(
                "# the fused grouped MLP also needs NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 in the environment"
            )
    ddp = par.get("ddp", {})
    if ddp.get("overlap_grad_reduce"):
        args.append("--overlap-grad-reduce")
    if ddp.get("overlap_param_gather") and sharding == "zero1":
        args.append("--overlap-param-gather")
    return "\n".join([*notes, " \\\n".join(args + megatron_model_args(model))])


def megatron_model_args(m: dict) -> list[str]:
    """The model's shape as Megatron-LM's arguments (megatron/training/arguments.py, core_r0.12.0-core_v0.15.0),
    from the planned scenario's model section (its fields that are set)."""
    args = [
        f"--{flag} {m[key]}"
        for key, flag in (
            ("num_layers", "num-layers"),
            ("hidden_size", "hidden-size"),
            ("ffn_hidden_size", "ffn-hidden-size"),
            ("num_attention_heads", "num-attention-heads"),
        )
        if m.get(key)
    ]
    groups = m.get("num_query_groups")
    if groups and groups != m.get("num_attention_heads"):
        args += ["--group-query-attention", f"--num-query-groups {groups}"]
    if m.get("seq_length"):
        args.append(f"--max-position-embeddings {m['seq_length']}")
    if m.get("vocab_size"):
        args.append(f"--vocab-size {m['vocab_size']}")
    if m.get("activation") == "swiglu":
        args.append("--swiglu")
    if m.get("activation") == "quick-geglu":
        args.append("--quick-geglu")
    if m.get("normalization") == "rmsnorm":
        args.append("--normalization RMSNorm")
    if m.get("position_embedding") == "rope":
        args.append("--position-embedding-type rope")
    if m.get("add_bias_linear") is False:
        args.append("--disable-bias-linear")
    if m.get("attention_sinks"):
        args.append("--softmax-type learnable")
    if m.get("tied_embeddings") is False:
        args.append("--untie-embeddings-and-output-weights")
    moe = m.get("moe") or {}
    if moe:
        args += [f"--num-experts {moe['num_experts']}", f"--moe-router-topk {moe.get('top_k', 2)}"]
        if moe.get("ffn_hidden_size"):
            args.append(f"--moe-ffn-hidden-size {moe['ffn_hidden_size']}")
        if moe.get("shared_expert_ffn_hidden_size"):
            args.append(f"--moe-shared-expert-intermediate-size {moe['shared_expert_ffn_hidden_size']}")
    return args


# Transformer Engine's recipes' default formats (transformer_engine/common/recipe/__init__.py, v2.x): DelayedScaling
# and Float8CurrentScaling HYBRID (E4M3 forward, E5M2 gradients), MXFP8BlockScaling and Float8BlockScaling E4M3
FP8_FORMATS = {"delayed": "hybrid", "tensorwise": "hybrid", "mxfp8": "e4m3", "blockwise": "e4m3"}


def low_precision_args(c: dict) -> list[str]:
    """Megatron-LM's FP8 / FP4 switches for the planned precision (megatron/training/arguments.py, main 2025:
    --fp8-format {e4m3, hybrid}, --fp8-recipe {tensorwise, delayed, mxfp8, blockwise}, --fp4-format e2m1,
    --fp4-recipe nvfp4); a bf16 run has none."""
    if c["precision"] != "fp8":
        return []
    recipe = c["recipe"] if c["recipe"] != "auto" else "delayed"
    fuser = ["--use-transformer-engine-op-fuser"] if c.get("op_fuser") else []
    if recipe == "nvfp4":
        return ["--fp4-format e2m1", "--fp4-recipe nvfp4", *fuser]
    return [f"--fp8-format {FP8_FORMATS[recipe]}", f"--fp8-recipe {recipe}", *fuser]


def deepspeed(row: dict) -> str:
    c = _common(row)
    sharding = row["sharding"]
    config: dict = {
        "train_batch_size": c["batch"],
        "train_micro_batch_size_per_gpu": row["mbs"],
        "gradient_accumulation_steps": c["gas"],
        "bf16" if c["precision"] != "fp16" else "fp16": {"enabled": True},
        "zero_optimization": {"stage": STAGES[sharding]},
    }
    if sharding.endswith("-offload"):  # ZeRO-Offload: zero/offload_config.py, device and pin_memory
        config["zero_optimization"].update(OFFLOAD)
    return json.dumps(config, indent=2)


def deepspeed_notes(row: dict) -> list[str]:
    c = _common(row)
    sharding = row["sharding"]
    notes = []
    if sharding == "fsdp":
        notes.append("PyTorch FSDP's full sharding is DeepSpeed's ZeRO-3")
    elif sharding == "hsdp":
        notes.append(
            f"HSDP (shard groups of {row['shard']} ranks) has no DeepSpeed equivalent: ZeRO-3 shards over all "
            f"ranks; ZeRO++'s zero_hpz_partition_size: {row['shard']} keeps a secondary weight shard per group"
        )
    extra = [f"--tensor-model-parallel-size {row['tp']}", f"--pipeline-model-parallel-size {row['pp']}"]
    if row["recompute"] == "full":
        extra.append("--checkpoint-activations")
    if row["v"] > 1 or row["cp"] > 1 or row.get("ep", 1) > 1:
        notes.append("virtual stages, context and expert parallelism: Megatron-Core's (--emit megatron)")
    if c["precision"] == "fp8":
        notes.append(
            "FP8 is Transformer Engine's, switched on in the model code (DeepSpeed's config has no FP8 key): "
            + " ".join(low_precision_args(c))
            + " in Megatron-LM's names"
        )
    notes.append("Megatron-DeepSpeed arguments: " + " ".join(extra))
    return notes


def torchtitan(row: dict) -> str:
    c = _common(row)
    sharding, pp = row["sharding"], row["pp"]
    shard = row["dp"] if sharding.removesuffix("-offload") in ("fsdp", "zero3", "zero2") else 1
    if sharding == "hsdp":  # FSDP2 hybrid sharding: torchtitan's replicate x shard mesh
        shard = row["shard"]
    replicate = row["dp"] // shard
    lines = ["[training]"]
    if pp > 1 and c["batch"]:
        lines += [f"local_batch_size = {c['batch'] // row['dp']}"]
    else:
        lines += [f"local_batch_size = {row['mbs']}"]
    if c["batch"]:
        lines.append(f"global_batch_size = {c['batch']}")
    if c["seq"]:
        lines.append(f"seq_len = {c['seq']}")
    lines += [
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
    ]
    if sharding == "zero2":
        lines.append('fsdp_reshard_after_forward = "never"  # parameters kept whole after forward: ZeRO-2')
    if sharding == "zero1":
        lines.append(
            "# ZeRO-1 (sharded optimizer only) has no torchtitan switch: FSDP2 or DDP are the nearest"
        )
    elif sharding.endswith("-offload"):
        lines.append("# the optimizer on the host CPU (ZeRO-Offload) is DeepSpeed's here: --emit deepspeed")
    lines += [f"tensor_parallel_degree = {row['tp']}", f"pipeline_parallel_degree = {pp}"]
    if pp > 1:
        # torch.distributed.pipelining's ScheduleDualPipeV (torchtitan pipeline_parallel.py); DualPipe has none
        name = {"dualpipev": "DualPipeV"}.get(
            row.get("schedule", ""), "Interleaved1F1B" if row["v"] > 1 else "1F1B"
        )
        lines += [
            f'pipeline_parallel_schedule = "{name}"',
            f"pipeline_parallel_microbatch_size = {row['mbs']}",
        ]
        if row.get("schedule") == "dualpipe":
            lines.append(
                "# DualPipe (bidirectional) is DeepSeek's (deepseek-ai/DualPipe): torchtitan runs DualPipeV"
            )
        if row.get("first"):
            lines.append(
                f"# uneven stages ({row['first']} layers on the first, {row['last']} on the last, the rest alike "
                "between): give torchtitan this split by hand"
            )
        elif row["v"] > 1 and c["layers"]:
            lines.append(f"pipeline_parallel_layers_per_stage = {c['layers'] // (pp * row['v'])}")
    lines.append(f"context_parallel_degree = {row['cp']}")
    if row.get("ep", 1) > 1:
        lines.append(f"expert_parallel_degree = {row['ep']}")
    if c["tp_overlap"] and row["tp"] > 1:
        lines.append("enable_async_tensor_parallel = true  # takes effect with [compile] enable")
    lines += ["", "[activation_checkpoint]", f'mode = "{row["recompute"]}"']
    if c["compile"] or (c["tp_overlap"] and row["tp"] > 1):
        lines += ["", "[compile]", "enable = true"]
    return "\n".join(lines)


def write_layouts(result: dict, directory: Path) -> list[Path]:
    """Each simulated layout that fits, as a scenario file ``NN-layout.yaml`` in ``directory``, with what the
    simulation gave in a header comment; returns the paths written."""

    import yaml

    from simulator.report.output import write_atomic

    out = []
    for i, r in enumerate(result["top"], 1):
        if r["status"] != "ok" or not r.get("scenario"):
            continue
        slug = re.sub(r"[^a-z0-9]+", "-", r["layout"].lower()).strip("-")
        path = directory / f"{i:02d}-{slug}.yaml"
        head = (
            f"# clustersim plan, layout {i}: {r['layout']}\n"
            f"# simulated {r['iteration_time_s']:.3f} s per iteration, MFU {r['mfu']:.1%}, "
            f"{r['memory_gib']:.1f} GiB per GPU; run it: clustersim run {path.name}\n"
        )
        write_atomic(path, head + yaml.safe_dump(r["scenario"], sort_keys=False))
        out.append(path)
    return out
