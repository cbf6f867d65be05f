"""Each class of bad input found by hand (the hardening issue's list): the message names the field and the reason,
exit 2; the honest answers for inputs that are valid but out of the simulator's reach."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simulator.cli import app

ROOT = Path(__file__).parents[1]
runner = CliRunner()
BASE = {
    "name": "q",
    "model": {"preset": "gpt3-125m", "seq_length": 512},
    "cluster": {"topology": "dgx-a100", "num_nodes": 1},
    "training": {"global_batch_size": 16, "micro_batch_size": 2},
    "parallelism": {"data_parallel": 8},
}


def scenario(tmp_path: Path, **sections) -> str:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for key, value in sections.items():
        replaces = key == "model" and isinstance(value, dict) and {"hf_config", "preset"} & set(value)
        if isinstance(value, dict) and isinstance(data.get(key), dict) and not replaces:
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def gpu_file(tmp_path: Path, drop: str = "", **fields) -> str:
    """The shipped A100 80 GB's GPU file with ``fields`` changed (and ``drop`` removed), as a path."""
    gpu = yaml.safe_load((ROOT / "simulator" / "hardware" / "gpus" / "a100-sxm4-80gb.yaml").read_text())
    gpu.update(fields)
    gpu.pop(drop, None)
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(gpu))
    return str(path)


def topology(tmp_path: Path, **node) -> str:
    topo = yaml.safe_load((ROOT / "topologies" / "dgx-a100.yaml").read_text())
    topo["node"].update(node)
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(topo))
    return "t.yaml"  # relative: found beside the scenario file


def error_of(args: list[str]) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def two_nodes(tmp_path, topo):
    return scenario(tmp_path, cluster={"topology": topo, "num_nodes": 2}, parallelism={"data_parallel": 16})


CASES = {
    "markup in a key": (lambda t: scenario(t, **{"foo[/x]": 1}), "foo[/x]: unknown key"),
    "markup in a value": (lambda t: scenario(t, training={"precision": "[/x]"}), "training.precision"),
    "deepspeed path not a string": (
        lambda t: scenario(t, deepspeed_config=5),
        "deepspeed_config: expected a file path",
    ),
    "hf_config not a string": (
        lambda t: scenario(t, model={"hf_config": True}),
        "model.hf_config: expected a file path",
    ),
    "preset a list": (
        lambda t: scenario(t, model={"preset": ["a", "b"], "seq_length": 512}),
        "unknown model preset",
    ),
    "negative NIC bandwidth": (
        lambda t: two_nodes(t, topology(t, nic_bandwidth_gbps=-200)),
        "node.nic_bandwidth_gbps: Input should be greater than or equal to 0.01",
    ),
    "NaN NIC bandwidth": (
        lambda t: two_nodes(t, topology(t, nic_bandwidth_gbps=float("nan"))),
        "node.nic_bandwidth_gbps: Input should be a finite number",
    ),
    "zero host bandwidth": (
        lambda t: scenario(t, cluster={"topology": topology(t, host_memory_bandwidth_GBps=0)}),
        "node.host_memory_bandwidth_GBps: Input should be greater than or equal to 0.01",
    ),
    "infinite host memory": (
        lambda t: scenario(t, cluster={"topology": topology(t, host_memory_gib=float("inf"))}),
        "node.host_memory_gib: Input should be a finite number",
    ),
    "PCIe GPU in an NVSwitch node": (
        lambda t: scenario(t, cluster={"gpu": "a100-pcie-80gb"}),
        "a100-pcie-80gb has no NVLink",
    ),
    "a billion micro-batches": (
        lambda t: scenario(t, training={"global_batch_size": 16 * 10**9}),
        "= 1,000,000,000 micro-batches per iteration",
    ),
    "a million NICs": (lambda t: scenario(t, cluster={"nics_per_node": 10**6}), "cluster.nics_per_node"),
    "a billion nodes": (lambda t: scenario(t, cluster={"num_nodes": 10**9}), "cluster.num_nodes"),
    "framework escaping its directory": (
        lambda t: scenario(t, framework="../hardware/gpus/a100-sxm4-80gb"),
        "framework: ",
    ),
    "unknown framework name": (
        lambda t: scenario(t, framework="megatron-2099"),
        "unknown framework 'megatron-2099'",
    ),
    "hub id": (
        lambda t: scenario(t, model={"hf_config": "meta-llama/Llama-3.1-8B"}),
        "looks like a Hugging Face hub id",
    ),
    "fp8 on A100": (
        lambda t: scenario(t, training={"precision": "fp8"}),
        "training.precision: fp8 needs FP8 tensor cores; a100-sxm4-80gb (ampere) has none",
    ),
    "unknown fp8 recipe": (
        lambda t: scenario(t, training={"precision": "fp8", "fp8": {"recipe": "fp8-magic"}}),
        "training.fp8.recipe",
    ),
    "mxfp8 on Hopper": (
        lambda t: scenario(
            t,
            cluster={"topology": "dgx-h100", "num_nodes": 1},
            training={"precision": "fp8", "fp8": {"recipe": "mxfp8"}},
        ),
        "training.fp8.recipe: mxfp8 needs block-scaled tensor cores (Blackwell); h100-sxm5-80gb is hopper",
    ),
    "fp8 param gather without sharding": (
        lambda t: scenario(
            t,
            cluster={"topology": "dgx-h100", "num_nodes": 1},
            training={"precision": "fp8", "fp8": {"param_gather": True}},
        ),
        "training.fp8.param_gather: weights are all-gathered only when they are sharded",
    ),
    "gpu file with fp8 below bf16": (
        lambda t: scenario(t, cluster={"gpu": gpu_file(t, peak_tflops={"bf16": 989, "fp8": 500})}),
        "peak_tflops.fp8: 500.0 is below the 989.0 of the wider type",
    ),
    "gpu file with tiny hbm": (
        lambda t: scenario(t, cluster={"gpu": gpu_file(t, hbm_gib=0.5)}),
        "hbm_gib: Input should be greater than or equal to 1",
    ),
    "gpu file with nan": (
        lambda t: scenario(t, cluster={"gpu": gpu_file(t, hbm_bandwidth_GBps=float("nan"))}),
        "hbm_bandwidth_GBps: Input should be a finite number",
    ),
    "gpu file missing a field": (
        lambda t: scenario(t, cluster={"gpu": gpu_file(t, drop="sm_count")}),
        "sm_count: Field required",
    ),
    "unknown gpu": (lambda t: scenario(t, cluster={"gpu": "h900"}), "cluster.gpu: unknown GPU 'h900'"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_names_the_field_in_one_line(tmp_path, name):
    make, expected = CASES[name]
    assert expected in error_of(["run", make(tmp_path), "--quiet"])


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"\xff\xfe\x80", "not UTF-8 text"),
        (b"a: " + b"[" * 1000 + b"]" * 1000, "nested deeper than 32 levels"),
        (
            b"a: &a [x,x,x,x,x,x,x,x,x]\n"
            + b"".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n".encode()
                for i in range(9)
            )
            + b"model: *j\n",
            "expands to more than 200,000 values",
        ),
        (b"a: &a [*a]\n", "contains itself"),
    ],
)
def test_hostile_files_are_bounded(tmp_path, content, expected):
    (tmp_path / "s.yaml").write_bytes(content)
    assert expected in error_of(["run", str(tmp_path / "s.yaml")])


@pytest.mark.parametrize(
    "ds, expected",
    [
        ([1, 2], "expected a JSON object"),
        (None, "expected a JSON object, got null"),
        ({"bf16": True}, 'bf16 must be an object (e.g. "bf16": {"enabled": true})'),
        ({"optimizer": "adam"}, "optimizer must be an object"),
        ({"zero_optimization": 3}, "zero_optimization must be an object"),
        (
            {"zero_optimization": {"offload_param": "cpu"}},
            "zero_optimization.offload_param must be an object",
        ),
    ],
)
def test_deepspeed_sections_must_be_objects(tmp_path, ds, expected):
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    assert expected in error_of(["run", scenario(tmp_path), "--deepspeed-config", str(tmp_path / "ds.json")])


@pytest.mark.parametrize("target", ["dir", "missing/x.json", "file-in-a-file"])
def test_outputs_are_checked_before_simulating(tmp_path, target):
    (tmp_path / "file-in-a-file").write_text("")
    out = {"dir": tmp_path, "missing/x.json": tmp_path / "missing" / "x.json"}.get(
        target, tmp_path / "file-in-a-file" / "x.json"
    )
    line = error_of(["run", scenario(tmp_path), "--trace", str(out)])
    assert line.startswith("error: --trace")
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]


def test_validate_cases_need_a_finite_positive_value_and_a_known_convention(tmp_path):
    case = {"id": "X", **{k: BASE[k] for k in ("model", "cluster", "training", "parallelism")}}
    for published, expected in [
        ({"metric": "iteration_time_s", "value": 0}, "must be a finite number above 0"),
        ({"metric": "iteration_time_s", "value": float("nan")}, "must be a finite number above 0"),
        (
            {"metric": "model_tflops_per_gpu", "value": 100, "flop_convention": "mine"},
            "flop_convention 'mine'",
        ),
    ]:
        (tmp_path / "c.yaml").write_text(yaml.safe_dump({"cases": [{**case, "published": published}]}))
        assert expected in error_of(["validate", "--cases", str(tmp_path / "c.yaml")])


def test_topology_and_framework_paths_are_relative_to_the_scenario_file(tmp_path, monkeypatch):
    sub = tmp_path / "sub"
    sub.mkdir()
    topology(sub, nic_bandwidth_gbps=100)
    (sub / "fw.yaml").write_text((ROOT / "simulator" / "frameworks" / "pytorch-2024.yaml").read_text())
    path = scenario(sub, cluster={"topology": "t.yaml"}, framework="fw.yaml")
    monkeypatch.chdir(tmp_path)  # not the scenario's directory
    r = runner.invoke(app, ["run", path, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["framework"] == "pytorch-2024"


def test_hugging_face_configs_are_honest(tmp_path):
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "intermediate_size": 512,
        "max_position_embeddings": 131072,
        "vocab_size": 1024,
        "hidden_act": "silu",
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    line = error_of(["run", scenario(tmp_path, model={"hf_config": "config.json"})])
    assert "seq_length is required with hf_config" in line and "131072" in line
    # a mixture-of-experts family this reader does not know is refused, not simulated as a dense model
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "dbrx", "num_experts": 16}))
    line = error_of(["run", scenario(tmp_path, model={"hf_config": "config.json", "seq_length": 512})])
    assert "mixture-of-experts model (16 experts) of model_type 'dbrx'" in line and "model.moe" in line
    # a known family missing a field it cannot default: the field is named
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen2_moe", "num_experts": 8}))
    line = error_of(["run", scenario(tmp_path, model={"hf_config": "config.json", "seq_length": 512})])
    assert "a qwen2_moe config needs num_experts_per_tok" in line


def test_out_of_memory_is_the_headline_with_changes_that_fit_and_exit_3(tmp_path):
    path = scenario(
        tmp_path, model={"preset": "llama2-7b", "seq_length": 4096}, training={"micro_batch_size": 1}
    )
    r = runner.invoke(app, ["run", path])
    assert r.exit_code == 3, r.output
    first = r.stdout.splitlines()[0]
    assert first.startswith("OUT OF MEMORY: ") and "> 80 GiB: peak allocation" in first
    assert "CUDA context, NCCL buffers and any allocator reserve you set" in " ".join(r.stdout.split())
    # the cheapest change first: ZeRO-1 moves no more bytes than DDP, ZeRO-3 gathers the weights every layer
    assert "Would fit: zero_stage: 1" in " ".join(r.stdout.split())
    assert "cheapest first" in " ".join(r.stdout.split())
    d = json.loads(runner.invoke(app, ["run", path, "--json"]).stdout)
    assert d["oom"] and [f["change"] for f in d["would_fit"]][:2] == ["zero_stage: 1", "zero_stage: 2"]
    assert d["would_fit"][0]["device_gib"] < d["would_fit"][0]["capacity_gib"] == 80


def test_attention_follows_the_framework_unless_given(tmp_path):
    flash = json.loads(runner.invoke(app, ["run", scenario(tmp_path), "--json"]).stdout)
    path = scenario(tmp_path, model={"attention": "standard"})
    standard = json.loads(runner.invoke(app, ["run", path, "--json"]).stdout)
    assert flash["framework"] == "pytorch-2024"  # SDPA runs FlashAttention
    assert flash["memory_gib"]["activations"] < standard["memory_gib"]["activations"]


def test_no_flash_attention_on_volta(tmp_path):
    """FlashAttention needs Turing / Ampere or newer: on V100 ``auto`` runs standard attention whatever the
    framework's default, an explicit ``flash`` is refused, and so is context parallelism (ring attention)."""
    v100 = {
        "cluster": {"topology": "dgx2-v100", "num_nodes": 1},
        "training": {"precision": "fp16", "global_batch_size": 32},
        "parallelism": {"data_parallel": 16},
    }
    d = json.loads(runner.invoke(app, ["run", scenario(tmp_path, **v100), "--json"]).stdout)
    assert d["framework"] == "pytorch-2024" and d["attention"] == "standard"
    message = error_of(["run", scenario(tmp_path, **v100, model={"attention": "flash"})])
    assert "model.attention: flash does not run on v100-sxm-32gb" in message
    cp = {**v100, "parallelism": {"data_parallel": 8, "context_parallel": 2}}
    assert "needs FlashAttention, which does not run on v100-sxm-32gb" in error_of(
        ["run", scenario(tmp_path, **cp)]
    )


def test_shipped_scenarios_run_by_name_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    listed = json.loads(runner.invoke(app, ["scenarios", "--json"]).stdout)
    assert "quickstart-gpt3-1.3b-ddp-8xa100" in {s["name"] for s in listed}
    r = runner.invoke(app, ["run", "quickstart", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["name"] == "gpt3-1.3b-ddp-8xa100"
    assert "matches 10 shipped scenarios" in error_of(["run", "mds-2node"])
    assert runner.invoke(app, ["init"]).exit_code == 0
    assert runner.invoke(app, ["run", "scenario.yaml", "--json"]).exit_code == 0
    assert "exists (use --force" in error_of(["init"])


LONG = "a" * 300  # over Linux's 255-byte NAME_MAX: pathlib's exists() / is_file() raise OSError on it


@pytest.mark.parametrize(
    "args, expected",
    [
        (lambda t: ["run", LONG], "error: scenario: name too long (300 bytes in one path component"),
        (lambda t: ["run", LONG + ".yaml"], f"error: {LONG}.yaml: name too long (305 bytes"),
        (
            lambda t: ["run", scenario(t, cluster={"topology": LONG})],
            f"error: cluster.topology: unknown topology '{LONG}'",
        ),
        (
            lambda t: ["run", scenario(t, cluster={"topology": LONG + ".yaml"})],
            "error: cluster.topology: ",
        ),
        (lambda t: ["run", scenario(t, framework=LONG)], f"error: framework: unknown framework '{LONG}'"),
        (lambda t: ["run", scenario(t, cluster={"gpu": LONG})], f"error: cluster.gpu: unknown GPU '{LONG}'"),
        (lambda t: ["run", scenario(t, deepspeed_config=LONG + ".json")], "error: deepspeed_config: "),
        (
            lambda t: ["run", scenario(t, model={"hf_config": LONG + ".json"})],
            "error: model.hf_config: name too long (305 bytes",
        ),
        (lambda t: ["run", "quickstart", "--kernels", LONG], "error: --kernels: name too long (300 bytes"),
        (lambda t: ["run", "quickstart", "--trace", LONG + ".json"], "error: --trace: name too long"),
        (lambda t: ["run", "quickstart", "--report", LONG + ".html"], "error: --report: name too long"),
        (lambda t: ["init", str(t / (LONG + ".yaml"))], "error: init: name too long"),
        (lambda t: ["memory", LONG], "error: scenario: name too long"),
    ],
    ids=lambda v: "" if callable(v) else v.split(":")[1].strip()[:30],
)
def test_names_too_long_for_the_file_system_are_one_line(tmp_path, args, expected):
    """A name of 256+ bytes (a scenario, topology, framework, GPU, DeepSpeed or HF config, cost table, output
    file): one line naming the field, never the OSError (ENAMETOOLONG) that pathlib raises."""
    message = error_of(args(tmp_path))
    assert message.startswith(expected), message
    if "name too long" in message:
        assert "this system allows 255 per component" in message


@pytest.mark.parametrize(
    "section, field",
    [
        ("cluster", "nic_bandwidth_gbps"),
        ("cluster", "pcie_bandwidth_GBps"),
        ("cluster", "nvme_bandwidth_GBps"),
    ],
)
def test_rates_have_a_physical_floor(tmp_path, section, field):
    """5e-324 passes gt=0 and overflowed the times it divides: every rate is bounded below (10 MB/s or Mb/s)."""
    message = error_of(["run", scenario(tmp_path, **{section: {field: 5e-324}})])
    assert message.startswith(f"error: {section}.{field}: Input should be greater than or equal to 0.01"), (
        message
    )


def test_a_topology_rate_has_the_same_floor(tmp_path):
    path = scenario(tmp_path, cluster={"topology": topology(tmp_path, nic_bandwidth_gbps=1e-9)})
    message = error_of(["run", path])
    assert "node.nic_bandwidth_gbps" in message and "greater than or equal to 0.01" in message, message


def test_plan_on_part_of_a_node_says_so_and_plans_those_gpus():
    """``plan --gpus 3`` on 8-GPU nodes planned 8 GPUs without a word: it plans 3 (cluster.gpus_per_node: 3) and
    says so; a count that is more than a node and not whole nodes is refused."""
    model = ["--model", "gpt3-125m", "--topology", "dgx-a100"]
    args = ["plan", *model, "--global-batch-size", "12", "--top", "2"]
    r = runner.invoke(app, [*args, "--gpus", "3", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["top"]
    for row in d["top"]:
        assert row["tp"] * row["pp"] * row["cp"] * row["dp"] == 3, row
        assert row["scenario"]["cluster"]["gpus_per_node"] == 3
    r = runner.invoke(app, [*args, "--gpus", "3", "--quiet"])
    assert "note: --gpus 3 is part of one 8-GPU dgx-a100 node: planning 3 of its GPUs" in r.stderr
    assert (
        error_of([*args, "--gpus", "12"])
        == "error: --gpus (12) is not a whole number of 8-GPU nodes of dgx-a100"
    )


def test_a_sweep_of_a_plain_scenario_says_what_to_add(tmp_path):
    message = error_of(["sweep", "quickstart", "--out", str(tmp_path / "o")])
    assert message.endswith(
        "a scenario with no vary: section; give --vary FIELD=v1,v2,... or a sweep file with base: and vary:"
    ), message
    sweep = tmp_path / "sw.yaml"
    sweep.write_text("base: {}\nvary: {training.micro_batch_size: [1]}\nout: 5\n")
    assert error_of(["sweep", str(sweep)]) == f"error: {sweep}: out: expected a path (a string), got 5"


def test_a_vocabulary_smaller_than_tensor_parallel_is_named():
    """Issue 63 (found by tests/test_hostile_moe_gpu.py): vocab_size 1 at TP 2 was a ZeroDivisionError in a GEMM
    of width 0."""
    from conftest import GPT_SMALL, make

    from simulator.errors import ScenarioError

    with pytest.raises(ScenarioError, match=r"model\.vocab_size \(1\) is smaller than tensor_parallel \(2\)"):
        make(model={**GPT_SMALL, "vocab_size": 1}, parallelism={"tensor_parallel": 2})
