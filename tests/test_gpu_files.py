"""GPU files of one's own (docs/hardware.md): a copy under a new name or a file derived from a shipped GPU
(``base:``) runs every strategy and simulates exactly as its base when no number differs; bad numbers and keys are
refused with the field named (issue 63)."""

import re
from pathlib import Path

import pytest
import yaml

from simulator import load_scenario, simulate
from simulator.errors import ScenarioError
from simulator.hardware.gpus import MEMORY_KERNEL_KINDS, get_gpu
from simulator.tables.format import KERNEL_OPS

SHIPPED = Path(__file__).resolve().parents[1] / "simulator" / "hardware" / "gpus"


def scenario(tmp_path, gpu, parallelism, topology="dgx-h100", model="llama3-8b"):
    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "model": {"preset": model},
                "cluster": {"topology": topology, "num_nodes": 1, "gpu": gpu},
                "training": {"global_batch_size": 16, "micro_batch_size": 1},
                "parallelism": parallelism,
            }
        )
    )
    return path


LAYOUTS = {
    "megatron": {"tensor_parallel": 2, "pipeline_parallel": 2, "data_parallel": 2},
    "fsdp": {"fsdp": {}},
    "zero3": {"zero_stage": 3},
    "ddp": {},
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_copy_under_a_new_name_and_a_derived_file_simulate_as_their_base(tmp_path, layout):
    """The copy keeps H100's profile factors (pytorch-2024's Hopper ones) and cost table: it is the same part; the
    derived file (base: h100-sxm5-80gb, 96 GB) differs only in its capacity."""
    copy = yaml.safe_load((SHIPPED / "h100-sxm5-80gb.yaml").read_text())
    copy["name"] = "my-h100"
    (tmp_path / "my-h100.yaml").write_text(yaml.safe_dump(copy))
    (tmp_path / "derived.yaml").write_text("name: my-96gb\nbase: h100-sxm5-80gb\nhbm_gib: 96\n")
    runs = {}
    for gpu in ("h100-sxm5-80gb", "my-h100.yaml", "derived.yaml"):  # relative paths: beside the scenario
        r = simulate(load_scenario(scenario(tmp_path, gpu, LAYOUTS[layout])))
        runs[gpu] = r.metrics
    base = runs["h100-sxm5-80gb"]
    for gpu in ("my-h100.yaml", "derived.yaml"):
        m = runs[gpu]
        assert m.iteration_time_s == base.iteration_time_s, gpu
        assert (m.framework, m.cost_tables["table"]) == (base.framework, base.cost_tables["table"]), gpu
    assert runs["derived.yaml"].memory_gib["capacity"] == 96 != base.memory_gib["capacity"]
    assert get_gpu(str(tmp_path / "derived.yaml")).lineage == "h100-sxm5-80gb"
    assert get_gpu(str(tmp_path / "my-h100.yaml")).lineage == "h100-sxm5-80gb"


def test_a_gpu_file_with_other_numbers_is_its_own_part(tmp_path):
    copy = yaml.safe_load((SHIPPED / "h100-sxm5-80gb.yaml").read_text())
    copy.update(name="faster", hbm_bandwidth_GBps=4000)
    (tmp_path / "faster.yaml").write_text(yaml.safe_dump(copy))
    assert get_gpu(str(tmp_path / "faster.yaml")).lineage == "faster"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gemm": {"max_efficiency": 5e-324}}, "gemm.max_efficiency"),
        ({"memory_efficiency": 5e-324}, "memory_efficiency"),
        ({"flash_attention_efficiency": 1e-9}, "flash_attention_efficiency"),
        (
            {"memory_kernels": {"softmax": {"forward": 5e-324, "backward": 0.4}}},
            "memory_kernels.softmax.forward",
        ),
        ({"memory_kernels": {"softmx": {"forward": 0.6, "backward": 0.4}}}, "memory_kernels.softmx"),
        ({"base": "h100-sxm9"}, "base"),
    ],
)
def test_a_gpu_file_with_a_number_no_measurement_gives_or_an_unknown_key_is_refused(tmp_path, change, field):
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"name": "g", "base": "h100-sxm5-80gb", **change}))
    with pytest.raises(ScenarioError, match=re.escape(field)):
        get_gpu(str(path))


def test_an_empty_gpu_name_is_refused():
    data = {
        "name": "s",
        "model": {"preset": "gpt3-125m"},
        "cluster": {"topology": "dgx-a100", "gpu": ""},
        "training": {"global_batch_size": 8, "micro_batch_size": 1},
    }
    with pytest.raises(ScenarioError, match=r"cluster\.gpu"):
        load_scenario(data)


def test_a_topologys_nvls_efficiency_is_bounded_like_the_others(tmp_path):
    topo = yaml.safe_load((Path(__file__).resolve().parents[1] / "topologies" / "dgx-h100.yaml").read_text())
    topo["efficiency"]["nvls"] = 1e-9
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(topo))
    data = {
        "name": "s",
        "model": {"preset": "gpt3-125m"},
        "cluster": {"topology": str(tmp_path / "t.yaml")},
        "training": {"global_batch_size": 8, "micro_batch_size": 1},
    }
    with pytest.raises(ScenarioError, match=r"efficiency\.nvls"):
        load_scenario(data)


def test_the_memory_kernel_kinds_are_the_workloads_memory_bound_ones():
    compute = {"gemm", "batched_gemm", "grouped_gemm", "flash_attention", "adam_step", "sgd_step"}
    assert set(MEMORY_KERNEL_KINDS) == set(KERNEL_OPS) - compute


def test_every_shipped_h100_scenario_runs_on_a_renamed_copy_as_on_the_h100(tmp_path):
    """Every strategy the shipped H100 scenarios hold (Megatron 3D and 4D with CP, FP8, MoE with EP, FSDP2 with
    TP, HSDP, ZeRO++, offload, ...) on a byte-for-byte copy of the H100 file under a new name: the same time, peak
    memory, profile and cost table (issue 63: nothing keys on the GPU's name)."""
    from simulator.hardware.topology import cluster_spec
    from simulator.scenario.shipped import shipped_scenarios

    copy = yaml.safe_load((SHIPPED / "h100-sxm5-80gb.yaml").read_text())
    copy["name"] = "my-h100"
    (tmp_path / "my-h100.yaml").write_text(yaml.safe_dump(copy))
    ran = 0
    for path in shipped_scenarios():
        s = load_scenario(path)
        if cluster_spec(s).node.gpu != "h100-sxm5-80gb":
            continue
        mine = s.model_copy(
            update={"cluster": s.cluster.model_copy(update={"gpu": str(tmp_path / "my-h100.yaml")})}
        )
        a, b = simulate(s).metrics, simulate(mine).metrics
        assert b.iteration_time_s == a.iteration_time_s, path
        assert b.memory_gib["peak"] == a.memory_gib["peak"], path
        assert (b.framework, b.cost_tables["table"]) == (a.framework, a.cost_tables["table"]), path
        ran += 1
    assert ran >= 15
