"""DeepSpeed JSON configs as input: settings fill the scenario, unmodelled fields are listed, contradictions fail."""

import json
import re
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator import load_scenario, simulate
from simulator.cli import app
from simulator.errors import ScenarioError
from simulator.scenario.deepspeed import DeepSpeedConfigWarning

ROOT = Path(__file__).resolve().parents[1]
BASE = {
    "model": {
        "num_layers": 2,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "seq_length": 512,
        "vocab_size": 1000,
    },
    "cluster": {"topology": "dgx-a100", "num_nodes": 1},
}


def write(tmp_path, config: dict) -> str:
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(config))
    return str(p)


def test_batch_precision_optimizer_and_zero_settings_come_from_the_config(tmp_path):
    cfg = {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 1e7,
            "zero_quantized_weights": True,
            "contiguous_gradients": True,
        },
    }
    s = load_scenario({**BASE, "training": {}}, deepspeed_config=write(tmp_path, cfg))
    assert (s.training.global_batch_size, s.training.micro_batch_size, s.gradient_accumulation_steps) == (
        64,
        2,
        4,
    )
    assert s.training.precision == "bf16" and s.training.optimizer == "adamw"
    assert s.parallelism.zero_stage == 3 and s.parallelism.zero.reduce_bucket_size == 1e7
    assert s.parallelism.zero.zero_quantized_weights


def test_unmodelled_fields_are_listed_in_one_warning(tmp_path):
    cfg = {
        "train_batch_size": 16,
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}},
        "aio": {"single_submit": True},
        "communication_data_type": "fp32",
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_scenario({**BASE, "training": {}}, deepspeed_config=write(tmp_path, cfg))
    messages = [str(w.message) for w in caught if issubclass(w.category, DeepSpeedConfigWarning)]
    assert len(messages) == 1
    for key in ("zero_optimization.offload_optimizer.ratio", "aio.single_submit", "communication_data_type"):
        assert key in messages[0]


def test_offload_aio_checkpointing_and_one_bit_adam_come_from_the_config(tmp_path):
    cfg = {
        "train_batch_size": 16,
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pipeline_read": True},
            "offload_param": {"device": "cpu", "pin_memory": True},
        },
        "aio": {"block_size": 262144, "queue_depth": 16, "thread_count": 2},
        "activation_checkpointing": {"partition_activations": True, "cpu_checkpointing": True},
    }
    s = load_scenario(
        {**BASE, "training": {"activation_recompute": "full"}}, deepspeed_config=write(tmp_path, cfg)
    )
    z = s.parallelism.zero
    assert (z.offload_optimizer.device, z.offload_optimizer.pipeline_read) == ("nvme", True)
    assert (z.offload_param.device, z.offload_param.pin_memory) == ("cpu", True)
    assert (z.aio.block_size, z.aio.queue_depth, z.aio.thread_count) == (262144, 16, 2)
    assert s.training.partition_activations and s.training.cpu_checkpointing
    onebit = {
        "train_batch_size": 16,
        "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-4, "freeze_step": 400}},
    }
    s = load_scenario({**BASE, "training": {}}, deepspeed_config=write(tmp_path, onebit))
    assert s.training.optimizer == "onebit-adam" and s.training.onebit.freeze_step == 400
    legacy = {"train_batch_size": 16, "zero_optimization": {"stage": 2, "cpu_offload": True}}
    s = load_scenario({**BASE, "training": {}}, deepspeed_config=write(tmp_path, legacy))
    assert s.parallelism.zero.offload_optimizer.device == "cpu"


def test_auto_values_take_the_scenarios_settings(tmp_path):
    cfg = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "zero_optimization": {"stage": 2},
    }
    s = load_scenario(
        {**BASE, "training": {"global_batch_size": 32, "micro_batch_size": 4}},
        deepspeed_config=write(tmp_path, cfg),
    )
    assert (s.training.global_batch_size, s.training.micro_batch_size, s.parallelism.zero_stage) == (32, 4, 2)


@pytest.mark.parametrize(
    "cfg,message",
    [
        ({"train_batch_size": 64}, r"train_batch_size \(64\) contradicts training.global_batch_size \(32\)"),
        (
            {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2},
            r"gradient_accumulation_steps \(2\) contradicts global_batch_size \(32\) / \(micro_batch_size \(1\) x "
            r"data_parallel \(8\)\) = 4",
        ),
    ],
)
def test_contradictions_with_the_scenario_are_errors(tmp_path, cfg, message):
    """A config the scenario file names itself must agree with it (one handed in on the command line replaces
    the scenario's values instead: test_a_typical_ds_config_replaces_the_init_starters_defaults)."""
    with pytest.raises(ScenarioError, match=message):
        load_scenario(
            {**BASE, "training": {"global_batch_size": 32}, "deepspeed_config": write(tmp_path, cfg)}
        )


def test_cli_flag_and_scenario_key_run_the_example_configs(tmp_path):
    r = CliRunner().invoke(
        app, ["run", str(ROOT / "scenarios/deepspeed/gpt3-13b-ds-zero3-offload.yaml"), "--json"]
    )
    assert r.exit_code == 0, r.output
    assert "not modelled" not in r.output  # offload is modelled now
    d = json.loads(r.output[r.output.index("{") :])
    assert d["memory_gib"]["optimizer"] == 0 and d["memory_gib"]["host"] > 0
    s = load_scenario(ROOT / "scenarios/deepspeed/llama3-8b-ds-zeropp.yaml")
    m = simulate(s).metrics
    assert s.parallelism.zero.zero_hpz_partition_size == 8 and "all_gather:dp/8" in m.comm_by_collective
    bad = CliRunner().invoke(
        app,
        [
            "run",
            str(ROOT / "scenarios/quickstart-gpt3-1.3b-ddp-8xa100.yaml"),
            "--deepspeed-config",
            str(ROOT / "scenarios/deepspeed/ds_config_zero3_offload.json"),
        ],
    )
    # the config's batch replaces the scenario's; its own accumulation steps do not add up on 8 GPUs
    assert bad.exit_code == 2 and "train_batch_size 256 replaces training.global_batch_size 64" in bad.output
    assert (
        "gradient_accumulation_steps (4) contradicts global_batch_size (256) / (micro_batch_size (4) x"
        in bad.output
    )


def test_grad_accum_dtype_comes_from_data_types_and_a_bad_one_is_named(tmp_path):
    cfg = {"train_batch_size": 8, "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "bfloat16"}}
    s = load_scenario({**BASE, "training": {}}, deepspeed_config=write(tmp_path, cfg))
    assert s.parallelism.zero.grad_accum_dtype == "bf16"
    cfg["data_types"] = {"grad_accum_dtype": "int3"}
    with pytest.raises(
        ScenarioError, match=r"data_types\.grad_accum_dtype 'int3' is not one of fp32, fp16, bf16"
    ):
        load_scenario({**BASE, "training": {}}, deepspeed_config=write(tmp_path, cfg))


@pytest.mark.parametrize(
    "cfg, message",
    [
        (
            {"zero_optimization": {"stage": 7}},
            "deepspeed_config ds.json: zero_optimization.stage -> parallelism.zero_stage: Input should be 0, 1, 2 or 3",
        ),
        (
            {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": -1}},
            "deepspeed_config ds.json: zero_optimization.stage3_prefetch_bucket_size -> "
            "parallelism.zero.stage3_prefetch_bucket_size:",
        ),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}},
            "deepspeed_config ds.json: zero_optimization.offload_optimizer.device -> "
            "parallelism.zero.offload_optimizer.device:",
        ),
        (
            {"train_micro_batch_size_per_gpu": 0},
            "deepspeed_config ds.json: train_micro_batch_size_per_gpu -> training.micro_batch_size:",
        ),
    ],
)
def test_an_invalid_value_is_named_by_its_deepspeed_key_and_the_field_it_sets(tmp_path, cfg, message):
    cfg = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, **cfg}
    with pytest.raises(ScenarioError) as e:
        load_scenario({**BASE, "name": "t"}, deepspeed_config=write(tmp_path, cfg))
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


def test_a_typical_ds_config_replaces_the_init_starters_defaults(tmp_path, monkeypatch):
    """Issue 32 item 8: `clustersim init` then `run --deepspeed-config ds.json` with AdamW and ZeRO-2: the config
    handed in on the command line replaces the starter's batch and ZeRO stage (said in one warning line); the
    same config named inside the scenario file must agree with it (a contradiction there is an error)."""
    import json as _json

    from typer.testing import CliRunner

    from simulator.cli import app

    runner = CliRunner()
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["init"]).exit_code == 0
    ds = {
        "train_batch_size": 512,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 16,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True},
    }
    (tmp_path / "ds.json").write_text(_json.dumps(ds))
    r = runner.invoke(app, ["run", "scenario.yaml", "--deepspeed-config", "ds.json", "--json"])
    assert r.exit_code == 0, r.output
    d = _json.loads(r.stdout)
    assert d["strategy"] == "zero-2, DP8"
    assert (
        "deepspeed_config ds.json: train_batch_size 512 replaces training.global_batch_size 64; "
        "zero_optimization.stage 2 replaces parallelism.zero_stage 0" in r.stderr
    )
    text = (tmp_path / "scenario.yaml").read_text() + "deepspeed_config: ds.json\n"
    (tmp_path / "named.yaml").write_text(text)
    r = runner.invoke(app, ["run", "named.yaml"])
    assert r.exit_code == 2
    assert "train_batch_size (512) contradicts training.global_batch_size (64)" in r.stderr


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        ("training: 1e3\n", "training: expected a mapping of its fields beside deepspeed_config"),
        ("parallelism: 5\n", "parallelism: expected a mapping of its fields beside deepspeed_config"),
        ("parallelism: {zero: 3}\n", "parallelism.zero: expected a mapping"),
        (
            "parallelism: {zero: {offload_optimizer: cpu}}\n",
            "parallelism.zero.offload_optimizer: expected a mapping",
        ),
    ],
)
def test_a_section_of_the_wrong_type_beside_a_deepspeed_config_is_named(tmp_path, extra, text):
    """Issue 63: each was a TypeError, AttributeError or ValueError traceback."""
    (tmp_path / "ds.json").write_text(
        '{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}'
    )
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: d\nmodel: {preset: gpt3-125m}\ncluster: {topology: dgx-a100}\ndeepspeed_config: ds.json\n"
        + extra
    )
    with pytest.raises(ScenarioError, match=re.escape(text)):
        load_scenario(path)
