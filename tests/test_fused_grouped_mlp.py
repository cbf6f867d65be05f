"""Megatron-Core's experts on Transformer Engine's fused grouped MLP (parallelism.moe.fused_grouped_mlp; Megatron-LM
d98e8a64 experts.py, TE d0067d0d ops/fused/grouped_mlp.py): the GLU, the routing probability and the quantization
in fc1's epilogue, the GLU's gradient in fc2's dgrad epilogue, no separate activation or cast kernels, rows padded
to 256 per expert. Counts by hand from the kernels' reads and writes (workload/fused_grouped_mlp.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator import load_scenario, simulate
from simulator.errors import ScenarioError
from simulator.frameworks import get_framework
from simulator.scenario.megatron_args import merge_megatron_args
from simulator.study.emit import emit_text
from simulator.workload.fp8 import TE_CAST_BYTES
from simulator.workload.fused_grouped_mlp import SPLITS_SYNC, padded
from simulator.workload.transformer import build_workload

# GPT-OSS-120B's experts (hidden 2,880, expert FFN 2,880, gated: fc1 2 x 2,880 wide), top-4 of 128 over EP8 on one
# DGX B200: 16 local experts; micro-batch 1 x 4,096 tokens gives each 4,096 x 4 x 8 / 128 = 1,024 rows (uniform)
H, F, LOCAL, ROWS = 2880, 2880, 16, 16_384
MXFP8_WRITE = 2 * (1 + 1 / 32)  # an element written row- and column-wise in MXFP8 with its E8M0 scales


def scenario(fused=True, recipe="mxfp8", dispatcher="hybridep", seq=4096, topology="dgx-b200", **training):
    fp8 = {"recipe": recipe, "param_gather": recipe == "mxfp8"}
    return load_scenario(
        {
            "name": "fused",
            "framework": "megatron-core-2024",
            "model": {"preset": "gpt-oss-120b", "num_layers": 4, "seq_length": seq},
            "cluster": {"topology": topology, "num_nodes": 1},
            "training": {
                "global_batch_size": 8,
                "micro_batch_size": 1,
                "precision": "fp8",
                "fp8": fp8,
                **training,
            },
            "parallelism": {
                "expert_parallel": 8,
                "zero_stage": 1,
                "moe": {"dispatcher": dispatcher, "fused_grouped_mlp": fused},
            },
        }
    )


def layer(s):
    return build_workload(s, get_framework(s.framework), 8, None).layer


def named(ops, name: str):
    return [o for o in ops if o.name.startswith(name)]


def test_fc1s_epilogue_writes_the_quantized_activation_as_part_of_the_gemm():
    """fc1 (16 experts x 1,024 rows x 2,880 -> 5,760, FP8 operands) writes its bf16 pre-activation, and in its
    epilogue the activation row- and column-wise with scales and reads each row's probability."""
    fc1 = named(layer(scenario()).forward, "experts fc1 (fused GLU epilogue)")[-1]
    epilogue = ROWS * (F * MXFP8_WRITE + 4)
    assert fc1.epilogue_bytes == pytest.approx(epilogue)
    per = ROWS // LOCAL
    own = LOCAL * (per * H + H * 2 * F + 2 * per * 2 * F)  # FP8 X and W, the bf16 output
    assert fc1.bytes == pytest.approx(own + epilogue)
    assert (fc1.dtype, fc1.m, fc1.n, fc1.k, fc1.batch, fc1.launches) == ("fp8", per, 2 * F, H, LOCAL, 4)


def test_no_activation_clamp_bias_or_cast_kernels_run_beside_the_fused_gemms():
    b = layer(scenario())
    fwd = [o.name for o in b.forward]
    bwd = [o.name for o in b.backward]
    for gone in ("experts quick-geglu", "activation clamp", "experts fc2 bias (", "host sync: the GLU"):
        assert not [n for n in fwd + bwd if n.startswith(gone)], gone
    # the biases' and probabilities' gradients: one grouped pass re-reading the output gradient (bf16)
    dbias = named(b.backward, "experts fc2 bias and probability gradients")
    assert len(dbias) == 1 and dbias[0].bytes == ROWS * 2 * H
    # the dispatched input and the combine's gradient are quantized as for any FP8 GEMM; what the epilogues wrote
    # is not cast again, and MXFP8 parameter gathering leaves no weight to cast
    assert [n for n in fwd if "experts" in n and "quantize" in n] == [
        "experts fc1 (fused GLU epilogue): quantize input (mxfp8)"
    ]
    assert [n for n in bwd if "experts" in n and "quantize" in n] == [
        "experts fc2 dgrad (fused dGLU epilogue): quantize output gradient (mxfp8)"
    ]
    unfused = [o.name for o in layer(scenario(fused=False)).forward]
    assert "experts quick-geglu (probability-weighted)" in unfused


def test_fc2s_dgrad_epilogue_recomputes_the_glu_and_writes_fc1s_gradient_quantized():
    """Reads the bf16 pre-activation (2F x 2 bytes), writes the gradient of both halves row- and column-wise,
    reads the probability and writes its gradient."""
    dgrad = named(layer(scenario()).backward, "experts fc2 dgrad (fused dGLU epilogue)")[-1]
    assert dgrad.epilogue_bytes == pytest.approx(ROWS * (2 * 2 * F + 2 * F * MXFP8_WRITE + 8))
    assert dgrad.dtype == "fp8" and not named(layer(scenario()).backward, "experts fc1 dgrad: quantize")


def test_nvfp4_epilogues_write_bf16_that_the_hadamard_cast_quantizes():
    """NVFP4's fused kernel writes a bf16 activation (grouped_mlp.py l.1358), then group_quantize casts it."""
    b = layer(scenario(recipe="nvfp4"))
    fc1 = named(b.forward, "experts fc1 (fused GLU epilogue)")[-1]
    assert fc1.epilogue_bytes == pytest.approx(ROWS * (F * 2 + 4))
    cast = named(b.forward, "experts fc2: quantize input")[0]
    weight = LOCAL * F * H  # fc2's weights, cast once a step (one micro-batch here)
    assert cast.bytes == pytest.approx((ROWS * F + weight) * TE_CAST_BYTES[("nvfp4", False)])


def test_each_experts_rows_are_padded_to_256_and_the_all_to_all_path_pads_and_syncs():
    """4,000 tokens give each expert 1,000 rows: the GEMMs run on 1,024. Behind the all-to-all dispatcher
    Megatron pads and unpads the rows itself (a bf16 copy each way) and copies the split sizes to the GPU from a
    host list; the flex dispatchers pad as they permute."""
    assert (padded(1000), padded(1024), padded(1)) == (1024, 1024, 256)
    hybrid = layer(scenario(seq=4000))
    assert named(hybrid.forward, "experts fc1 (fused GLU epilogue)")[-1].m == 1024
    assert not named(hybrid.forward, "experts: pad")
    a2a = layer(scenario(seq=4000, dispatcher="alltoall"))
    pad = named(a2a.forward, "experts: pad each expert's rows to 256")
    assert len(pad) == 1 and pad[0].bytes == 4 * LOCAL * 1024 * H
    assert [o.name for o in a2a.forward].count(SPLITS_SYNC) == 1
    aligned = layer(scenario(dispatcher="alltoall"))  # 1,024 rows: TE's Fp8Padding copies nothing
    assert not named(aligned.forward, "experts: pad") and SPLITS_SYNC in [o.name for o in aligned.forward]


def test_the_epilogue_is_the_gemms_traffic_it_costs_only_where_the_gemm_is_memory_bound():
    """fc1's time is the longer of its compute and its traffic with the epilogue's bytes in it: at 4 x 4,096
    tokens (4,096 rows an expert) compute-bound, the epilogue free; at 1,024 rows the added bytes make it
    memory-bound in the model."""
    for mbs, free in ((4, True), (1, False)):
        s = scenario(global_batch_size=8 * mbs, micro_batch_size=mbs)
        t = simulate(s).compute.op_time_s
        fc1 = named(layer(s).forward, "experts fc1 (fused GLU epilogue)")[-1]
        launch = t(replace(fc1, bytes=0.0, flops=0.0))
        compute, traffic = t(replace(fc1, bytes=0.0)) - launch, t(replace(fc1, flops=0.0)) - launch
        assert t(fc1) - launch == pytest.approx(max(compute, traffic))
        assert (traffic < compute) is free
        bare = replace(fc1, bytes=fc1.bytes - fc1.epilogue_bytes, epilogue_bytes=0.0)
        assert (t(fc1) == pytest.approx(t(bare))) is free
    assert (
        simulate(scenario()).metrics.iteration_time_s
        < simulate(scenario(fused=False)).metrics.iteration_time_s
    )


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"training": {"precision": "bf16"}}, "only MXFP8 and NVFP4"),
        (
            {"training": {"activation_recompute": "selective", "recompute": {"modules": ["moe_act"]}}},
            "remove moe_act",
        ),
        ({"parallelism": {"expert_tensor_parallel": 2}}, "expert_tensor_parallel 1"),
        ({"model": {"activation": "squared-relu", "activation_clamp": None}}, "gated SwiGLU or quick-GeGLU"),
    ],
)
def test_runs_it_cannot_describe_are_refused_in_one_line(change, reason):
    data = {
        "name": "bad",
        "framework": "megatron-core-2024",
        "model": {"preset": "gpt-oss-120b", "num_layers": 4},
        "cluster": {"topology": "dgx-b200", "num_nodes": 1},
        "training": {
            "global_batch_size": 8,
            "micro_batch_size": 1,
            "precision": "fp8",
            "fp8": {"recipe": "mxfp8"},
        },
        "parallelism": {"expert_parallel": 8, "zero_stage": 1, "moe": {"fused_grouped_mlp": True}},
    }
    for section, values in change.items():
        data[section] = {**data[section], **values}
    if data["training"]["precision"] == "bf16":
        del data["training"]["fp8"]
    with pytest.raises(ScenarioError) as err:
        load_scenario(data)
    assert "parallelism.moe.fused_grouped_mlp" in str(err.value) and reason in str(err.value)


def test_megatron_arguments_read_and_written():
    """The op fuser with the GLU interleaved in blocks of 32 on a MoE model is the fused path (the environment
    variable is what lets Megatron build it at all); the planner writes both switches and notes the variable."""
    base = [
        "--num-layers",
        "2",
        "--num-experts",
        "8",
        "--moe-grouped-gemm",
        "--use-transformer-engine-op-fuser",
    ]
    data = merge_megatron_args({"name": "m"}, [*base, "--moe-mlp-glu-interleave-size", "32"], "test")
    assert data["parallelism"]["moe"]["fused_grouped_mlp"] is True
    plain = merge_megatron_args({"name": "m"}, base, "test")
    assert "fused_grouped_mlp" not in plain["parallelism"].get("moe", {})
    sc = scenario().model_dump(mode="json", exclude_none=True)
    layout = {"tp": 1, "pp": 1, "cp": 1, "dp": 8, "v": 1, "mbs": 1, "sharding": "zero1", "recompute": "none"}
    text = emit_text({**layout, "ep": 8, "etp": 1, "scenario": sc}, "megatron")
    assert "--moe-mlp-glu-interleave-size 32" in text and "NVTE_CUTEDSL_FUSED_GROUPED_MLP=1" in text
