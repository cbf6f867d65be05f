"""Calibration recovers known parameters: fit a profile to runs simulated with a known one."""

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.frameworks import Framework, get_framework
from simulator.validation.calibrate import fit, golden_section
from simulator.validation.runner import run_case

CASE = {
    "id": "TOY-1",
    "framework": "ideal",
    "model": {
        "num_layers": 4,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "seq_length": 1024,
        "vocab_size": 32000,
    },
    "cluster": {"topology": "dgx-a100", "num_nodes": 1, "gpus_per_node": 1},
    "training": {"global_batch_size": 8, "micro_batch_size": 8, "precision": "bf16"},
    "published": {"metric": "iteration_time_s", "value": 1.0},
}


def test_golden_section_finds_the_minimum_of_a_parabola():
    assert golden_section(lambda x: (x - 0.37) ** 2, 0.0, 1.0, iterations=30) == pytest.approx(0.37, abs=1e-5)


def test_fit_recovers_the_gemm_efficiency_that_produced_the_measurement():
    truth = Framework(name="truth", gemm_efficiency=0.8)
    measured = run_case(CASE, truth).predicted
    case = {**CASE, "published": {"metric": "iteration_time_s", "value": measured}}
    fitted = fit([case], Framework(name="fit"), ["gemm_efficiency"], rounds=1)
    assert fitted.gemm_efficiency == pytest.approx(0.8, rel=0.01)


def test_framework_profiles_slow_kernels_down_and_unknown_names_are_reported():
    ideal = run_case(CASE).predicted
    slower = run_case(CASE, Framework(name="x", gemm_efficiency=0.5)).predicted
    assert slower > 1.3 * ideal
    r = CliRunner().invoke(app, ["calibrate", "profile", "--filter", "NAR21-T1-1.7B", "--framework", "nope"])
    assert r.exit_code == 2 and "unknown framework 'nope'" in r.output
    assert get_framework("llm-foundry-2023").memory_efficiency < 1


def test_fit_recovers_the_host_cost_per_backward_kernel_of_a_host_bound_run():
    """A run whose small kernels are paced by the host: the fitted host seconds per backward kernel are those
    that produced it (the host model is identifiable from iteration times)."""
    tiny_model = {
        "num_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "seq_length": 256,
        "vocab_size": 1000,
    }
    small = {
        **CASE,
        "model": tiny_model,
        "training": {**CASE["training"], "micro_batch_size": 1, "global_batch_size": 4},
    }
    host = get_framework("pytorch-2024").host
    truth = Framework(name="truth", host=host.model_copy(update={"backward_kernel_s": 6e-5}))
    measured = run_case(small, truth).predicted
    case = {**small, "published": {"metric": "iteration_time_s", "value": measured}}
    start = Framework(name="fit", host=host)
    fitted = fit([case], start, ["host.backward_kernel_s"], rounds=1)
    assert fitted.host.backward_kernel_s == pytest.approx(6e-5, rel=0.02)
    assert run_case(case, start).predicted < 0.95 * measured  # the starting profile was measurably off
