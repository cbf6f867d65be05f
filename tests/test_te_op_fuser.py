"""Transformer Engine's operation fuser (training.fp8.op_fuser: Megatron-Core use_transformer_engine_op_fuser,
NVIDIA's MLPerf USE_TE_OPS): the MLP's activation writes the next linear layer's quantized input, and its gradient
the previous one's quantized output gradient (TE csrc/extensions/activation.cpp): delayed scaling and MXFP8 fully
fused, current scaling and NVFP4 with the amax taken in the activation's pass. Bytes by hand per recipe."""

from __future__ import annotations

import pytest

from simulator.errors import ScenarioError
from simulator.frameworks import get_framework
from simulator.scenario.loader import load_scenario
from simulator.workload.fp8 import TE_CAST_BYTES
from simulator.workload.transformer import build_workload

TOKENS, H, F = 4096, 4096, 14336  # Llama 3 8B, one micro-batch of 4,096 tokens, TP 1


def scenario(recipe: str, topology: str, fuser: bool, **fp8):
    return load_scenario(
        {
            "name": "fuser",
            "framework": "megatron-core-2024",
            "model": {"preset": "llama3-8b", "seq_length": 4096, "num_layers": 4},
            "cluster": {"topology": topology, "num_nodes": 1},
            "training": {
                "global_batch_size": 8,
                "micro_batch_size": 1,
                "precision": "fp8",
                "fp8": {"recipe": recipe, "op_fuser": fuser, **fp8},
            },
        }
    )


def casts(s) -> dict[str, float]:
    layer = build_workload(s, get_framework(s.framework), 8, None).layer
    return {op.name: op.bytes for op in (*layer.forward, *layer.backward) if ": quantize" in op.name}


def one(found: dict[str, float], prefix: str) -> float:
    (value,) = [b for name, b in found.items() if name.startswith(prefix)]
    return value


@pytest.mark.parametrize(
    "recipe, topology, per_element",
    [
        ("delayed", "dgx-h100", 2.0),  # fully fused; Hopper's transposed copy remains (1 read + 1 written)
        ("tensorwise", "dgx-h100", TE_CAST_BYTES[("tensorwise", True)] - 2),  # the amax pass saved
        (
            "mxfp8",
            "dgx-b200",
            1 / 16,
        ),  # fully fused: the column-wise copy's byte and scales, less bf16's byte
        ("nvfp4", "dgx-b200", TE_CAST_BYTES[("nvfp4", False)] - 2),  # the amax pass saved
    ],
)
def test_the_activation_quantizes_fc2s_input_and_fc1s_output_gradient(recipe, topology, per_element):
    """fc2's input (tokens x f) forward and fc1's output gradient (tokens x 2f) backward: per element the recipe's
    fused bytes; every other cast (QKV, projection, fc1's input, the other gradients) unchanged."""
    plain, fused = casts(scenario(recipe, topology, False)), casts(scenario(recipe, topology, True))
    hopper_per_tensor = recipe in ("delayed", "tensorwise")  # Hopper keeps transposed copies of these
    weight = (
        one(plain, "mlp down projection: quantize input")
        - TOKENS * F * TE_CAST_BYTES[(recipe, hopper_per_tensor)]
    )
    assert one(fused, "mlp down projection: quantize input") == pytest.approx(
        TOKENS * F * per_element + weight
    )
    assert one(fused, "mlp up projection dgrad: quantize") == pytest.approx(TOKENS * 2 * F * per_element)
    assert one(plain, "mlp up projection dgrad: quantize") > one(fused, "mlp up projection dgrad: quantize")
    for name, nbytes in plain.items():
        if not name.startswith(("mlp down projection: quantize input", "mlp up projection dgrad")):
            assert fused[name] == nbytes, name


def test_the_fuser_is_transformer_engines():
    with pytest.raises(ScenarioError, match="training.fp8.op_fuser: .* Transformer Engine's"):
        scenario("tensorwise", "dgx-h100", True, library="torchao")


def test_read_from_and_written_to_megatron_command_lines():
    from simulator.scenario.megatron_args import merge_megatron_args
    from simulator.study.emit import low_precision_args

    data = merge_megatron_args({"name": "m"}, ["--use-transformer-engine-op-fuser"], "test")
    assert data["training"]["fp8"]["op_fuser"] is True
    args = low_precision_args({"precision": "fp8", "recipe": "mxfp8", "op_fuser": True})
    assert args[-1] == "--use-transformer-engine-op-fuser"


def test_grouped_experts_take_it_across_the_host_loop_of_their_gemms():
    """An MoE layer's experts: Transformer Engine's grouped GEMM launches its cuBLAS GEMMs from a host loop between
    the activation and fc2 (no kernel of its own): fc2's input is still the activation's quantized output."""
    s = load_scenario(
        {
            "name": "moe",
            "framework": "megatron-core-2024",
            "model": {"preset": "mixtral-8x7b", "seq_length": 4096, "num_layers": 2},
            "cluster": {"topology": "dgx-b200", "num_nodes": 1},
            "training": {
                "global_batch_size": 8,
                "micro_batch_size": 1,
                "precision": "fp8",
                "fp8": {"recipe": "mxfp8", "op_fuser": True},
            },
            "parallelism": {"expert_parallel": 8, "moe": {"dispatcher": "alltoall", "grouped_gemm": True}},
        }
    )
    found = casts(s)
    fc2 = one(found, "experts fc2: quantize input")
    plain = one(casts(s.model_copy(update={"training": s.training.model_copy(update={
        "fp8": s.training.fp8.model_copy(update={"op_fuser": False})})})), "experts fc2: quantize input")  # fmt: skip
    layer = build_workload(s, get_framework(s.framework), 8, None).layer
    gemm = next(op for op in layer.forward if op.name == "experts fc2")
    elements = gemm.batch * gemm.m * gemm.k  # fc2's input: its rows x the expert's width
    # MXFP8 fully fused: 1/16 byte per element instead of the cast's 4 + 1/16 (the weight's share unchanged)
    assert plain - fc2 == pytest.approx(elements * (TE_CAST_BYTES[("mxfp8", False)] - 1 / 16))
