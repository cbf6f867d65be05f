"""plan --switches: sequence parallelism, TP overlap and the data-parallel overlaps searched on and off (Calculon's
``tensor_par_comm_type``, ``tensor_par_overlap``, ``data_par_overlap``), and the screen that takes memory first."""

import dataclasses
import json
import math

import pytest
from test_plan import PLAN_ARGS, megatron_2021_base, runner

from simulator import load_scenario, simulate
from simulator.cli import app
from simulator.hardware.cluster import Cluster
from simulator.hardware.topology import cluster_spec
from simulator.study.layout import Layout
from simulator.study.layouts import NONE, candidates, offload_counts, switch_sets
from simulator.study.plan import plan
from simulator.study.screen import Screen
from simulator.workload.memory import activation_bytes_per_layer
from simulator.workload.ops import gemm


def test_switch_sets_are_each_switch_on_and_off_where_it_applies():
    full = switch_sets(8, 24, "zero1", moe=False)
    assert len(full) == 3 * 2 * 2 == len(set(full))
    assert {(sp, o) for sp, o, _, _ in full} == {(False, False), (True, False), (True, True)}
    assert {(g, q) for _, _, g, q in full} == {(True, True), (True, False), (False, True), (False, False)}
    assert switch_sets(1, 1, "ddp", moe=False) == [(None, None, None, None)]  # nothing to switch
    assert len(switch_sets(1, 8, "ddp", moe=False)) == 2  # the gradient overlap alone
    # Megatron-Core's MoE layers need SP with TP; FSDP and ZeRO-3 have no DDP overlap to switch
    assert {sp for sp, *_ in switch_sets(4, 2, "ddp", moe=True)} == {True}
    assert switch_sets(1, 8, "fsdp", moe=False) == [(None, None, None, None)]


def test_candidates_with_switches_are_each_layout_times_its_switch_sets():
    b = megatron_2021_base()
    plain = candidates(b, 32, 8, {"shardings": ("ddp", "zero1")})
    switched = candidates(b, 32, 8, {"shardings": ("ddp", "zero1"), "switches": True})
    each = [
        len(switch_sets(x.tp, x.dp, x.sharding, False))
        * len(offload_counts(b.model, x.pp, x.sharding, x.recompute))
        for x in plain
    ]
    assert len(switched) == sum(each) > 2 * len(plain)
    assert {
        dataclasses.replace(
            x, sp=None, tp_overlap=None, grad_overlap=None, param_overlap=None, act_offload=None
        )
        for x in switched
    } == set(plain)
    assert all(
        (x.sp, x.tp_overlap, x.grad_overlap, x.param_overlap, x.act_offload) == (*NONE[0], None)
        for x in plain
    )


def test_a_switched_layout_s_scenario_states_its_switches():
    b = megatron_2021_base()
    screen = Screen(b, Cluster(cluster_spec(b), 4))
    lay = Layout(
        4, 2, 1, 4, 1, 1, "zero1", "none", sp=True, tp_overlap=True, grad_overlap=False, param_overlap=True
    )
    p = screen.scenario(lay).parallelism
    assert (p.sequence_parallel, bool(p.tp_comm_overlap)) == (True, True)
    assert (p.ddp.overlap_grad_reduce, p.ddp.overlap_param_gather) == (False, True)
    assert lay.label() == "TP4 PP2 DP4 mbs1 zero1 rc:none sp+tpo ovl:param"
    off = dataclasses.replace(lay, sp=False, tp_overlap=False, grad_overlap=False, param_overlap=False)
    assert off.label().endswith("no-sp ovl:-")
    assert screen.scenario(off).parallelism.sequence_parallel is False
    # off Megatron a searched TP overlap is PyTorch's async TP (torchtitan), not Transformer Engine's userbuffers
    torch_base = load_scenario({**b.model_dump(mode="json", exclude_none=True), "framework": "pytorch-2024"})
    torch_screen = Screen(torch_base, Cluster(cluster_spec(torch_base), 4))
    assert torch_screen.scenario(lay).parallelism.tp_comm_overlap == "async"
    assert screen.scenario(lay).parallelism.tp_comm_overlap is True


def test_the_gradient_reduction_after_backward_exposes_its_whole_ring():
    """DDP on 32 ranks of 4 DGX A100: beside backward the all-reduce hides up to the backward's compute (the rest
    exposed, what hides slows the kernels by NCCL's SMs); after backward all of it is exposed, a ring of the
    gradient's bytes over 32 ranks, 8 a node (2(n - 1)/n S/B and NCCL's latency: Screen.ring_s)."""
    b = megatron_2021_base()
    screen = Screen(b, Cluster(cluster_spec(b), 4))
    on = Layout(1, 1, 1, 32, 1, 1, "ddp", "none", grad_overlap=True)
    off = dataclasses.replace(on, grad_overlap=False)
    e_on, e_off = screen.estimate(on), screen.estimate(off)
    _, _, back, rc, _, w, s, _ = screen._block_times(on)
    ring = screen.ring_s("all_reduce", 32, 8, w.params_per_rank * screen._state_bytes[1])
    assert e_off.comm_s == pytest.approx(ring, rel=1e-12) and ring > 0
    exposed = max(0.0, ring - 24 * (back + rc))
    assert e_on.comm_s == pytest.approx(exposed, rel=1e-12)
    hidden = ring - exposed
    gap = e_off.iteration_s - e_on.iteration_s
    assert gap == pytest.approx(hidden * (2 - screen.contention), rel=1e-9) and gap > 0
    assert e_on.memory_gib == e_off.memory_gib  # Megatron's grad buffer is its buckets: no copy either way


def test_sequence_parallelism_divides_the_norm_and_dropout_activations_by_tp():
    """Korthikanti et al. 2022 (Table 2) with FlashAttention: sbh(10 + 24/t) bytes a layer without SP, 34 sbh/t
    with it; the screen's activations follow the scenario's switch."""
    data = megatron_2021_base().model_dump(mode="json", exclude_none=True)
    data["model"]["attention"] = "flash"
    b = load_scenario(data)
    screen = Screen(b, Cluster(cluster_spec(b), 4))
    sp, no = (Layout(4, 1, 1, 8, 1, 1, "ddp", "none", sp=x, tp_overlap=False) for x in (True, False))
    a_sp = activation_bytes_per_layer(screen._shape(sp)[0])
    a_no = activation_bytes_per_layer(screen._shape(no)[0])
    sbh = 2048 * 1 * 2048
    assert a_no - a_sp == pytest.approx(sbh * (10 - 10 / 4), rel=0.02)


def test_the_screen_takes_memory_first_and_times_only_what_fits():
    """With ``prune`` a layout that cannot fit keeps its memory and has no time; the rest are the same estimates."""
    b = megatron_2021_base()
    cluster = Cluster(cluster_spec(b), 4)
    lays = candidates(b, 32, 8, {"shardings": ("ddp", "zero1"), "switches": True})
    full, pruned = Screen(b, cluster), Screen(b, cluster)
    full.capacity = pruned.capacity = 8 * 2**30  # most layouts of this 24-layer model cannot fit 8 GiB
    pruned.prune = True
    a, z = [full.estimate(x) for x in lays], [pruned.estimate(x) for x in lays]
    assert 0 < sum(e.fits for e in a) < len(a) / 2
    for x, y in zip(a, z, strict=True):
        assert (x.memory_gib, x.fits) == (y.memory_gib, y.fits)
        assert y.iteration_s == (x.iteration_s if x.fits else math.inf)


def test_plan_with_switches_confirms_what_run_gives():
    b = megatron_2021_base()
    r = plan(
        b,
        32,
        top=2,
        options={
            "switches": True,
            "tp": (2,),
            "pp": (2,),
            "micro_batch_sizes": (1,),
            "shardings": ("zero1",),
        },
    )
    assert r["screened"] == len(
        candidates(
            b,
            32,
            8,
            {"switches": True, "tp": (2,), "pp": (2,), "micro_batch_sizes": (1,), "shardings": ("zero1",)},
        )
    )
    for row in r["top"]:
        assert row["sp"] is not None and row["grad_overlap"] is not None
        again = simulate(load_scenario(row["scenario"])).metrics.iteration_time_s
        assert again == pytest.approx(row["iteration_time_s"], rel=1e-9)


def test_op_evolve_is_dataclasses_replace():
    op = gemm("fc1", 4096, 8192, 2048, linear=True)
    hash(op)  # a cached hash must not travel to the copy
    for changes in ({"m": 1024, "flops": 1.0}, {"recompute": True}, {"module": "mlp", "name": "x"}):
        new = op.evolve(**changes)
        assert new == dataclasses.replace(op, **changes) and hash(new) == hash(
            dataclasses.replace(op, **changes)
        )
    assert op.evolve() == op and op.evolve() is not op


def test_cli_plan_switches_and_mbs_max():
    got = runner.invoke(app, [*PLAN_ARGS, "--switches", "--mbs-max", "2", "--top", "1", "--json"])
    assert got.exit_code == 0, got.output
    r = json.loads(got.output)
    pick = r["top"][0]
    assert pick["mbs"] <= 2 and (pick["tp"] == 1 or pick["sp"] is not None)
    bad = runner.invoke(app, [*PLAN_ARGS, "--mbs-max", "0"])
    assert bad.exit_code == 2 and "--mbs-max" in bad.output


def test_activation_offloading_holds_two_layers_on_the_gpu_as_the_simulation_does():
    """Calculon's ``activations_offload``: every layer but the last offloaded (Megatron-Core --cpu-offloading);
    Transformer Engine's double buffer keeps two offloaded layers' activations on the GPU (workload/offload.py),
    so the screen's activations fall by 24 - 1 - 2 layers' worth, with the allocator's reserve; the simulation's
    peak falls by as much, within 2%."""
    b = megatron_2021_base()
    screen = Screen(b, Cluster(cluster_spec(b), 4))
    kept = Layout(1, 1, 1, 32, 1, 1, "zero1", "none", act_offload=0)
    away = dataclasses.replace(kept, act_offload=23)
    assert (
        away.label().endswith("act-offload:23")
        and screen.scenario(away).training.activation_offload_layers == 23
    )
    s = screen._shape(kept)[0]
    per_layer = screen._activations(kept, s)[0]
    drop = (screen.estimate(kept).memory_gib - screen.estimate(away).memory_gib) * 2**30
    assert (
        drop == pytest.approx(per_layer * 21 * (1 + s.memory.allocator_fragmentation), rel=1e-9) and drop > 0
    )
    runs = [simulate(screen.scenario(x)).metrics for x in (kept, away)]
    assert runs[0].memory_gib["device"] - runs[1].memory_gib["device"] == pytest.approx(
        drop / 2**30, rel=0.02
    )
    # the copies as the node's 8 GPUs make them at once over its PCIe: the screen's time is the simulation's
    # (alone, one GPU's copies would take half as long: the screen had that at first)
    assert screen.estimate(away).iteration_s == pytest.approx(runs[1].iteration_time_s, rel=0.02)
    assert runs[1].iteration_time_s > 5 * runs[0].iteration_time_s  # 142 MB a layer each way, over PCIe
    lays = candidates(
        b, 32, 8, {"switches": True, "pp": (1,), "shardings": ("zero1",), "micro_batch_sizes": (1,)}
    )
    assert {x.act_offload for x in lays if x.recompute != "full"} == {0, 23}
    assert {x.act_offload for x in lays if x.recompute == "full"} == {0}


def test_emit_names_activation_offloading_for_megatron():
    """Megatron-LM has the option from core_v0.16.0 only (arguments.py there: --cpu-offloading-num-layers N sets
    cpu_offloading); the emitted arguments, checked against core_v0.15.0's parser, say it as a note."""
    from simulator.study.emit import megatron
    from simulator.study.plan import Confirmed

    b = megatron_2021_base()
    screen = Screen(b, Cluster(cluster_spec(b), 4))
    lay = Layout(1, 1, 1, 32, 1, 1, "zero1", "none", act_offload=23)
    sc = screen.scenario(lay).model_dump(mode="json", exclude_defaults=True)
    row = Confirmed(lay, 1.0, 1.0, 0.5, 9.0, 0.0, 0.0, 1.0, "ok", scenario=sc).to_dict()
    text = megatron(row)
    assert "# activation offloading: --cpu-offloading-num-layers 23" in text
    assert "\n--cpu-offloading" not in text
