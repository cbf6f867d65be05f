"""Activation recompute policies as frameworks state them (workload/recompute.py): which layers are recomputed,
what the recomputation re-runs (hardware FLOPs beyond the model's) and what stays in memory, each against a hand
count on a small Llama-style model (hidden 1,024, 8 heads, SwiGLU 2,816, sequence 2,048, micro-batch 1)."""

import pytest
from conftest import SMALL_MOE

from simulator.api import simulate
from simulator.scenario.loader import load_scenario
from simulator.strategy.memory import activation_memory
from simulator.workload.memory import activation_bytes_per_layer, checkpoint_bytes_per_layer

S, H, F = 2048, 1024, 2816


def scenario(mode="none", layers=4, **recompute):
    return load_scenario(
        {
            "name": "rc",
            "model": {
                "num_layers": layers,
                "hidden_size": H,
                "num_attention_heads": 8,
                "ffn_hidden_size": F,
                "seq_length": S,
                "vocab_size": 32000,
                "activation": "swiglu",
                "normalization": "rmsnorm",
                "position_embedding": "rope",
                "add_bias_linear": False,
                "attention": "flash",
            },
            "cluster": {"topology": "dgx-h100", "num_nodes": 1, "gpus_per_node": 1},
            "framework": "ideal",
            "training": {
                "global_batch_size": 2,
                "micro_batch_size": 1,
                "activation_recompute": mode,
                **({"recompute": recompute} if recompute else {}),
            },
        }
    )


def recompute_flops(s) -> float:
    """FLOPs the rank re-runs in one iteration (hardware FLOPs that are not model FLOPs)."""
    r = simulate(s, periodic=False)
    return sum(op.flops for t in r.program.tasks if t.rank == 0 for op in t.ops if op.recompute)


def layer_forward_flops(s) -> float:
    from simulator.workload.transformer import build_workload

    return sum(op.flops for op in build_workload(s).layer.forward)


def kept(s) -> float:
    from simulator.workload.transformer import build_workload

    return activation_memory(s, list(build_workload(s).layers), has_head=False)[0]


def test_full_recompute_re_runs_every_layer_and_keeps_the_inputs():
    s = scenario("full")
    assert recompute_flops(s) == pytest.approx(2 * 4 * layer_forward_flops(s), rel=1e-12)  # 2 micro-batches
    whole = activation_bytes_per_layer(s, recompute="none")
    assert kept(s) == pytest.approx(4 * 2 * S * H + whole, rel=1e-12)  # 4 inputs + the layer being re-run


def test_torchs_non_reentrant_checkpoint_stops_before_the_last_linear_layer():
    """torch's non-reentrant checkpoint (torchtitan, llm-foundry: ``checkpoint_early_stop``) stops recomputing once
    the last tensor the backward needs is saved, which autograd does before the MLP-down GEMM runs: per layer the
    re-run is the forward less 2 s h F FLOPs (MLP-down) and less the residual add after it. Megatron's reentrant
    CheckpointFunction (the ``ideal`` profile here) re-runs the whole forward; FP8's custom autograd Functions and
    a compiled block save only after their forward, so they re-run it whole too."""
    from simulator.frameworks import get_framework

    s = scenario("full")
    whole = recompute_flops(s)
    early = s.model_copy(update={"framework": "pytorch-2024"})
    assert get_framework("pytorch-2024").checkpoint_early_stop
    down = 2 * S * H * F
    assert recompute_flops(early) == pytest.approx(
        whole - 2 * 4 * down, rel=1e-12
    )  # 2 micro-batches x 4 layers
    compiled = early.model_copy(update={"training": early.training.model_copy(update={"compile": True})})
    assert recompute_flops(compiled) == pytest.approx(whole, rel=1e-12)


def test_megatron_block_method_recomputes_the_first_n_layers_of_the_chunk():
    s = scenario("full", method="block", num_layers=1)
    assert recompute_flops(s) == pytest.approx(2 * 1 * layer_forward_flops(s), rel=1e-12)
    whole = activation_bytes_per_layer(s, recompute="none")
    assert kept(s) == pytest.approx(2 * S * H + 3 * whole + whole, rel=1e-12)


def test_megatron_uniform_method_checkpoints_groups_and_re_runs_a_group_at_once():
    s = scenario("full", method="uniform", num_layers=2)
    assert recompute_flops(s) == pytest.approx(2 * 4 * layer_forward_flops(s), rel=1e-12)
    whole = activation_bytes_per_layer(s, recompute="none")
    assert kept(s) == pytest.approx(2 * (2 * S * H) + 2 * whole, rel=1e-12)  # 2 group inputs, a group live


def test_torchtitan_selective_layer_recomputes_every_nth_layer():
    s = scenario("selective-layer", every=2)
    assert recompute_flops(s) == pytest.approx(2 * 2 * layer_forward_flops(s), rel=1e-12)  # layers 2 and 4
    whole = activation_bytes_per_layer(s, recompute="none")
    assert kept(s) == pytest.approx(2 * (2 * S * H) + 2 * whole + whole, rel=1e-12)


def test_torchtitan_per_op_policy_re_runs_every_other_matmul_and_keeps_the_saved_outputs():
    """torchtitan's matmuls run wq, wk, wv, wo, w1, w3, w2 (its Llama block's separate linear layers); every
    second is re-run: wk and wo (S x H x H each) and w3 (S x H x F), 2 S H (2 H + F) FLOPs (plus the
    elementwise kernels, no FLOPs). Kept, 16-bit unless noted: the layer input (S H), the outputs of wq, wv (S H
    each), attention (S H) and its fp32 log-sum-exp (S x 8 heads x 4 bytes), w1 (S F) and w2 (S H)."""
    s = scenario("selective-op")
    per_layer = 2 * S * H * (2 * H + F)
    assert recompute_flops(s) == pytest.approx(2 * 4 * per_layer, rel=1e-12)
    own = 2 * S * H + 2 * 2 * S * H + 2 * S * H + 4 * S * 8 + 2 * S * F + 2 * S * H
    assert activation_bytes_per_layer(s) == own
    whole = activation_bytes_per_layer(s, recompute="none")
    assert kept(s) == pytest.approx(4 * own + (whole - own), rel=1e-12)
    assert own < whole


def test_no_recompute_keeps_everything_and_re_runs_nothing():
    s = scenario("none")
    assert recompute_flops(s) == 0
    assert kept(s) == pytest.approx(4 * activation_bytes_per_layer(s), rel=1e-12)
    assert checkpoint_bytes_per_layer(s) == 2 * S * H


@pytest.mark.parametrize(
    ("training", "message"),
    [
        (
            {"activation_recompute": "none", "recompute": {"method": "block", "num_layers": 2}},
            "it needs activation_recompute: full",
        ),
        (
            {"activation_recompute": "full", "recompute": {"method": "block"}},
            "method and num_layers go together",
        ),
    ],
)
def test_recompute_settings_that_do_not_go_together_are_refused(training, message):
    from simulator.errors import ScenarioError

    data = scenario().model_dump()
    data["training"].update(training)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(data)


# -- Megatron-Core's --recompute-modules ------------------------------------------------------------------------
def moe_modules(modules=None, mode="selective"):
    training = {"global_batch_size": 16, "micro_batch_size": 2, "activation_recompute": mode}
    if modules is not None:
        training["recompute"] = {"modules": modules}
    return load_scenario(
        {
            "model": {**SMALL_MOE, "moe": {**SMALL_MOE["moe"], "first_dense_layers": 1}},
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "kernels": "none",
            "framework": "megatron-core-2024",
            "training": training,
            "parallelism": {"expert_parallel": 8},
        }
    )


def test_moe_act_and_layernorm_modules_rerun_their_kernels_and_keep_less_by_hand():
    from simulator.workload.expert_load import expert_load
    from simulator.workload.memory import activation_bytes_per_layer
    from simulator.workload.transformer import build_workload

    base, mods = moe_modules(), moe_modules(["moe_act", "layernorm"])
    w = build_workload(mods)
    dense, moe = w.layers[0], w.layers[1]
    assert (
        dense.recompute_ops("selective") == ()
    )  # FlashAttention: core_attn re-runs nothing; dense norms fused
    names = [op.name for op in moe.recompute_ops("selective")]
    assert names == ["post-attention layernorm", "experts swiglu (probability-weighted)"]
    assert all(op.recompute for op in moe.recompute_ops("selective"))
    # kept bytes: the pre-MLP norm's output (2 bytes x tokens x hidden) and the activation's output (2 bytes x
    # rows x expert width) go
    tokens, h, f = 2 * 2048, 1024, 2816
    rows = expert_load(mods.model.moe, tokens, 8, 1).total_rows
    saved = activation_bytes_per_layer(base, moe=True) - activation_bytes_per_layer(mods, moe=True)
    assert saved == pytest.approx(2 * tokens * h + 2 * rows * f, rel=1e-12)
    assert activation_bytes_per_layer(base) == activation_bytes_per_layer(mods)  # a dense layer: nothing


def test_torchtitan_per_op_policy_on_an_moe_layer_re_runs_the_routed_experts_and_keeps_the_all_to_alls():
    """torchtitan v0.2.2's save list for its MoE models (llama4, deepseek_v3): the routed experts'
    torch._grouped_mm is not on it, so their GEMMs are re-run; the expert-parallel all-to-all is, so the tokens
    this rank's experts receive and the outputs sent back to its tokens are kept; the shared expert's w1, w3, w2
    continue the matmul count after wq, wk, wv, wo, so w3 is re-run and w1, w2 kept. By hand, one MoE layer:"""
    from simulator.workload.expert_load import expert_load
    from simulator.workload.transformer import build_workload

    s = load_scenario(
        {
            "model": {
                **SMALL_MOE,
                "moe": {**SMALL_MOE["moe"], "first_dense_layers": 1, "shared_expert_ffn_hidden_size": 512},
            },
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "kernels": "none",
            "framework": "pytorch-2024",
            "training": {
                "global_batch_size": 16,
                "micro_batch_size": 2,
                "activation_recompute": "selective-op",
            },
            "parallelism": {"expert_parallel": 8, "data_parallel": 8},
        }
    )
    moe = build_workload(s).layers[1]
    rerun = moe.recompute_ops("op")
    names = {op.name for op in rerun}
    assert {"wk projection", "attention output projection", "shared expert w3 projection"} <= names
    assert {"experts fc1", "experts fc2"} <= names  # the routed experts' grouped GEMMs
    assert not names & {"wq projection", "wv projection", "shared expert w1 projection", "shared expert fc2"}
    assert not any(op.kind == "collective" and op.collective == "all_to_all" for op in rerun)
    tokens, h, d, fs = 2 * 2048, 1024, 128, 512
    received = expert_load(s.model.moe, tokens, 8, 1).total_rows
    # the layer input, wq (8 heads x 128), wv (8 heads x 128 with 8 KV groups), shared w1 (512) and w2 (1,024),
    # attention's output (8 x 128) and fp32 log-sum-exp (8 heads), the dispatch's and the combine's outputs
    own = 2 * tokens * h + 2 * tokens * (8 * d + 8 * d + fs + h) + tokens * 8 * (2 * d + 4)
    own += 2 * h * (received + tokens * 2)
    assert activation_bytes_per_layer(s, moe=True) == pytest.approx(own, rel=1e-12)


def test_recompute_modules_need_selective_recompute():
    from simulator.errors import ScenarioError

    with pytest.raises(ScenarioError) as e:
        moe_modules(["moe_act"], mode="none")
    assert "training.recompute.modules" in str(e.value) and "\n" not in str(e.value)


# -- activation offloading (Megatron-Core --cpu-offloading, Transformer Engine's double buffer) ----------------
def offload_scenario(n, **training):
    return load_scenario(
        {
            "model": {"preset": "llama3-8b", "seq_length": 8192},
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {
                "global_batch_size": 16,
                "micro_batch_size": 2,
                "activation_offload_layers": n,
                **training,
            },
            "framework": "megatron-core-2024",
            "parallelism": {"zero_stage": 1},
        }
    )


def test_offloaded_layers_keep_two_layers_of_activations_and_copy_each_layers_out_and_back():
    from simulator.workload.transformer import build_workload

    base, off = offload_scenario(0), offload_scenario(8)
    per_layer = activation_bytes_per_layer(off)
    w = build_workload(off)
    assert [b.offloaded for b in w.layers[:9]] == [True] * 8 + [False]
    first = w.layers[0]
    out, back = first.forward[0], first.backward[0]
    assert (out.collective, out.bytes, out.overlaps) == ("d2h_pinned", per_layer, "behind")
    assert (back.collective, back.bytes, back.overlaps) == ("h2d_pinned", per_layer, "behind")
    # 8 layers leave the GPU, 2 of them are on it at any time (the double buffer)
    kept = (
        activation_memory(base, list(build_workload(base).layers))[0]
        - activation_memory(off, list(w.layers))[0]
    )
    assert kept == pytest.approx((8 - 2) * per_layer, rel=1e-12)
    # the copies hide behind the layers only as far as PCIe keeps up
    fast, slow = simulate(base).metrics, simulate(off).metrics
    assert slow.iteration_time_s > fast.iteration_time_s
    assert slow.memory_gib["activations"] < fast.memory_gib["activations"]


def test_offload_needs_fewer_layers_than_the_model_and_no_pipeline():
    from simulator.errors import ScenarioError

    with pytest.raises(ScenarioError, match="must be below model.num_layers"):
        offload_scenario(32)
    with pytest.raises(ScenarioError, match="not replayed with full recompute"):
        offload_scenario(4, activation_recompute="full")


def test_mlp_moe_and_shared_expert_modules_rerun_their_module_from_its_input():
    from simulator.workload.memory import moe_mlp_activation_bytes
    from simulator.workload.transformer import build_workload

    base = moe_modules()
    mlp = moe_modules(["mlp"])
    dense = build_workload(mlp).layers[0]
    names = [op.name for op in dense.recompute_ops("selective")]
    assert names[:2] == ["mlp up projection", "swiglu"] and "mlp down projection" in names
    f, tokens = 2816, 2 * 2048
    assert activation_bytes_per_layer(base) - activation_bytes_per_layer(mlp) == pytest.approx(
        2 * tokens * (2 * f + f), rel=1e-12
    )  # the up projection's output (2f wide) and the activation's output (f), 16-bit
    moe = moe_modules(["moe"])
    again = [op.name for op in build_workload(moe).layers[1].recompute_ops("selective")]
    assert "ep all-to-all (dispatch tokens)" in again and "ep all-to-all (combine tokens)" in again
    assert activation_bytes_per_layer(base, moe=True) - activation_bytes_per_layer(
        moe, moe=True
    ) == pytest.approx(moe_mlp_activation_bytes(base), rel=1e-12)
    # shared experts: their up projection's and activation's outputs (a dense MLP of their width) not kept
    shared = base.model_copy(
        update={
            "model": base.model.model_copy(
                update={"moe": base.model.moe.model_copy(update={"shared_expert_ffn_hidden_size": 1024})}
            )
        }
    )
    fs = 1024
    assert moe_mlp_activation_bytes(shared) - moe_mlp_activation_bytes(
        shared, recompute_shared=True
    ) == pytest.approx(tokens * 2 * (2 * fs + fs), rel=1e-12)
