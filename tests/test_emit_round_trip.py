"""A torchtitan TOML job config as a scenario's input (scenario/torchtitan.py), checked against torchtitan's own
keys; and plan's emitted launch files (study/emit.py) checked against the frameworks' own config keys at pinned
versions, then read back: emit, parse, simulate the parsed config, the plan's time (issue 62)."""

import json
import re
import tomllib
import warnings
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simulator import load_scenario, simulate
from simulator.cli import app
from simulator.errors import ScenarioError
from simulator.scenario.torchtitan import TorchtitanConfigWarning
from simulator.study.emit import emit_text

runner = CliRunner()
DATA = Path(__file__).resolve().parent / "data"


def keys(name: str) -> dict[str, set[str] | None]:
    """A key list of tests/data: key -> its allowed values (a Literal's) or None."""
    out = {}
    for line in (DATA / name).read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, values = line.partition("# values:")
        out[key.strip()] = {v.strip() for v in values.split(",")} if values else None
    return out


TORCHTITAN = keys("torchtitan-238fa995-job-config-keys.txt")
DEEPSPEED = keys("deepspeed-v0.16.4-config-keys.txt")


def scenario(tmp_path: Path, toml: str, **extra) -> Path:
    (tmp_path / "job.toml").write_text(toml)
    data = {
        "name": "tt",
        "model": {"preset": "llama3-8b"},
        "cluster": {"topology": "dgx-h100", "num_nodes": 2},
        "torchtitan_config": "job.toml",
        **extra,
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def read_back(path, data: dict, warning) -> float:
    """The iteration time of the scenario ``data`` written to ``path``, its launch file read with ``warning`` an
    error: every key or flag emitted must be one the reader reads."""
    path.write_text(yaml.safe_dump(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error", warning)
        return simulate(load_scenario(path)).metrics.iteration_time_s


def test_a_torchtitan_job_fills_the_scenario_as_torchtitan_reads_it(tmp_path):
    """HSDP (replicate 2 x shard 4) with async TP 2 on 16 H100: 8 data-parallel ranks in FSDP2 shard groups of 4,
    reducing in fp32; TP with its sequence-parallel norms and async TP; local batch 2 per rank, 64 globally (4
    accumulation steps); sequence 4,096; full checkpointing; compiled."""
    toml = """
[training]
local_batch_size = 2
global_batch_size = 64
seq_len = 4096
mixed_precision_param = "bfloat16"
[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = 4
tensor_parallel_degree = 2
enable_async_tensor_parallel = true
[activation_checkpoint]
mode = "full"
[compile]
enable = true
[metrics]
log_freq = 10
"""
    s = load_scenario(scenario(tmp_path, toml))
    p, t = s.parallelism, s.training
    assert (p.data_parallel, p.tensor_parallel, p.pipeline_parallel) == (8, 2, 1)
    assert p.fsdp.hybrid_shard_size == 4 and p.fsdp.reshard_after_forward and p.fsdp.reduce_in_fp32
    assert p.sequence_parallel and p.tp_comm_overlap == "async"
    assert (t.micro_batch_size, t.global_batch_size, s.gradient_accumulation_steps) == (2, 64, 4)
    assert (s.model.seq_length, t.activation_recompute, t.compile, t.precision) == (
        4096,
        "full",
        True,
        "bf16",
    )


def test_shard_degree_minus_one_and_an_interleaved_pipeline(tmp_path):
    """data_parallel_shard_degree -1 takes what the others leave: 16 / (PP 2) = 8; Interleaved1F1B with 4 layers
    a stage: 32 / (2 x 4) = 4 virtual stages; micro-batches of pipeline_parallel_microbatch_size."""
    toml = """
[training]
local_batch_size = 8
[parallelism]
data_parallel_shard_degree = -1
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "Interleaved1F1B"
pipeline_parallel_layers_per_stage = 4
pipeline_parallel_microbatch_size = 2
fsdp_reshard_after_forward = "never"
[activation_checkpoint]
mode = "none"
"""
    s = load_scenario(scenario(tmp_path, toml))
    p = s.parallelism
    assert (p.data_parallel, p.pipeline_parallel, p.pipeline_schedule, p.virtual_pipeline_stages) == (
        8,
        2,
        "interleaved-1f1b",
        4,
    )
    assert not p.fsdp.reshard_after_forward
    assert (s.training.micro_batch_size, s.training.global_batch_size) == (2, 64)


@pytest.mark.parametrize(
    ("toml", "extra", "message"),
    [
        (
            "[training]\nlocal_batch_size = 2\n",
            {"training": {"micro_batch_size": 4}},
            "contradicts training.micro_batch_size (4)",
        ),
        (
            "[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = 'LoopedBFS'\n",
            {},
            "LoopedBFS",
        ),
        ("[parallelism]\ntensor_parallel_degree = 3\n", {}, "is not a whole number"),
        ("[training\n", {}, "not a TOML file"),
        (
            "[activation_checkpoint]\nmode = 'memory_budget'\n",
            {},
            "activation_checkpoint.mode must be one of none, full, selective",
        ),
        ("training = 3\n", {}, "[training] must be a table"),
    ],
)
def test_a_bad_or_contradicting_torchtitan_config_is_one_line(tmp_path, toml, extra, message):
    path = scenario(tmp_path, toml, **extra)
    with pytest.raises(ScenarioError, match=re.escape(message)):
        load_scenario(path)
    got = runner.invoke(app, ["run", str(path), "--json"])
    assert got.exit_code == 2 and message in got.output


def test_keys_the_simulation_does_not_model_are_listed_once(tmp_path):
    """A modelled section's unknown keys are named in one warning; logging and checkpoint sections are silent."""
    toml = (
        "[training]\nlocal_batch_size = 1\nmy_knob = 3\n[parallelism]\nfoo = 1\n[checkpoint]\nenable = true\n"
    )
    with pytest.warns(
        TorchtitanConfigWarning, match=r"not modelled, ignored: parallelism\.foo, training\.my_knob$"
    ):
        load_scenario(scenario(tmp_path, toml))


def plan_rows(
    stack: str, model: str, gpus: int, batch: int, *extra: str, top: int = 4
) -> tuple[list[dict], dict]:
    args = ["plan", "--model", model, "--gpus", str(gpus), "--topology", "dgx-h100", "--global-batch-size"]
    got = runner.invoke(
        app, [*args, str(batch), "--stack", stack, "--top", str(top), "--json", "--quiet", *extra]
    )
    assert got.exit_code == 0, got.output
    rows = [r for r in json.loads(got.stdout)["top"] if r["status"] == "ok"]
    assert rows
    return rows, rows[0]["scenario"]


def check_toml(text: str) -> dict:
    """Every key of an emitted torchtitan TOML is one torchtitan's JobConfig has, a Literal's value among its."""
    parsed = tomllib.loads(text)
    for section, fields in parsed.items():
        for key, value in fields.items():
            name = f"{section}.{key}"
            assert name in TORCHTITAN, name
            if TORCHTITAN[name] is not None:
                assert str(value) in TORCHTITAN[name], (name, value)
    return parsed


@pytest.mark.parametrize(
    ("model", "gpus", "batch", "extra"),
    [
        ("llama3-8b", 16, 64, ()),
        ("llama3-70b", 64, 256, ()),
        ("llama3-8b", 16, 64, ("--pp", "2", "--tp", "2")),
    ],
)
def test_emitted_torchtitan_configs_are_torchtitans_and_run_to_the_plans_time(
    tmp_path, model, gpus, batch, extra
):
    """plan --stack torchtitan: each confirmed layout emitted as torchtitan TOML has only JobConfig's keys (pinned
    at 238fa995) and, read back as the scenario's torchtitan_config beside the plan's model and cluster, simulates
    to the plan's time."""
    rows, _ = plan_rows("torchtitan", model, gpus, batch, *extra)
    for i, row in enumerate(rows):
        text = emit_text(row, "torchtitan")
        parsed = check_toml(text)
        assert (
            parsed["parallelism"]["data_parallel_shard_degree"]
            * parsed["parallelism"]["data_parallel_replicate_degree"]
            == row["dp"]
        )
        (tmp_path / f"{i}.toml").write_text(text)
        data = {k: row["scenario"][k] for k in ("model", "cluster", "framework")}
        data.update(name=f"rt{i}", torchtitan_config=f"{i}.toml")
        assert read_back(tmp_path / f"{i}.yaml", data, TorchtitanConfigWarning) == pytest.approx(
            row["iteration_time_s"], rel=0.01
        ), row["layout"]


def test_emitted_deepspeed_configs_are_deepspeeds_and_run_to_the_plans_time(tmp_path):
    """plan --stack deepspeed: each emitted JSON has only keys DeepSpeed v0.16.4's parser reads, a stage and an
    offload device among its choices; as the scenario's deepspeed_config beside the plan's model, cluster and
    layout degrees (batch, micro-batch, precision and ZeRO stage from the JSON alone), it simulates to the plan's
    time."""

    def dotted(d: dict, prefix: str = "") -> list[tuple[str, object]]:
        out = []
        for k, v in d.items():
            name = f"{prefix}{k}"
            nested = (
                isinstance(v, dict)
                and name in ("bf16", "fp16", "zero_optimization")
                or name.endswith("offload_optimizer")
            )
            out += dotted(v, f"{name}.") if nested else [(name, v)]
        return out

    rows, _ = plan_rows("deepspeed", "llama3-8b", 16, 64)
    for i, row in enumerate(rows):
        config = json.loads(emit_text(row, "deepspeed"))
        for name, _ in dotted(config):
            assert name in DEEPSPEED, name
        assert config["zero_optimization"]["stage"] in (0, 1, 2, 3)
        offload = config["zero_optimization"].get("offload_optimizer")
        assert offload is None or offload["device"] in ("none", "cpu", "nvme")
        (tmp_path / f"{i}.json").write_text(json.dumps(config))
        s = row["scenario"]
        par = {k: v for k, v in s["parallelism"].items() if k not in ("zero_stage", "zero")}
        training = {
            k: v
            for k, v in s["training"].items()
            if k not in ("global_batch_size", "micro_batch_size", "precision")
        }
        data = {**{k: s[k] for k in ("model", "cluster", "framework")}, "name": f"ds{i}"}
        data.update(training=training, parallelism=par, deepspeed_config=f"{i}.json")
        path = tmp_path / f"{i}.yaml"
        path.write_text(yaml.safe_dump(data))
        got = simulate(load_scenario(path)).metrics.iteration_time_s
        assert got == pytest.approx(row["iteration_time_s"], rel=0.01), row["layout"]


def megatron_options() -> set[str]:
    text = (DATA / "megatron-lm-core_v0.15.0-options.txt").read_text()
    return {line.strip() for line in text.splitlines() if line.startswith("--")}


@pytest.mark.parametrize(
    ("model", "gpus", "batch", "extra"),
    [
        ("llama3-8b", 16, 64, ()),
        ("llama3-70b", 64, 256, ("--pp", "4")),
        ("mixtral-8x7b", 16, 64, ()),
    ],
)
def test_emitted_megatron_arguments_are_megatrons_and_run_to_the_plans_time(
    tmp_path, model, gpus, batch, extra
):
    """plan --stack megatron: each confirmed layout emitted as Megatron-LM arguments uses only flags of its
    core_v0.15.0 parser and, read back as the scenario's megatron_args beside the plan's cluster and profile
    alone (the model, batch, precision, layout and switches from the arguments), simulates to the plan's time."""
    from simulator.scenario.megatron_args import MegatronArgsWarning

    options = megatron_options()
    rows, _ = plan_rows("megatron", model, gpus, batch, *extra, top=3)
    checked = 0
    for i, row in enumerate(rows):
        text = emit_text(row, "megatron")
        if row.get("schedule"):  # DeepSeek's schedules: said, and run as 1F1B by Megatron-LM (another time)
            assert "Megatron-LM has no switch for it" in text
            continue
        checked += 1
        flags = re.findall(
            r"(?m)(?:^|\s)(--[a-z0-9-]+)", "\n".join(x for x in text.splitlines() if not x.startswith("#"))
        )
        assert flags and set(flags) <= options, set(flags) - options
        (tmp_path / f"{i}.sh").write_text(text)
        s = row["scenario"]
        data = {
            "name": f"mg{i}",
            "cluster": s["cluster"],
            "framework": s["framework"],
            "megatron_args": f"{i}.sh",
        }
        assert read_back(tmp_path / f"{i}.yaml", data, MegatronArgsWarning) == pytest.approx(
            row["iteration_time_s"], rel=0.01
        ), row["layout"]
    assert checked, "every confirmed layout was DeepSeek's: nothing read back"


def test_a_megatron_command_line_gets_megatrons_defaults_and_names_what_it_ignores(tmp_path):
    """A launch script as people write one: torchrun's --nnodes, the script, its flags; absent flags are
    Megatron's defaults (fp32, GeLU, LayerNorm, learned positions, tied embeddings, biases), unmodelled ones
    named in one warning, a value against the scenario one line naming both."""
    from simulator.scenario.megatron_args import MegatronArgsWarning

    (tmp_path / "run.sh").write_text(
        "#!/bin/bash\n# GPT-2 small, as in Megatron-LM's examples\n"
        "torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py \\\n"
        "  --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --vocab-size 50257 \\\n"
        "  --micro-batch-size 4 --global-batch-size 64 --tensor-model-parallel-size 2 --lr 6e-4 \\\n"
        "  --data-path /data/a 0.5 /data/b 0.5 --fancy-new-flag 3\n"
    )
    data = {"name": "mg", "cluster": {"topology": "dgx-a100"}, "megatron_args": "run.sh"}
    with pytest.warns(MegatronArgsWarning, match=r"not modelled, ignored: --fancy-new-flag$"):
        s = load_scenario(data, base_dir=tmp_path)
    m, t, p = s.model, s.training, s.parallelism
    assert (s.cluster.num_nodes, p.tensor_parallel, p.data_parallel) == (2, 2, 8)
    assert (t.precision, t.micro_batch_size, t.global_batch_size) == ("fp32", 4, 64)
    assert (m.activation, m.normalization, m.position_embedding, m.tied_embeddings, m.add_bias_linear) == (
        "gelu",
        "layernorm",
        "learned",
        True,
        True,
    )
    with pytest.raises(
        ScenarioError,
        match=r"--tensor-model-parallel-size \(2\) contradicts parallelism.tensor_parallel \(4\)",
    ):
        load_scenario({**data, "parallelism": {"tensor_parallel": 4}}, base_dir=tmp_path)
    (tmp_path / "bad.sh").write_text("--num-layers twelve\n")
    with pytest.raises(ScenarioError, match="--num-layers must be int"):
        load_scenario({**data, "megatron_args": "bad.sh"}, base_dir=tmp_path)


def test_a_torchtitan_dualpipev_job_reads_as_dualpipev(tmp_path):
    """torchtitan runs torch.distributed.pipelining's ScheduleDualPipeV (torchtitan/distributed/pipeline_parallel.py):
    two stages a rank in a V."""
    toml = """
[training]
local_batch_size = 8
seq_len = 2048

[parallelism]
data_parallel_shard_degree = 1
data_parallel_replicate_degree = 8
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "DualPipeV"
pipeline_parallel_microbatch_size = 1
"""
    s = load_scenario(scenario(tmp_path, toml))
    p = s.parallelism
    assert (p.pipeline_schedule, p.virtual_pipeline_stages, p.pipeline_parallel, p.data_parallel) == (
        "dualpipev",
        2,
        2,
        8,
    )
    assert simulate(s).metrics.iteration_time_s > 0
