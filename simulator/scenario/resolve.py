"""The scenario against the hardware it names: the checks that need the topology and the GPU (GPU count, the
data-parallel degree derived from it, batch arithmetic, NVLink, FlashAttention), and the defaults that depend on
them (the framework profile and attention kernel of ``auto``). ``loader.py`` calls it last."""

from __future__ import annotations

from simulator.errors import ScenarioError
from simulator.frameworks import AUTO, default_framework, get_framework
from simulator.hardware.gpus import GPU, get_gpu
from simulator.hardware.topology import cluster_spec
from simulator.scenario.schema import FLEX_DISPATCHERS, MAX_GPUS, MAX_MICROBATCHES, Scenario

# deepseek-ai/DeepEP README: Ampere (SM80), Hopper (SM90) and later NVIDIA parts; no ROCm build
DEEPEP_ARCHITECTURES = ("ampere", "hopper", "blackwell")


def resolve_cluster_degrees(scenario: Scenario) -> Scenario:
    """Derive data_parallel from the GPU count, or check the product of all degrees against it."""
    spec = cluster_spec(scenario)
    gpu = get_gpu(spec.node.gpu)
    if spec.node.intra_node == "nvswitch" and not (
        spec.node.nvlink_bandwidth_GBps or gpu.nvlink_bandwidth_GBps
    ):
        raise ScenarioError(
            f"cluster.gpu: {gpu.name} has no NVLink, but a '{spec.name}' node connects its GPUs by NVSwitch; "
            "use a topology with intra_node: pcie (e.g. pcie-8gpu)"
        )
    moe = scenario.parallelism.moe
    if (
        scenario.model.moe is not None
        and moe.dispatcher in FLEX_DISPATCHERS
        and gpu.architecture not in DEEPEP_ARCHITECTURES
    ):
        raise ScenarioError(
            f"parallelism.moe.dispatcher deepep: DeepEP's kernels run on NVIDIA SM80 and SM90 and later (its "
            f"README), not on {gpu.name} ({gpu.architecture}); use alltoall"
        )
    if scenario.training.precision == "fp8":
        scenario = resolve_fp8(scenario, gpu)
    check_fused_grouped_mlp(scenario, gpu)
    gpu.peak_flops(scenario.training.precision)  # errors if the GPU lacks this precision
    if scenario.framework == AUTO:
        scenario = scenario.model_copy(update={"framework": default_framework(scenario, gpu.architecture)})
    framework = get_framework(scenario.framework)  # errors on an unknown name
    flash = gpu.flash_attention_efficiency is not None
    if scenario.model.attention == "flash" and not flash:
        raise ScenarioError(
            f"model.attention: flash does not run on {gpu.name} (FlashAttention needs Turing / Ampere or newer); "
            "use attention: standard (or auto)"
        )
    # attention sinks: Transformer Engine runs them in cuDNN's fused attention (v2.14 dot_product_attention/utils.py
    # turns FlashAttention off for softmax_type learnable); FlashAttention-2 and MPT's Triton kernel have none
    sinkless = scenario.model.attention_sinks and framework.attention_kernel != "fused"
    if scenario.model.attention == "flash" and sinkless:
        raise ScenarioError(
            f"model.attention_sinks: the {framework.name} profile's attention kernel ({framework.attention_kernel}) "
            "has no attention sinks; use attention: standard (or auto: the unfused layer, as Hugging Face runs "
            "GPT-OSS), or a stack with cuDNN's fused attention (Megatron-Core)"
        )
    if scenario.model.attention == "auto":
        attention = framework.attention if flash and not sinkless else "standard"
        if attention == "standard" and scenario.parallelism.context_parallel > 1:
            raise ScenarioError(
                f"parallelism.context_parallel ({scenario.parallelism.context_parallel}) needs FlashAttention, "
                f"which does not run on {gpu.name}"
            )
        model = scenario.model.model_copy(update={"attention": attention})
        scenario = scenario.model_copy(update={"model": model})
    n_gpus = spec.node.gpus * scenario.cluster.num_nodes
    p = scenario.parallelism
    names = ["tensor_parallel", "pipeline_parallel", "context_parallel"]
    degrees = [p.tensor_parallel, p.pipeline_parallel, p.context_parallel]
    shown = list(zip(names, degrees, strict=True))
    model_parallel = p.tensor_parallel * p.pipeline_parallel * p.context_parallel
    gpu_text = f"{n_gpus} GPUs ({scenario.cluster.num_nodes} nodes x {spec.node.gpus})"
    if p.data_parallel is None:
        if n_gpus % model_parallel:
            prod = " x ".join(f"{n}({d})" for n, d in shown)
            raise ScenarioError(
                f"parallelism: {prod} = {model_parallel} does not divide the cluster's {gpu_text}"
            )
        dp, derived = n_gpus // model_parallel, f" (data_parallel derived from {gpu_text})"
    elif model_parallel * p.data_parallel != n_gpus:
        prod = " x ".join(f"{n}({d})" for n, d in [*shown, ("data_parallel", p.data_parallel)])
        raise ScenarioError(
            f"parallelism: {prod} = {model_parallel * p.data_parallel}, but the cluster has {gpu_text}"
        )
    else:
        dp, derived = p.data_parallel, ""
    t = scenario.training
    if n_gpus > MAX_GPUS:
        raise ScenarioError(
            f"cluster: {gpu_text} exceeds the simulator's limit of {MAX_GPUS:,} GPUs per scenario"
        )
    if t.global_batch_size % (t.micro_batch_size * dp):
        raise ScenarioError(
            f"training.global_batch_size ({t.global_batch_size}) is not divisible by micro_batch_size "
            f"({t.micro_batch_size}) x data_parallel ({dp}) = {t.micro_batch_size * dp}{derived}"
        )
    micro = t.global_batch_size // (t.micro_batch_size * dp)
    arithmetic = (
        f"global_batch_size ({t.global_batch_size}) / (micro_batch_size ({t.micro_batch_size}) x data_parallel "
        f"({dp})) = {micro:,} micro-batches per iteration"
    )
    if micro > MAX_MICROBATCHES:
        raise ScenarioError(
            f"training: {arithmetic}; the simulator replays each one and its limit is {MAX_MICROBATCHES:,}"
        )
    # the stage-step limit (MAX_STAGE_MICROBATCHES) applies where every micro-batch is replayed: api.simulate
    expert = p.etp * p.expert_parallel
    if scenario.model.moe is not None and (p.tensor_parallel * p.context_parallel * dp) % expert:
        raise ScenarioError(
            f"parallelism: expert_tensor_parallel ({p.etp}) x expert_parallel ({p.expert_parallel}) = {expert} does "
            f"not divide tensor_parallel ({p.tensor_parallel}) x context_parallel ({p.context_parallel}) x "
            f"data_parallel ({dp}) = {p.tensor_parallel * p.context_parallel * dp}, the ranks of a pipeline stage it "
            f"folds over{derived}"
        )
    hs = p.fsdp.hybrid_shard_size if p.fsdp else None
    if hs and dp % hs:
        raise ScenarioError(
            f"parallelism.fsdp.hybrid_shard_size ({hs}) does not divide data_parallel ({dp}){derived}"
        )
    if p.data_parallel is None:
        return scenario.model_copy(update={"parallelism": p.model_copy(update={"data_parallel": dp})})
    return scenario


def resolve_fp8(scenario: Scenario, gpu: GPU) -> Scenario:
    """``training.fp8`` with its ``auto`` choices made for ``gpu`` (Transformer Engine v2.18
    get_default_fp8_recipe: MXFP8 on Blackwell, delayed scaling before; torchao Float8Linear with FSDP) and
    checked against what the GPU and the library run (TE quantization.py: FP8 needs SM 8.9+, MXFP8 and NVFP4
    SM 10.0+)."""
    tr, p = scenario.training, scenario.parallelism
    if not gpu.has_fp8:
        raise ScenarioError(
            f"training.precision: fp8 needs FP8 tensor cores; {gpu.name} ({gpu.architecture}) has none "
            "(Hopper, Blackwell and MI300 do); use bf16"
        )
    cfg = tr.fp8
    library = cfg.library
    if library == "auto":
        library = "torchao" if p.fsdp is not None else "transformer-engine"
    recipe = cfg.recipe
    if recipe == "auto":
        recipe = (
            "tensorwise" if library == "torchao" else ("mxfp8" if gpu.block_scaled_formats else "delayed")
        )
    if recipe in ("mxfp8", "nvfp4") and not gpu.block_scaled_formats:
        raise ScenarioError(
            f"training.fp8.recipe: {recipe} needs block-scaled tensor cores (Blackwell); {gpu.name} is "
            f"{gpu.architecture}: use delayed, tensorwise or blockwise"
        )
    if recipe == "nvfp4" and "fp4" not in gpu.peak_tflops:
        raise ScenarioError(f"training.fp8.recipe: nvfp4 needs an fp4 peak in the GPU file of {gpu.name}")
    if library == "torchao" and recipe not in ("tensorwise", "mxfp8"):
        raise ScenarioError(
            f"training.fp8.recipe: {recipe} is a Transformer Engine recipe; torchao's Float8Linear runs "
            "tensorwise (and mxfp8 on Blackwell)"
        )
    if cfg.op_fuser and library != "transformer-engine":
        raise ScenarioError(
            "training.fp8.op_fuser: the operation fuser is Transformer Engine's (te.ops); this run casts with "
            f"{library} (training.fp8.library)"
        )
    if cfg.bf16_layers and recipe == "delayed":
        raise ScenarioError(
            "training.fp8.bf16_layers: the delayed recipe (the default on Hopper) keeps no layers in bf16 "
            "(Megatron-Core: 'Delayed scaling does not support first / last layer in BF16'); set recipe: tensorwise"
        )
    if 2 * cfg.bf16_layers > scenario.model.num_layers:
        raise ScenarioError(
            f"training.fp8.bf16_layers: 2 x {cfg.bf16_layers} exceeds the model's {scenario.model.num_layers} layers"
        )
    if cfg.param_gather and p.zero_stage == 0 and p.fsdp is None:
        raise ScenarioError(
            "training.fp8.param_gather: weights are all-gathered only when they are sharded: it needs the "
            "distributed optimizer / ZeRO (parallelism.zero_stage >= 1) or FSDP (Megatron: --fp8-param-gather "
            "requires --use-distributed-optimizer)"
        )
    fp8 = cfg.model_copy(update={"recipe": recipe, "library": library})
    return scenario.model_copy(update={"training": tr.model_copy(update={"fp8": fp8})})


def check_fused_grouped_mlp(scenario: Scenario, gpu: GPU) -> None:
    """Where Transformer Engine's fused grouped MLP runs (workload/fused_grouped_mlp.py): Megatron-Core's grouped
    experts without expert tensor parallelism (experts.py l.397-413, Megatron-LM d98e8a64), a gated SwiGLU or
    quick-GeGLU (l.418-436), cuDNN's CuTe DSL kernels on compute capability 10.x with MXFP8 or NVFP4, hidden and
    expert sizes multiples of 64 (TE d0067d0d ops/fused/grouped_mlp.py l.783-813, l.842-846, l.944-959), and no
    recomputation of the fused activation (TE ops/basic/swiglu.py l.473-477 refuses it)."""
    p, m, tr = scenario.parallelism, scenario.model, scenario.training
    if not p.moe.fused_grouped_mlp:
        return
    field = "parallelism.moe.fused_grouped_mlp"
    if m.moe is None or p.moe.dispatcher == "deepspeed":
        raise ScenarioError(
            f"{field}: Megatron-Core's MoE experts run it; this model has none (model.moe) or runs "
            "DeepSpeed-MoE's dispatcher"
        )
    if not p.moe.grouped_gemm or p.etp != 1:
        raise ScenarioError(
            f"{field} runs the local experts as grouped GEMMs without expert tensor parallelism: it needs "
            f"parallelism.moe.grouped_gemm true and expert_tensor_parallel 1 (got {p.moe.grouped_gemm}, {p.etp})"
        )
    recipe = tr.fp8.recipe if tr.precision == "fp8" else tr.precision
    if recipe not in ("mxfp8", "nvfp4") or tr.fp8.library != "transformer-engine":
        raise ScenarioError(
            f"{field}: Transformer Engine fuses only MXFP8 and NVFP4 experts (BF16 and per-tensor FP8 are never "
            f"fused): set training.precision fp8 with training.fp8.recipe mxfp8 or nvfp4 (got {recipe})"
        )
    if gpu.architecture != "blackwell":
        raise ScenarioError(
            f"{field}: cuDNN's fused grouped MLP kernels run on Blackwell (compute capability 10.x) only; "
            f"{gpu.name} is {gpu.architecture}"
        )
    if not m.gated or m.activation not in ("swiglu", "quick-geglu"):
        raise ScenarioError(
            f"{field} fuses a gated SwiGLU or quick-GeGLU (TE ScaledSwiGLU / ScaledClampedQGeGLU); model.activation "
            f"is {m.activation}{'' if m.gated else ', not gated'}"
        )
    if tr.activation_recompute == "selective" and "moe_act" in tr.recompute.modules:
        raise ScenarioError(
            f"{field}: Transformer Engine refuses to recompute the fused activation: remove moe_act from "
            "training.recompute.modules"
        )
    for name, size in (("model.hidden_size", m.hidden_size), ("the experts' FFN size", m.expert_ffn_size)):
        if size % 64:
            raise ScenarioError(f"{field}: {name} ({size}) must be a multiple of 64 (the kernels' tiles)")
