"""Megatron-LM launch arguments as input (``megatron_args:``): the flags of a ``pretrain_gpt.py`` command line (a
shell script or the text `plan --emit megatron` writes) fill the scenario, as ``deepspeed_config:`` and
``torchtitan_config:`` do for their stacks.

Flags and defaults are Megatron-LM's own (megatron/training/arguments.py at core_v0.15.0; every flag read here is in
its option list, tests/data/megatron-lm-core_v0.15.0-options.txt). Where a flag is absent the scenario gets
Megatron's default, not the simulator's: fp32 without --bf16 / --fp16, tied embeddings without
--untie-embeddings-and-output-weights, biases without --disable-bias-linear, GeLU without --swiglu, LayerNorm,
learned positions, the allgather dispatcher and a loop of expert GEMMs without --moe-grouped-gemm. A launcher
before the script (``torchrun --nnodes 4 --nproc_per_node 8 pretrain_gpt.py``) gives the node count. Flags that
change nothing the simulator models (learning rate, data, checkpoints, logging) are neutral; any other flag is named
in one warning, never silently dropped. A value the scenario states otherwise is an error naming both.
"""

from __future__ import annotations

import shlex
import warnings
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.scenario.files import mapping_sections, read_bytes


class MegatronArgsWarning(UserWarning):
    """Flags of a Megatron-LM command line that the simulator does not model."""


# flags whose settings the simulation cannot use (optimisation schedule, data, checkpoints, logging, init)
NEUTRAL = {
    "lr", "min-lr", "lr-decay-style", "lr-decay-iters", "lr-warmup-iters", "lr-warmup-fraction", "lr-decay-samples",
    "lr-warmup-samples", "train-iters", "train-samples", "weight-decay", "clip-grad", "adam-beta1", "adam-beta2",
    "adam-eps", "init-method-std", "attention-dropout", "hidden-dropout", "seed", "data-path", "split",
    "tokenizer-type", "tokenizer-model", "vocab-file", "merge-file", "save", "load", "save-interval",
    "eval-interval", "eval-iters", "log-interval", "tensorboard-dir", "wandb-project", "wandb-exp-name",
    "wandb-save-dir", "exit-duration-in-mins", "num-workers", "distributed-backend", "use-mcore-models",
    "transformer-impl", "max-position-embeddings", "make-vocab-size-divisible-by", "rotary-base",
    "rotary-percent", "rotary-scaling-factor", "use-rope-scaling", "no-masked-softmax-fusion", "use-flash-attn",
    "attention-backend", "log-throughput", "log-timers-to-tensorboard", "timing-log-level", "no-load-optim",
    "no-load-rng", "ckpt-format", "data-cache-path", "mock-data", "no-create-attention-mask-in-dataloader",
    "manual-gc", "manual-gc-interval", "moe-aux-loss-coeff", "moe-z-loss-coeff", "moe-router-dtype",
    "moe-router-topk-scaling-factor", "moe-router-bias-update-rate", "moe-token-drop-policy", "norm-epsilon",
    "apply-layernorm-1p", "no-position-embedding", "calculate-per-token-loss", "overlap-param-gather-with-optimizer-step",
    "accumulate-allreduce-grads-in-fp32", "attention-softmax-in-fp32",
}  # fmt: skip


def read_megatron_args(path: str | Path) -> list[str]:
    """The tokens of a Megatron-LM command line: shell words, with comments and line continuations."""
    path = Path(path)
    raw = read_bytes(path, limit=2**20)
    try:
        text = raw.decode("utf-8").replace("\\\r\n", " ").replace("\\\n", " ")  # line continuations
        return shlex.split(text, comments=True)
    except (UnicodeDecodeError, ValueError) as e:
        raise ScenarioError(f"megatron_args: {path}: not a shell command line ({e})") from None


def parse_flags(tokens: list[str]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(the script's flags, the launcher's flags) by name without dashes, each with the words after it up to the
    next flag; the script is the last ``.py`` word (none: every flag is the script's)."""
    scripts = [i for i, t in enumerate(tokens) if t.endswith(".py")]
    cut = scripts[-1] if scripts else -1
    return _flags(tokens[cut + 1 :]), _flags(tokens[: max(cut, 0)])


def _flags(tokens: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    name = None
    for t in tokens:
        if t.startswith("--"):
            name, _, value = t[2:].partition("=")
            out[name] = [value] if value else []
        elif name is not None:
            out[name].append(t)
    return out


def merge_megatron_args(data: dict, tokens: list[str], label: str = "megatron_args") -> dict:
    """The scenario dict with the command line's settings filled in, each checked against what the scenario
    already states."""
    data = mapping_sections(data, ("model", "cluster", "training", "parallelism"), label)
    flags, launcher = parse_flags(tokens)
    used: set[str] = set()

    def value(flag: str, kind=int, default=None):
        words = flags.get(flag)
        used.add(flag)
        if words is None:
            return default
        if len(words) != 1:
            raise ScenarioError(f"{label}: --{flag} takes one value, got {' '.join(words) or 'none'}")
        try:
            return kind(words[0])
        except ValueError:
            raise ScenarioError(f"{label}: --{flag} must be {kind.__name__}, got {words[0]!r:.40}") from None

    def on(flag: str) -> bool:
        used.add(flag)
        if flag in flags and flags[flag]:
            raise ScenarioError(f"{label}: --{flag} is a switch, got a value {' '.join(flags[flag])!r:.40}")
        return flag in flags

    def put(section: str, key: str, got, flag: str) -> None:
        if got is None:
            return
        where = data.setdefault(section, {})
        *outer, last = key.split(".")
        for k in outer:
            where = where.setdefault(k, {})
        if last in where and where[last] != got:
            raise ScenarioError(f"{label}: --{flag} ({got}) contradicts {section}.{key} ({where[last]})")
        where[last] = got

    # the launcher's nodes (torchrun / python -m torch.distributed.run)
    if "nnodes" in launcher and len(launcher["nnodes"]) == 1 and launcher["nnodes"][0].isdigit():
        put("cluster", "num_nodes", int(launcher["nnodes"][0]), "nnodes")

    # model
    for flag, key in (
        ("num-layers", "num_layers"), ("hidden-size", "hidden_size"), ("ffn-hidden-size", "ffn_hidden_size"),
        ("num-attention-heads", "num_attention_heads"), ("kv-channels", "kv_channels"), ("seq-length", "seq_length"),
        ("vocab-size", "vocab_size"), ("mtp-num-layers", "mtp_layers"),
    ):  # fmt: skip
        put("model", key, value(flag), flag)
    # learnable softmax offsets (TransformerConfig.softmax_type, exposed as --softmax-type; d98e8a64)
    softmax = value("softmax-type", str)
    if softmax not in (None, "vanilla", "off-by-one", "learnable"):
        raise ScenarioError(
            f"{label}: --softmax-type must be vanilla, off-by-one or learnable, got {softmax!r:.40}"
        )
    put("model", "attention_sinks", True if softmax == "learnable" else None, "softmax-type")
    if on("group-query-attention"):
        put("model", "num_query_groups", value("num-query-groups"), "num-query-groups")
    else:
        used.add("num-query-groups")
    # Megatron's defaults where the command line states the model (--num-layers); else the scenario's model
    stated = "num-layers" in flags
    act = next((a for a in ("swiglu", "quick-geglu", "squared-relu") if on(a)), "gelu" if stated else None)
    put("model", "activation", act, "swiglu")
    # a hybrid stack (megatron/training/arguments.py, d98e8a64: the pattern sets the layer count, --num-layers
    # ignored) and its Mamba mixers
    pattern = value("hybrid-layer-pattern", str) or value("hybrid-override-pattern", str)
    if pattern is not None:
        put("model", "hybrid_pattern", pattern, "hybrid-layer-pattern")
        data["model"]["num_layers"] = len(pattern)
        for flag, key in (
            ("mamba-state-dim", "state_dim"), ("mamba-head-dim", "head_dim"), ("mamba-num-groups", "num_groups"),
            ("mamba-num-heads", "num_heads"),
        ):  # fmt: skip
            put("model", f"mamba.{key}", value(flag), flag)
    used.add("is-hybrid-model")
    norm = value("normalization", str, "LayerNorm" if stated else None)
    if norm not in (None, "LayerNorm", "RMSNorm"):
        raise ScenarioError(f"{label}: --normalization must be LayerNorm or RMSNorm, got {norm!r:.40}")
    put("model", "normalization", norm and norm.lower(), "normalization")
    pos = value("position-embedding-type", str, "learned_absolute" if stated else None)
    positions = {"learned_absolute": "learned", "rope": "rope", None: None}
    if pos not in positions:
        raise ScenarioError(
            f"{label}: --position-embedding-type must be learned_absolute or rope, got {pos!r:.40}"
        )
    put("model", "position_embedding", positions[pos], "position-embedding-type")
    untied, unbiased = on("untie-embeddings-and-output-weights"), on("disable-bias-linear")
    put(
        "model",
        "tied_embeddings",
        not untied if stated or untied else None,
        "untie-embeddings-and-output-weights",
    )
    put("model", "add_bias_linear", not unbiased if stated or unbiased else None, "disable-bias-linear")
    if on("qk-layernorm"):
        put("model", "qk_layernorm", True, "qk-layernorm")
    if on("multi-latent-attention"):
        for flag, key in (
            ("q-lora-rank", "q_lora_rank"), ("kv-lora-rank", "kv_lora_rank"), ("qk-head-dim", "qk_nope_head_dim"),
            ("qk-pos-emb-head-dim", "qk_rope_head_dim"), ("v-head-dim", "v_head_dim"),
        ):  # fmt: skip
            put("model", f"mla.{key}", value(flag), flag)
    experts = value("num-experts")
    if experts:
        put("model", "moe.num_experts", experts, "num-experts")
        put("model", "moe.top_k", value("moe-router-topk", int, 2), "moe-router-topk")
        put("model", "moe.ffn_hidden_size", value("moe-ffn-hidden-size"), "moe-ffn-hidden-size")
        shared = value("moe-shared-expert-intermediate-size")
        put("model", "moe.shared_expert_ffn_hidden_size", shared, "moe-shared-expert-intermediate-size")
        put("model", "moe.layer_freq", value("moe-layer-freq"), "moe-layer-freq")
        put(
            "model",
            "moe.score_function",
            value("moe-router-score-function", str),
            "moe-router-score-function",
        )
        put("model", "moe.num_groups", value("moe-router-num-groups"), "moe-router-num-groups")
        put("model", "moe.group_topk", value("moe-router-group-topk"), "moe-router-group-topk")
        if on("moe-router-enable-expert-bias"):
            put("model", "moe.expert_bias", True, "moe-router-enable-expert-bias")
        put(
            "model",
            "moe.capacity_factor",
            value("moe-expert-capacity-factor", float),
            "moe-expert-capacity-factor",
        )
        if on("moe-pad-expert-input-to-capacity"):
            put("model", "moe.pad_to_capacity", True, "moe-pad-expert-input-to-capacity")

    # CUDA graphs (arguments.py, d98e8a64: --cuda-graph-impl none | local | transformer_engine | full_iteration, the
    # deprecated --enable-cuda-graph / --external-cuda-graph; --cuda-graph-modules, formerly --cuda-graph-scope,
    # "full" and empty meaning whole layers)
    impl = value("cuda-graph-impl", str)
    impl = impl or (
        "local" if on("enable-cuda-graph") else "transformer_engine" if on("external-cuda-graph") else None
    )
    if impl not in (None, "none", "local", "transformer_engine", "full_iteration"):
        raise ScenarioError(
            f"{label}: --cuda-graph-impl must be none, local, transformer_engine or full_iteration, got {impl!r:.40}"
        )
    scope = flags.get("cuda-graph-modules") or flags.get("cuda-graph-scope") or []
    used.update({"cuda-graph-modules", "cuda-graph-scope"})
    if impl not in (None, "none"):
        put("training", "cuda_graphs", True, "cuda-graph-impl")
        modules = (
            [] if impl == "full_iteration" else [m for m in scope if m not in ("full", "full_iteration")]
        )
        if modules:
            put("training", "cuda_graph_modules", modules, "cuda-graph-modules")

    # parallelism
    for flag, key in (
        ("tensor-model-parallel-size", "tensor_parallel"), ("pipeline-model-parallel-size", "pipeline_parallel"),
        ("context-parallel-size", "context_parallel"), ("expert-model-parallel-size", "expert_parallel"),
        ("expert-tensor-parallel-size", "expert_tensor_parallel"),
        ("decoder-first-pipeline-num-layers", "first_pipeline_stage_layers"),
        ("decoder-last-pipeline-num-layers", "last_pipeline_stage_layers"),
    ):  # fmt: skip
        put("parallelism", key, value(flag), flag)
    if on("sequence-parallel"):
        put("parallelism", "sequence_parallel", True, "sequence-parallel")
    put(
        "parallelism",
        "pipeline_layout",
        value("pipeline-model-parallel-layout", str),
        "pipeline-model-parallel-layout",
    )
    per_stage = value("num-layers-per-virtual-pipeline-stage")
    virtual = value("num-virtual-stages-per-pipeline-rank")
    if per_stage:
        layers, pp = (
            data.get("model", {}).get("num_layers"),
            data.get("parallelism", {}).get("pipeline_parallel", 1),
        )
        if not isinstance(layers, int) or layers % (pp * per_stage):
            raise ScenarioError(
                f"{label}: --num-layers-per-virtual-pipeline-stage ({per_stage}) must divide --num-layers ({layers}) "
                f"/ --pipeline-model-parallel-size ({pp})"
            )
        virtual = layers // (pp * per_stage)
    if virtual and virtual > 1:
        put("parallelism", "virtual_pipeline_stages", virtual, "num-layers-per-virtual-pipeline-stage")
    if on("use-distributed-optimizer"):
        put("parallelism", "zero_stage", 1, "use-distributed-optimizer")
    if on("use-torch-fsdp2"):
        put("parallelism", "fsdp", data.get("parallelism", {}).get("fsdp") or {}, "use-torch-fsdp2")
    for flag, key in (
        ("overlap-grad-reduce", "overlap_grad_reduce"),
        ("overlap-param-gather", "overlap_param_gather"),
    ):
        if on(flag):
            put("parallelism", f"ddp.{key}", True, flag)
    if on("tp-comm-overlap"):
        put("parallelism", "tp_comm_overlap", True, "tp-comm-overlap")
    if experts:
        dispatcher = value("moe-token-dispatcher-type", str, "allgather")
        backend = value("moe-flex-dispatcher-backend", str, "deepep")  # Megatron-LM main: deepep, hybridep
        if on("moe-enable-deepep") or dispatcher == "flex":
            dispatcher = backend
        if dispatcher not in ("allgather", "alltoall", "deepep", "hybridep"):
            raise ScenarioError(f"{label}: --moe-token-dispatcher-type must be allgather, alltoall or flex")
        put("parallelism", "moe.dispatcher", dispatcher, "moe-token-dispatcher-type")
        put("parallelism", "moe.grouped_gemm", on("moe-grouped-gemm"), "moe-grouped-gemm")
        if on("overlap-moe-expert-parallel-comm"):
            put("parallelism", "moe.overlap_a2a", True, "overlap-moe-expert-parallel-comm")
        put("parallelism", "moe.dispatcher_sms", value("moe-deepep-num-sms"), "moe-deepep-num-sms")
        # the op fuser runs a gated MLP's experts only with NVTE_CUTEDSL_FUSED_GROUPED_MLP set (experts.py l.454,
        # d98e8a64: Megatron asserts otherwise), fused where the GLU is interleaved in blocks of 32 (TE
        # ops/fused/grouped_mlp.py l.783-813)
        if on("use-transformer-engine-op-fuser") and value("moe-mlp-glu-interleave-size") == 32:
            put("parallelism", "moe.fused_grouped_mlp", True, "moe-mlp-glu-interleave-size")

    # training
    put("training", "micro_batch_size", value("micro-batch-size"), "micro-batch-size")
    put("training", "global_batch_size", value("global-batch-size"), "global-batch-size")
    fp8, fp4 = value("fp8-format", str), value("fp4-format", str)
    precision = "fp8" if fp8 or fp4 else "bf16" if on("bf16") else "fp16" if on("fp16") else "fp32"
    put("training", "precision", precision, "bf16")
    if fp4:  # NVFP4 GEMMs (--fp4-format e2m1 --fp4-recipe nvfp4): the simulator's nvfp4 recipe
        put("training", "fp8.recipe", value("fp4-recipe", str, "nvfp4"), "fp4-recipe")
    elif fp8:
        put("training", "fp8.recipe", value("fp8-recipe", str, "delayed"), "fp8-recipe")
    if on("fp8-param-gather"):
        put("training", "fp8.param_gather", True, "fp8-param-gather")
    if on("use-transformer-engine-op-fuser"):  # TransformerConfig.use_transformer_engine_op_fuser
        put("training", "fp8.op_fuser", True, "use-transformer-engine-op-fuser")
    granularity = value("recompute-granularity", str)
    if granularity:
        put("training", "activation_recompute", granularity, "recompute-granularity")
        put("training", "recompute.method", value("recompute-method", str), "recompute-method")
        put("training", "recompute.num_layers", value("recompute-num-layers"), "recompute-num-layers")
        if granularity == "selective" and flags.get("recompute-modules"):
            put("training", "recompute.modules", list(flags["recompute-modules"]), "recompute-modules")
    used.add("recompute-modules")
    if on("cross-entropy-loss-fusion"):
        put(
            "training",
            "cross_entropy_fusion",
            value("cross-entropy-fusion-impl", str, "native"),
            "cross-entropy-loss-fusion",
        )
    if on("use-precision-aware-optimizer"):
        avg, sq = value("exp-avg-dtype", str, "fp32"), value("exp-avg-sq-dtype", str, "fp32")
        if avg != sq:
            raise ScenarioError(
                f"{label}: --exp-avg-dtype ({avg}) and --exp-avg-sq-dtype ({sq}) differ: one dtype for both is modelled"
            )
        put("training", "optimizer_moments", avg, "exp-avg-dtype")
    used |= {"exp-avg-dtype", "exp-avg-sq-dtype", "cross-entropy-fusion-impl", "fp8-recipe", "bf16", "fp16"}
    put("training", "optimizer", value("optimizer", str), "optimizer")

    ignored = sorted(f"--{f}" for f in flags if f not in used and f not in NEUTRAL)
    if ignored:
        warnings.warn(
            f"{label}: not modelled, ignored: {', '.join(ignored)}", MegatronArgsWarning, stacklevel=2
        )
    return data
