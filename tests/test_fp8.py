"""FP8 training (workload/fp8.py) and the GPU catalogue it runs on: the GEMMs' speed-up by the GPU file's own
numbers, the cast kernels' bytes, the scaling-factor reductions, parameter all-gathers, memory, and GPU files as
user input."""

from pathlib import Path

import pytest
import yaml

from simulator.api import simulate
from simulator.costs.collectives import CollectiveModel
from simulator.costs.compute import ComputeModel
from simulator.costs.tables import table_lookups
from simulator.frameworks import get_framework
from simulator.hardware.cluster import Cluster
from simulator.hardware.gpus import GPU, get_gpu, gpu_catalogue
from simulator.hardware.placement import Placement
from simulator.hardware.topology import load_topology
from simulator.scenario.loader import load_scenario
from simulator.tables.select import resolve_table
from simulator.workload.fp8 import TE_CAST_BYTES, fp8_plan
from simulator.workload.transformer import build_workload

ROOT = Path(__file__).resolve().parents[1]


def scenario(precision="fp8", topology="dgx-h100", nodes=1, training=None, parallelism=None, **extra):
    data = {
        "name": "fp8",
        "model": {"preset": "llama3-8b", "seq_length": 4096, "num_layers": 4},
        "cluster": {"topology": topology, "num_nodes": nodes},
        "framework": "megatron-core-2024",
        "parallelism": {"tensor_parallel": 1, **(parallelism or {})},
        "training": {
            "global_batch_size": 8,
            "micro_batch_size": 1,
            "precision": precision,
            **(training or {}),
        },
        **extra,
    }
    return load_scenario(data)


def linear_pairs(s8, kernels):
    """(bf16 op, its fp8 op) for every linear GEMM of one layer's forward and backward."""
    s16 = s8.model_copy(update={"training": s8.training.model_copy(update={"precision": "bf16"})})
    gpu = get_gpu("h100-sxm5-80gb")
    w8, w16 = build_workload(s8, gpu=gpu), build_workload(s16, gpu=gpu)
    ops8 = [op for op in (*w8.layer.forward, *w8.layer.backward) if op.kind == "gemm" and op.linear]
    ops16 = [op for op in (*w16.layer.forward, *w16.layer.backward) if op.kind == "gemm" and op.linear]
    assert len(ops8) == len(ops16) == 12  # QKV, projection, MLP up, MLP down: forward, dgrad, wgrad each
    return w8, w16, list(zip(ops16, ops8, strict=True))


@pytest.mark.parametrize("kernels", ["none", "shipped"])
def test_fp8_gemms_are_faster_by_the_peak_ratio_times_the_efficiency_ratio(kernels):
    """Every linear GEMM of a Llama layer (4,096 tokens, hidden 4,096: compute-bound) runs in FP8, as fast as the
    bf16 one x the GPU file's dense FP8 / BF16 peaks (1,979 / 989) x the ratio of its best FP8 and BF16 matmuls
    (0.709 / 0.803): with the roofline alone, and with the shipped H100 table (its bf16 rows carried over)."""
    s8 = scenario()
    gpu = get_gpu("h100-sxm5-80gb")
    lookup = None
    if kernels == "shipped":
        lookup = table_lookups(resolve_table(None, gpu.name), Cluster(load_topology("dgx-h100"), 1))[0]
    compute = ComputeModel(gpu, "bf16", get_framework("ideal"), lookup)
    _, _, pairs = linear_pairs(s8, kernels)
    expected = 1979 / 989 * (0.709 / 0.803)
    for bf16, fp8 in pairs:
        assert fp8.dtype == "fp8" and bf16.dtype == ""
        launch = gpu.kernel_launch_s
        ratio = (compute.op_time_s(bf16) - launch) / (compute.op_time_s(fp8) - launch)
        assert ratio == pytest.approx(expected, rel=1e-6), bf16.name


def test_fp8_layer_time_is_bf16_less_the_gemm_savings_plus_the_cast_kernels():
    """The whole layer: the bf16 layer's time, less what each linear GEMM saves, plus one quantize kernel per
    forward GEMM (input, and 1/m of the weight) and per dgrad (output gradient), each moving the bytes of Hopper's
    cast_transpose (2 read + 1 + 1 written per element; after a norm, which writes FP8 itself, the transpose's
    1 + 1) at the memory roofline."""
    s8 = scenario()
    gpu = get_gpu("h100-sxm5-80gb")
    compute = ComputeModel(gpu, "bf16", get_framework("ideal"))
    w8, w16, pairs = linear_pairs(s8, "none")
    t = compute.ops_time_s
    saved = sum(compute.op_time_s(a) - compute.op_time_s(b) for a, b in pairs)
    casts = [op for op in (*w8.layer.forward, *w8.layer.backward) if ": quantize " in op.name]
    assert len(casts) == 8  # 4 before the forward GEMMs, 4 before the dgrads
    m = w8.fp8.microbatches
    per_element = TE_CAST_BYTES[("delayed", True)]
    expected_bytes = 0.0
    for bf16, _ in pairs:
        if bf16.direction == "forward":  # QKV and MLP-up follow a norm, which writes FP8: only the transpose
            x = 2.0 if bf16.name in ("qkv projection", "mlp up projection") else per_element
            expected_bytes += x * bf16.m * bf16.k + per_element * bf16.k * bf16.n / m
        elif bf16.name.endswith("dgrad"):
            expected_bytes += per_element * bf16.m * bf16.k
    assert sum(op.bytes for op in casts) == pytest.approx(expected_bytes, rel=1e-12)
    cast_s = sum(
        op.bytes / (gpu.hbm_bytes_per_s * gpu.memory_efficiency) + gpu.kernel_launch_s for op in casts
    )
    layer8 = t(w8.layer.forward) + t(w8.layer.backward)
    layer16 = t(w16.layer.forward) + t(w16.layer.backward)
    assert layer8 == pytest.approx(layer16 - saved + cast_s, rel=1e-9)
    assert layer8 < layer16


def test_attention_logits_and_router_stay_bf16():
    w = build_workload(scenario(), gpu=get_gpu("h100-sxm5-80gb"))
    low = {op.name for op in (*w.head.forward, *w.embedding.forward, *w.layer.forward) if op.dtype}
    assert low == {
        "qkv projection",
        "attention output projection",
        "mlp up projection",
        "mlp down projection",
    }


def test_fp8_param_gather_moves_half_the_bf16_bytes_of_the_fp8_layers():
    """Megatron's --fp8-param-gather with the distributed optimizer: the FP8 layers' weights are all-gathered at
    1 byte, the embedding and output layer (bf16) at 2: half the bf16 all-gather's bytes for the layers."""
    par = {"zero_stage": 1, "tensor_parallel": 1}
    gathered = {}
    for gather in (False, True):
        r = simulate(scenario(nodes=1, parallelism=par, training={"fp8": {"param_gather": gather}}))
        gathered[gather] = sum(t.bytes for t in r.program.tasks if t.rank == 0 and t.kind == "all_gather")
        w = r.workload
    layers, _ = w.fp8_params_per_rank
    other = w.params_per_rank - layers
    assert gathered[False] == pytest.approx(2 * w.params_per_rank, rel=1e-9)
    assert gathered[True] == pytest.approx(1 * layers + 2 * other, rel=1e-9)
    assert gathered[False] - gathered[True] == pytest.approx(layers, rel=1e-9)  # the layers' bytes halved


def test_delayed_scaling_reduces_amaxes_over_tp_dp_cp_once_per_microbatch_and_tensorwise_over_tp():
    s = scenario(nodes=1, parallelism={"tensor_parallel": 2, "sequence_parallel": True})
    w = build_workload(s, gpu=get_gpu("h100-sxm5-80gb"))
    amax = [op for op in w.microbatch_setup if op.kind == "collective"]
    assert [op.group for op in amax] == ["tp+dp+cp", "tp+dp+cp"]
    assert amax[0].bytes == 4 * 3 * 4 * 4  # 3 amaxes per linear, 4 linears per layer, 4 layers
    assert not any(op.name.startswith("fp8 amax all-reduce (tp)") for op in w.layer.forward)
    s = scenario(
        nodes=1,
        parallelism={"tensor_parallel": 2, "sequence_parallel": True},
        training={"fp8": {"recipe": "tensorwise"}},
    )
    w = build_workload(s, gpu=get_gpu("h100-sxm5-80gb"))
    assert not [op for op in w.microbatch_setup if op.kind == "collective"]
    tp_amax = [op for op in w.layer.forward if op.name == "fp8 amax all-reduce (tp)"]
    gathers = [op for op in w.layer.forward if op.collective == "all_gather" and op.group == "tp"]
    assert len(tp_amax) == len(gathers) == 2 and all(op.bytes == 4 for op in tp_amax)


def test_sequence_parallel_all_gathers_move_fp8():
    par = {"tensor_parallel": 2, "sequence_parallel": True}
    gpu = get_gpu("h100-sxm5-80gb")
    w8 = build_workload(scenario(parallelism=par), gpu=gpu)
    w16 = build_workload(scenario("bf16", parallelism=par), gpu=gpu)
    g8 = [op.bytes for op in w8.layer.forward if op.collective == "all_gather"]
    g16 = [op.bytes for op in w16.layer.forward if op.collective == "all_gather"]
    assert g8 == [b / 2 for b in g16] and g8


@pytest.mark.parametrize(
    ("topology", "recipe", "extra"),
    [("dgx-h100", "delayed", 2.0), ("dgx-b200", "tensorwise", 1.0), ("dgx-b200", "mxfp8", 2 + 2 / 32)],
)
def test_weight_copies_add_the_recipes_bytes_per_layer_parameter(topology, recipe, extra):
    """Transformer Engine's cached FP8 weight: data and its transpose on Hopper (2 B), one copy on Blackwell
    (1 B), MXFP8's row- and column-wise copies with their scales."""
    fp8 = scenario(topology=topology, training={"fp8": {"recipe": recipe}})
    bf16 = scenario("bf16", topology=topology)
    m8, m16 = simulate(fp8).metrics.memory_gib, simulate(bf16).metrics.memory_gib
    layers = sum(build_workload(fp8).fp8_params_per_rank)
    assert (m8["params"] - m16["params"]) * 2**30 == pytest.approx(extra * layers, rel=1e-9)


def test_transformer_engine_saves_linear_inputs_in_fp8():
    """QKV, MLP-up, projection and MLP-down inputs kept at 1 byte instead of 2 (TE saves the quantized copy)."""
    s8, s16 = scenario(), scenario("bf16")
    a8, a16 = simulate(s8).metrics.memory_gib["activations"], simulate(s16).metrics.memory_gib["activations"]
    m = s8.model
    tokens = m.seq_length
    per_layer = tokens * (
        m.hidden_size * 2 + m.num_attention_heads * m.head_dim + m.ffn_size
    )  # 1 byte saved each
    assert (a16 - a8) * 2**30 == pytest.approx(per_layer * m.num_layers, rel=1e-9)


def test_bf16_layers_stay_unquantized():
    s = scenario(training={"fp8": {"recipe": "tensorwise", "bf16_layers": 1}})
    w = build_workload(s)
    quantized = [any(op.dtype for op in b.forward) for b in w.layers]
    assert quantized == [False, True, True, False]


def test_mfu_stays_against_the_bf16_peak_and_fp8_utilisation_is_reported():
    r = simulate(scenario())
    assert r.metrics.fp8["mfu_vs_low_precision_peak"] == pytest.approx(r.metrics.mfu * 989 / 1979, rel=1e-12)
    assert r.metrics.mfu == pytest.approx(r.metrics.model_tflops_per_gpu / 989, rel=1e-9)


def test_fp8_speeds_up_a_gemm_bound_run_and_nvfp4_more_on_blackwell():
    t = {p: simulate(scenario(p, topology="dgx-b200")).metrics.iteration_time_s for p in ("bf16", "fp8")}
    nv = simulate(
        scenario(topology="dgx-b200", training={"fp8": {"recipe": "nvfp4"}})
    ).metrics.iteration_time_s
    assert nv < t["fp8"] < t["bf16"]


def test_auto_recipe_is_delayed_on_hopper_mxfp8_on_blackwell_tensorwise_with_torchao():
    assert scenario().training.fp8.recipe == "delayed"
    assert scenario(topology="dgx-b200").training.fp8.recipe == "mxfp8"
    fsdp = scenario(parallelism={"fsdp": {}})
    assert (fsdp.training.fp8.recipe, fsdp.training.fp8.library) == ("tensorwise", "torchao")
    plan = fp8_plan(fsdp, get_gpu("h100-sxm5-80gb"))
    assert (
        plan.weight_copy_bytes == 0 and plan.cast_bytes("weight") == 8.0
    )  # torchao casts it twice each time


def test_nvl72_tp16_all_reduce_stays_on_nvlink():
    """16-rank tensor-parallel groups in GB200 NVL72 racks used 64 GPUs each (cluster.gpus_per_node: 64, as
    NVIDIA's 128-GPU GB200 runs): every link of their all-reduces is a GPU's NVLink into the rack's switch, and
    it costs the 16-rank ring on NVLink 5 (900 GB/s per direction x the measured 0.756)."""
    spec = load_topology("gb200-nvl72")
    spec = spec.model_copy(update={"node": spec.node.model_copy(update={"gpus": 64, "nics": 64})})
    cluster = Cluster(spec, 2)
    cm = CollectiveModel(cluster, Placement(tp=16, dp=8), "ring")
    (phase,) = cm.phases("all_reduce", "tp", 1e9)
    assert all(
        "nvswitch" in cls[1:] for cls in phase.demand_s
    )  # GPU <-> NVSwitch links only: no NIC, no PCIe
    n, bw = 16, 900e9 * 0.756
    assert max(phase.demand_s.values()) == pytest.approx(2 * (n - 1) / n * 1e9 / bw, rel=1e-9)


def test_every_shipped_gpu_file_round_trips_through_the_schema():
    for name, gpu in gpu_catalogue().items():
        assert GPU.model_validate(yaml.safe_load(yaml.safe_dump(gpu.model_dump(mode="json")))) == gpu, name
        assert gpu.sources and gpu.hbm_gib >= 1


def test_a_user_gpu_file_changes_the_result(tmp_path):
    """The H100's own file, written out with half its HBM bandwidth and a power cap (clock_scale 0.8), given as
    cluster.gpu: the run slows down; unchanged, it gives the shipped GPU's result exactly."""
    data = get_gpu("h100-sxm5-80gb").model_dump(mode="json")
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump(data))
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump({**data, "hbm_bandwidth_GBps": 1675, "clock_scale": 0.8}))
    base = simulate(scenario()).metrics.iteration_time_s

    def run(path):
        cluster = {"topology": "dgx-h100", "num_nodes": 1, "gpu": str(path)}
        return simulate(scenario(cluster=cluster)).metrics.iteration_time_s

    assert run(same) == pytest.approx(base, rel=1e-12)
    assert run(slow) > 1.2 * base


def test_public_fp8_runs_are_within_10_percent_median_and_none_over_25():
    """simulator/validation/fp8.yaml: 38 public runs of NVIDIA's stack on H100, B200 and GB200 and of torchtitan on
    H100 (FP8, and the bf16 halves of the pairs), nothing fitted on them: median |error| <= 10%, every case within
    25%."""
    from simulator.validation.runner import load_cases, run_cases, summarize

    cases = load_cases(ROOT / "simulator" / "validation" / "fp8.yaml")
    summary = summarize(run_cases(cases))
    assert summary["n"] == 38 and summary["failed"] == summary["oom"] == 0
    assert summary["median_abs_error_pct"] <= 10.0
    assert summary["max_abs_error_pct"] <= 25.0


def test_calibration_times_fp8_training_s_linear_gemms_in_fp8_and_the_rest_in_bf16():
    from collections import Counter

    from simulator.calibration.shapes import costed_shapes

    kernels, _ = costed_shapes(load_scenario(ROOT / "scenarios" / "fp8" / "llama3.1-70b-fp8-64xh100.yaml"))
    kinds = Counter((k.op, k.dtype) for k in kernels)
    assert kinds[("gemm", "fp8")] == 12  # 4 linear layers x forward, dgrad, wgrad
    assert kinds[("gemm", "bf16")] == 3  # the output layer's logits: forward, dgrad, wgrad
    assert all(dtype == "bf16" for (op, dtype) in kinds if op != "gemm")


def test_calibrate_kernels_dtype_fp8_needs_a_gpu():
    from typer.testing import CliRunner

    from simulator.cli import app

    scenario = ROOT / "scenarios" / "fp8" / "llama3-8b-fp8-8xb200.yaml"
    r = CliRunner().invoke(
        app, ["calibrate", "kernels", str(scenario), "--out", "t", "--device", "cpu", "--dtype", "fp8"]
    )
    assert r.exit_code == 2
    assert "--dtype fp8: FP8 GEMMs run on a GPU with FP8 tensor cores" in r.output


def test_a_grouped_expert_gemm_quantizes_every_local_experts_operands():
    """Issue 61: the cast before a grouped GEMM of 4 local experts moves 4 experts' rows and 4 weights (it was
    charged for one). Hand count, delayed recipe on an H100 (TN-only: transposed copies), Transformer Engine, one
    micro-batch: (4 x 512 x 1024 inputs) x cast_bytes(input) + (4 x 1024 x 2048 weights) x cast_bytes(weight)."""
    from simulator.workload.fp8 import Fp8Plan, quantized
    from simulator.workload.ops import gemm

    plan = Fp8Plan("delayed", "transformer-engine", True, False, 1)
    experts = gemm("fc1 experts", 512, 2048, 1024, batch=4, linear=True, grouped=True)
    one = gemm("fc1 one expert", 512, 2048, 1024, batch=1, linear=True)
    cast4, cast1 = quantized((experts,), plan, False)[0], quantized((one,), plan, False)[0]
    assert cast4.bytes == pytest.approx(
        4 * 512 * 1024 * plan.cast_bytes("input") + 4 * 1024 * 2048 * plan.cast_bytes("weight")
    )
    assert cast4.bytes == pytest.approx(4 * cast1.bytes)
