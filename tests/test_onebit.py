"""1-bit Adam and 0/1 Adam: compressed steps move 1/16 of the bytes; step counts follow DeepSpeed's schedules."""

import pytest
from conftest import make

from simulator import simulate
from simulator.errors import ScenarioError
from simulator.scenario.schema import OneBitConfig
from simulator.strategy.onebit import SCALE_BYTES, step_counts


def run(optimizer="onebit-adam", parallelism=None, cluster=None, **onebit):
    return simulate(
        make(
            cluster={"topology": "dgx-a100", "num_nodes": 2, **(cluster or {})},
            training={"global_batch_size": 32, "precision": "fp16", "optimizer": optimizer, "onebit": onebit},
            parallelism=parallelism or {},
        )
    )


def test_compressed_phase_moves_one_sixteenth_of_the_all_reduce_bytes():
    r = run(freeze_step=10, total_steps=100)
    warm, compressed = r.metrics.optimizer_phases[:2]
    assert (warm["phase"], compressed["phase"]) == ("warm-up", "compressed")
    n = 16
    # 16-bit ring all-reduce: 2(n-1)/n x 2 bytes per element; 1-bit: all-to-all + all-gather of E/8 bytes,
    # plus one fp32 scale per rank's chunk in each
    E = r.workload.params_per_rank
    assert warm["bytes_per_gpu"] == pytest.approx(2 * (n - 1) / n * 2 * E)
    scales = 2 * (n - 1) / n * SCALE_BYTES * n
    assert compressed["bytes_per_gpu"] - scales == pytest.approx(warm["bytes_per_gpu"] / 16)
    assert compressed["bytes_per_gpu"] <= warm["bytes_per_gpu"] / 16 * (1 + 1e-5)
    # the result's own metrics are the compressed (steady-state) step
    assert r.metrics.comm["bytes_per_gpu"] == compressed["bytes_per_gpu"]


def test_amortised_time_weights_each_phase_by_its_steps():
    r = run(freeze_step=25, total_steps=100)
    warm, compressed = r.metrics.optimizer_phases
    assert (warm["steps"], compressed["steps"]) == (25, 75)
    expected = (25 * warm["iteration_time_s"] + 75 * compressed["iteration_time_s"]) / 100
    assert r.metrics.amortised_iteration_time_s == pytest.approx(expected)


def test_compression_pays_on_a_slow_network_and_not_on_a_fast_one():
    """The compressed all-reduce runs in the step, after backward; the warm-up's runs under backward."""
    slow = run(cluster={"nics_per_node": 1, "nic_bandwidth_gbps": 10}, freeze_step=1, total_steps=2)
    warm, compressed = slow.metrics.optimizer_phases
    assert compressed["iteration_time_s"] < 0.5 * warm["iteration_time_s"]
    fast = run(freeze_step=1, total_steps=2)
    warm, compressed = fast.metrics.optimizer_phases
    assert compressed["iteration_time_s"] > 0.95 * warm["iteration_time_s"]


def reference_zero_one_counts(cfg: OneBitConfig, total: int) -> dict[str, int]:
    """DeepSpeed ZeroOneAdam's rules applied step by step (an independent check of the closed form)."""
    counts = {"warm-up": 0, "compressed": 0, "local": 0}
    interval, updates, local, since = 1, 0, 1, 0
    for step in range(total):
        if step < cfg.var_freeze_step:
            if step % interval == 0:
                counts["warm-up"] += 1
                updates += 1
                if updates == cfg.var_update_scaler:
                    updates, interval = 0, interval * 2
            else:
                counts["compressed"] += 1
        else:
            k = step - cfg.var_freeze_step
            counts["compressed" if (k - since) % local == 0 else "local"] += 1
            if local < cfg.local_step_clipper and k + 1 - since == cfg.local_step_scaler:
                since, local = k + 1, min(2 * local, cfg.local_step_clipper)
    return counts


@pytest.mark.parametrize(
    "cfg,total",
    [
        (
            OneBitConfig(
                var_freeze_step=100, var_update_scaler=2, local_step_scaler=10, local_step_clipper=4
            ),
            150,
        ),
        (
            OneBitConfig(
                var_freeze_step=1000, var_update_scaler=16, local_step_scaler=300, local_step_clipper=16
            ),
            5000,
        ),
        (
            OneBitConfig(
                var_freeze_step=5000, var_update_scaler=4, local_step_scaler=7, local_step_clipper=8
            ),
            3000,
        ),
    ],
)
def test_zero_one_adam_step_counts_follow_deepspeeds_schedule(cfg, total):
    counts = step_counts("zero-one-adam", cfg, total)
    assert counts == reference_zero_one_counts(cfg, total)
    assert sum(counts.values()) == total


def test_zero_one_adam_local_steps_send_nothing():
    r = run("zero-one-adam", var_freeze_step=50, local_step_scaler=10, local_step_clipper=4, total_steps=200)
    local = next(ph for ph in r.metrics.optimizer_phases if ph["phase"] == "local")
    assert local["bytes_per_gpu"] == 0 and local["steps"] > 0


def test_one_bit_adam_needs_plain_data_parallelism():
    with pytest.raises(ScenarioError, match="1-bit optimizers do not support ZeRO-2/3"):
        run(parallelism={"zero_stage": 2})
