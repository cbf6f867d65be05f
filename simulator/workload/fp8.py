"""FP8 (and NVFP4) training as Transformer Engine and torchao run it: which GEMMs are quantized, the kernels that
quantize their operands, the reductions of the scaling factors, and the bytes it changes.

Sources, by version (docs/fp8.md has the reading notes):
  * Transformer Engine v2.18 (NVIDIA/TransformerEngine @27486e03): pytorch/module/linear.py, layernorm_linear.py,
    base.py (quantize_weight, grad_output_preprocess), pytorch/quantization.py (reduce_and_update_fp8_tensors),
    pytorch/csrc/quantizer.cpp, common/transpose/cast_transpose.cu, common/cast/dispatch/quantize.cuh,
    common/transformer_engine.cpp (nvte_is_non_tn_fp8_gemm_supported: Hopper FP8 GEMMs are TN-only).
  * Megatron-Core core_v0.19.0: transformer/transformer_block.py (one fp8 context around the whole block for the
    delayed recipe, per layer otherwise), fp8_utils.py, parallel_state.get_amax_reduction_group (TP x DP x CP),
    models/gpt/gpt_model.py (the output layer is a plain ColumnParallelLinear: bf16).
  * torchao v0.18.0: float8/float8_linear.py (saves bf16 inputs, casts in backward again), float8/fsdp_utils.py
    (FSDP2 float8 all-gather), testing/training/roofline_utils.py (the bytes each cast moves).

Every linear layer's three GEMMs (forward, dgrad, wgrad) run in FP8 (Transformer Engine: "4 Fprop + 4 Dgrad +
4 Wgrad" per dense layer); attention's batched GEMMs, the router, the output layer and the embedding stay bf16.
Before each FP8 GEMM its operands are quantized by a memory-bound kernel: the input X in forward and the output
gradient dY in backward once per micro-batch, the weight once per step (Transformer Engine caches it from the
first micro-batch: ``is_first_microbatch``; the simulation charges each micro-batch 1/m of it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.errors import ScenarioError
from simulator.hardware.gpus import GPU
from simulator.scenario.schema import Scenario
from simulator.workload.block import Block
from simulator.workload.ops import Op, collective_op, memory_op

# Per element of the bf16 tensor: bf16 read (2) + FP8 writes (1 per copy) + scales (TE v2.18 kernels above):
#   per-tensor, Hopper: cast_transpose writes a row-wise and a transposed copy (the GEMM is TN-only): 2 + 1 + 1
#   per-tensor, Blackwell: one copy serves both layouts: 2 + 1
#   current scaling (tensorwise) first reads the tensor for its amax (nvte_compute_amax): + 2
#   MXFP8 / FP8 blocks: row- and column-wise copies quantized from bf16 in one kernel, scales 1/32 (E8M0) or 4/128
#   NVFP4: an amax + Hadamard pass (2), then 0.5 + 0.5 bytes of data and 1/16 of E4M3 scales per copy
TE_CAST_BYTES = {
    ("delayed", True): 4.0,
    ("delayed", False): 3.0,
    ("tensorwise", True): 6.0,
    ("tensorwise", False): 5.0,
    ("mxfp8", False): 2 + 1 + 1 + 2 / 32,
    ("blockwise", True): 2 + 1 + 1 + 2 * 4 / 128,
    ("blockwise", False): 2 + 1 + 1 + 2 / 32,  # emulated with MXFP8 on Blackwell (TE docs)
    ("nvfp4", False): 2 + 2 + 0.5 + 0.5 + 2 / 16,
}
# torchao's own accounting (roofline_utils.get_tensor_memory_traffic_ovhd_s): an activation or gradient is read
# for its amax (2), read again and written row- and column-major (2 + 1 + 1); a weight is cast twice (2 + 3 + 3)
TORCHAO_CAST_BYTES = {"input": 6.0, "grad": 6.0, "weight": 8.0}

# Extra bytes per linear-layer parameter that the cached quantized weight keeps beside the bf16 one (TE
# module/base.py quantize_weight, _fp8_workspaces): FP8 data and, on Hopper, its transpose; MX / block formats a
# row- and a column-wise copy with their scales; NVFP4 half a byte each with 16x16-block scales.
TE_WEIGHT_COPY_BYTES = {
    ("delayed", True): 2.0,
    ("delayed", False): 1.0,
    ("tensorwise", True): 2.0,
    ("tensorwise", False): 1.0,
    ("mxfp8", False): 2 + 2 / 32,
    ("blockwise", True): 2.0,
    ("blockwise", False): 2 + 2 / 32,
    ("nvfp4", False): 1 + 2 / 16,
}

# GEMM rate of a recipe relative to per-tensor FP8 on the same GPU, from Transformer Engine's own measurements
# (docs/examples/gemm_profiling/gemm_profiling.rst, v2.18; 5B model, hidden 4096, 15,872 tokens, 12 GEMMs a layer):
#   blockwise on Hopper (software-scaled, split accumulation): H200 autocast 18.978 ms (delayed) / 22.882 (block)
#   MXFP8 on Blackwell: B300 pre-quantized 6.812 ms (current scaling) / 7.161 (MXFP8)
NORM_KERNELS = ("layernorm", "rmsnorm")
ACTIVATION_KERNELS = ("swiglu", "gelu", "relu", "squared_relu")

RECIPE_GEMM_SCALE = {("blockwise", True): 18.978 / 22.882, ("mxfp8", False): 6.812 / 7.161}
# NVFP4 GEMMs at TE's measured rate over per-tensor FP8 (the same B300 benchmark, pre-quantized: 6.812 ms FP8 current
# scaling / 3.764 ms NVFP4 a layer, 1.81x), where the part's FP4 peak allows it. B300's FP4 peak is 3x its FP8, yet its
# NVFP4 GEMMs reach 1.81x: what limits them is not the FP4 tensor cores, which B200 shares with it in all but their
# rate (the same 148 SMs, memory and clocks), so B200 and GB200 (FP4 peak 2x FP8) are taken at 1.81x as well.
NVFP4_OVER_FP8 = 6.812 / 3.764


@dataclass(frozen=True)
class Fp8Plan:
    """How one run quantizes: the recipe and library the scenario resolved to, on its GPU."""

    recipe: str  # delayed | tensorwise | mxfp8 | blockwise | nvfp4
    library: str  # transformer-engine | torchao
    transposes: bool  # TN-only FP8 GEMMs (Hopper): per-tensor formats keep transposed copies
    param_gather: bool  # weights kept and all-gathered quantized
    microbatches: int  # per step: the cached weight's cast is spread over them
    fp4_over_fp8_peak: float = 2.0  # the GPU's dense FP4 peak over its FP8 peak
    attention: bool = False  # the fused attention in FP8 too (TE fp8_dpa)
    op_fuser: bool = False  # TE's operation fuser: the activation writes the next GEMM's quantized operand

    @property
    def gemm_dtype(self) -> str:
        return "fp4" if self.recipe == "nvfp4" else "fp8"

    @property
    def te(self) -> bool:
        return self.library == "transformer-engine"

    @property
    def _key(self) -> tuple[str, bool]:
        return self.recipe, self.transposes and self.recipe in ("delayed", "tensorwise", "blockwise")

    def cast_bytes(self, tensor: str) -> float:
        """HBM bytes per element to quantize one ``tensor`` (input | grad | weight) for its GEMMs."""
        if not self.te:
            return TORCHAO_CAST_BYTES[tensor]
        return TE_CAST_BYTES[self._key]

    @property
    def norm_fused_cast_bytes(self) -> float:
        """Bytes per element to quantize the input of a linear layer right after a norm (Transformer Engine's
        LayerNormLinear, which Megatron-Core's QKV and MLP-up layers are): with delayed scaling the norm writes FP8
        itself (normalization.cpp FULLY_FUSED for Float8Quantizer) and only Hopper's transpose remains (1 read +
        1 written: ln_api.cpp nvte_transpose); with current scaling the norm also takes the amax
        (FUSED_NORM_AMAX_FP8), saving the amax pass; block formats quantize separately (UNFUSED without cuDNN)."""
        if not self.te:
            return self.cast_bytes("input")
        if self.recipe == "delayed":
            return 2.0 if self.transposes else 0.0
        if self.recipe == "tensorwise":
            return self.cast_bytes("input") - 2.0
        return self.cast_bytes("input")

    @property
    def activation_fused_cast_bytes(self) -> float:
        """Bytes per element to quantize a linear layer's operand that an activation (or its gradient) wrote, where
        Transformer Engine's operation fuser hands the activation that layer's quantizer (te.ops SwiGLU / GELU;
        csrc/extensions/activation.cpp, TE d0067d0d): delayed scaling and MXFP8 are FULLY_FUSED (the activation
        writes the quantized copies: beyond the bf16 output it replaces, only Hopper's transpose or MXFP8's
        column-wise copy and scales remain); current scaling and NVFP4 take the amax in the activation's pass
        (FUSED_ACTIVATION_AMAX_*), saving the amax read. (NVFP4 with the Hadamard transform's post-RHT amax stays
        unfused; this model's NVFP4 costs none of the transform.)"""
        if not (self.te and self.op_fuser):
            return self.cast_bytes("input")
        if self.recipe == "delayed":
            return 2.0 if self.transposes else 0.0
        if self.recipe == "mxfp8":
            return 1 + 2 / 32 - 1.0  # the column-wise copy and scales, less the bf16 byte not written
        return self.cast_bytes("input") - 2.0

    @property
    def prequantized_cast_bytes(self) -> float:
        """Bytes per element to quantize an operand that a fused epilogue wrote (Transformer Engine's fused grouped
        MLP, ops/fused/grouped_mlp.py, TE d0067d0d): MXFP8 epilogues write the row- and column-wise copies
        themselves (their bytes are the GEMM's, ``Op.epilogue_bytes``), so none; NVFP4's write bf16, which
        ``group_quantize`` then casts with its Hadamard transform: the whole cast."""
        return 0.0 if self.recipe == "mxfp8" else self.cast_bytes("input")

    @property
    def gemm_scale(self) -> float:
        """This recipe's GEMM rate relative to its type's peak at per-tensor FP8's efficiency (block-scaled kernels;
        NVFP4: ``NVFP4_OVER_FP8`` times per-tensor FP8's rate, at most the FP4 peak)."""
        if self.recipe == "nvfp4":
            return min(1.0, NVFP4_OVER_FP8 / self.fp4_over_fp8_peak)
        return RECIPE_GEMM_SCALE.get(self._key, 1.0)

    @property
    def weight_copy_bytes(self) -> float:
        """Bytes per linear-layer parameter kept beside the bf16 weight: Transformer Engine's cached quantized copy;
        with ``param_gather`` the quantized weight replaces the bf16 one (Megatron --fp8-param-gather; can be
        negative). torchao casts every time and keeps nothing."""
        if not self.te:
            return 0.0
        copy = TE_WEIGHT_COPY_BYTES[self._key]
        return copy - 2.0 if self.param_gather else copy

    @property
    def gather_bytes(self) -> float:
        """Bytes per linear-layer parameter a quantized parameter all-gather moves (MXFP8 gathers the high-precision
        grad buffer instead: Megatron's --reuse-grad-buf-for-mxfp8-param-ag; distrib_optimizer.py, core_v0.19.0)."""
        if self.recipe == "mxfp8" and self.te:
            return 2.0
        return 0.5 if self.recipe == "nvfp4" else 1.0


def saved_input_bytes(recipe: str, library: str) -> float:
    """Bytes per element of a linear layer's input kept for its wgrad: Transformer Engine saves the quantized
    column-wise copy (linear.py: update_usage(rowwise_usage=False)); torchao keeps the bf16 input
    (float8_linear.py saves input_hp)."""
    if library == "torchao":
        return 2.0
    return 0.5 + 1 / 16 if recipe == "nvfp4" else 1.0


def fp8_plan(s: Scenario, gpu: GPU) -> Fp8Plan | None:
    """The resolved FP8 settings of ``s`` on ``gpu`` (None unless ``training.precision`` is fp8)."""
    tr, p = s.training, s.parallelism
    if tr.precision != "fp8":
        return None
    micro = tr.global_batch_size // (tr.micro_batch_size * (p.data_parallel or 1))
    fp8, fp4 = gpu.peak_tflops.get("fp8"), gpu.peak_tflops.get("fp4")
    ratio = fp4 / fp8 if fp4 and fp8 else 1.0
    if tr.fp8.attention and gpu.flash_attention_fp8 is None:
        raise ScenarioError(
            f"training.fp8.attention: {gpu.name} has no measured FP8 attention rate (flash_attention_fp8 in its GPU "
            "file); the simulation would have to guess it"
        )
    return Fp8Plan(
        tr.fp8.recipe,
        tr.fp8.library,
        not gpu.fp8_any_layout,
        tr.fp8.param_gather,
        max(micro, 1),
        ratio,
        tr.fp8.attention,
        tr.fp8.op_fuser,
    )


def quantized(ops: tuple[Op, ...], plan: Fp8Plan, tp_amax: bool) -> tuple[Op, ...]:
    """``ops`` with every linear GEMM in the plan's format, each preceded by the kernel that quantizes the operand
    that changes each micro-batch (X before the forward GEMM, dY before dgrad; wgrad reuses both), sequence
    parallelism's all-gathers of those operands in FP8 (1 byte per element: TE supports_only_rowwise_all_gather),
    and with current scaling (``tp_amax``) a 4-byte TP max-reduction of the amax before each such all-gather."""
    out: list[Op] = []
    dtype = plan.gemm_dtype
    after_norm = False  # the last kernel was a LayerNorm / RMSNorm (collectives between them do not count)
    after_act = False  # the last kernel was an MLP's activation or its gradient (the operation fuser's)
    for op in ops:
        if op.kind == "collective" and op.group == "tp" and op.collective == "all_gather":
            if tp_amax:
                out.append(collective_op("fp8 amax all-reduce (tp)", "all_reduce", "tp", 4, "", op.direction))
            out.append(replace(op, bytes=op.bytes / 2))
            continue
        if op.kind == "flash_attention" and plan.attention:  # cuDNN's FP8 kernel (TE fp8_dpa)
            out.append(replace(op, dtype="fp8"))
            continue
        if op.kind != "gemm" or not op.linear:
            out.append(op)
            if op.kind not in ("collective", "host", "sync"):  # host work issues no kernel between them
                after_norm = op.kernel in NORM_KERNELS
                after_act = op.kernel in ACTIVATION_KERNELS
            continue
        fused = after_norm and op.direction == "forward"
        by_act = after_act and plan.op_fuser
        after_norm = after_act = False
        rows, inner, cols = op.m, op.k, op.n  # this GEMM: [rows x inner] x [inner x cols]
        backward = op.direction == "backward"
        if not op.name.endswith("wgrad"):
            tensor = "grad" if backward else "input"
            # X (forward) or dY (dgrad) as this GEMM's left operand; a grouped GEMM's ``batch`` local experts each
            # quantize their own rows and their own weight (TE GroupedLinear casts every GEMM's operands)
            experts = op.batch
            elements = experts * rows * inner
            per = (
                plan.prequantized_cast_bytes
                if op.prequantized
                else plan.activation_fused_cast_bytes
                if by_act
                else plan.norm_fused_cast_bytes
                if fused
                else plan.cast_bytes(tensor)
            )
            nbytes = elements * per
            what = "output gradient" if backward else "input"
            if not backward:  # the weight: once per step for the cache (TE), every micro-batch for torchao
                share = 1.0 / plan.microbatches if plan.te else 1.0
                if not (plan.te and plan.param_gather):  # quantized primaries: nothing to cast
                    nbytes += experts * inner * cols * plan.cast_bytes("weight") * share
                    what += " and weight"
            # no table kind: Transformer Engine's fused cast kernels are not what PyTorch's casts would time
            # an operand a fused epilogue wrote quantized, with no weight to cast: no kernel at all
            if nbytes or not op.prequantized:
                name = f"{op.name}: quantize {what} ({plan.recipe})"
                out.append(memory_op(name, nbytes, "", rows, inner, op.direction))
        low = 0.5 if dtype == "fp4" else 1.0
        gemm_bytes = op.batch * (low * (op.m * op.k + op.k * op.n) + 2 * op.m * op.n) + op.epilogue_bytes
        out.append(replace(op, dtype=dtype, bytes=gemm_bytes))
    return tuple(out)


def quantize_block(block: Block, plan: Fp8Plan, s: Scenario) -> Block:
    """A transformer layer's block with its linear layers in FP8 (forward, backward and the recomputed forward)."""
    tp_amax = (
        plan.recipe == "tensorwise" and s.parallelism.sequence_parallel and s.parallelism.tensor_parallel > 1
    )
    return block.map_ops(lambda ops: quantized(ops, plan, tp_amax))


def is_quantized(block: Block) -> bool:
    """Does ``block`` run its linear layers in a low-precision format?"""
    return any(op.dtype for op in block.forward)


def amax_reductions(plan: Fp8Plan, linears_per_chunk: int) -> tuple[Op, ...]:
    """The delayed recipe's per-micro-batch work (TE quantization.py reduce_and_update_fp8_tensors): at the
    autocast's exit one max all-reduce of every forward amax (3 per linear: input, weight, output) over TP x DP x
    CP and one fused history / scale update kernel; in the backward of the first module the same for the 2 backward
    amaxes per linear. Megatron-Core wraps each model chunk's block in one autocast (transformer_block.py)."""
    if plan.recipe != "delayed" or not plan.te:
        return ()
    group = "tp+dp+cp"
    out = []
    for direction, per_linear in (("forward", 3), ("backward", 2)):
        floats = per_linear * linears_per_chunk
        out.append(collective_op(f"fp8 amax all-reduce ({direction})", "all_reduce", group, 4 * floats))
        out.append(memory_op(f"fp8 amax and scale update ({direction})", 3 * 4 * floats))
    return tuple(out)
