"""Time and cost to train: training.total_tokens / --tokens and cluster.price_per_gpu_hour / --price."""

import json

import pytest
from typer.testing import CliRunner

from simulator.api import simulate
from simulator.cli import app
from simulator.scenario.loader import load_scenario


def scenario(**training):
    return load_scenario(
        {
            "name": "ttt",
            "model": "gpt3-1.3b",
            "cluster": {"topology": "dgx-a100", "num_nodes": 1, "price_per_gpu_hour": 2.0},
            "training": {"global_batch_size": 64, "micro_batch_size": 8, **training},
        }
    )


def test_days_gpu_hours_and_cost_follow_from_the_simulated_throughput():
    m = simulate(scenario(total_tokens="300B")).metrics
    days = 300e9 / m.tokens_per_s / 86400
    assert m.train["tokens"] == 300e9
    assert m.train["days"] == pytest.approx(days, rel=1e-12)
    assert m.train["gpu_hours"] == pytest.approx(days * 24 * 8, rel=1e-12)
    assert m.train["cost_usd"] == pytest.approx(days * 24 * 8 * 2.0, rel=1e-12)


@pytest.mark.parametrize(("text", "value"), [("15T", 15e12), ("300B", 3e11), ("1.5e12", 1.5e12), (2e9, 2e9)])
def test_token_counts_take_decimal_suffixes(text, value):
    assert scenario(total_tokens=text).training.total_tokens == value


def test_no_tokens_no_training_estimate():
    assert simulate(scenario()).metrics.train is None


def test_cli_tokens_and_price_reach_json_and_table():
    r = CliRunner().invoke(app, ["run", "quickstart", "--tokens", "300B", "--price", "1.8", "--json"])
    assert r.exit_code == 0, r.output
    train = json.loads(r.output)["train"]
    assert train["tokens"] == 300e9 and train["price_per_gpu_hour"] == 1.8
    assert train["cost_usd"] == pytest.approx(train["gpu_hours"] * 1.8, rel=1e-12)
    table = CliRunner().invoke(app, ["run", "quickstart", "--tokens", "300B", "--price", "1.8"]).output
    assert "days for 300B tokens" in table and "at $1.80/GPU-hour" in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokens", "15X"], "--tokens: expected a number such as 15T or 3e11, got '15X'"),
        (["--price", "-1"], "--price: Input should be greater than 0"),
    ],
)
def test_bad_tokens_or_price_is_one_line_and_exit_2(args, message):
    r = CliRunner().invoke(app, ["run", "quickstart", *args])
    assert r.exit_code == 2 and message in r.output
