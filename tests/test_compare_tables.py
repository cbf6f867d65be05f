"""Every table row formats for every shipped scenario beside every other one (`clustersim compare`): a row that
only some runs have (pipeline stages, periodic replay, offload, MoE, 1-bit phases) shows a dash or a value for
the others, never a traceback."""

import io
import itertools
import warnings

import pytest
from rich.console import Console

from simulator import simulate
from simulator.report.table import ROWS, metrics_table, print_table
from simulator.scenario.shipped import shipped_scenarios


@pytest.fixture(scope="module")
def runs():
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, path in shipped_scenarios().items():
            out.append((name, simulate(str(path)).metrics))
    return out


def test_every_pair_of_shipped_scenarios_compares(runs):
    console = Console(file=io.StringIO(), width=160)
    for pair in itertools.combinations(runs, 2):
        console.print(metrics_table(list(pair)))
    text = console.file.getvalue()
    assert text.count("┃ Metric") == len(runs) * (len(runs) - 1) // 2


def test_every_row_shows_for_some_shipped_scenario_and_each_run_prints_alone(runs):
    shown = set()
    for name, m in runs:
        print_table([(name, m)], Console(file=io.StringIO(), width=120))
        shown |= {label for label, get, fmt, *cond in ROWS if not cond or cond[0](m)}
    # a profile calibrated on one's own measured step is never shipped: its row is checked where one is made
    # (tests/test_calibrate_step.py)
    assert shown | {"Profile calibrated on"} == {label for label, *_ in ROWS}


@pytest.mark.slow
def test_every_shipped_scenario_writes_a_report_and_a_trace_and_each_neighbour_pair_a_comparison(tmp_path):
    """Issue 32's acceptance: `run --report --trace` for every shipped scenario and `compare --report` for each
    scenario beside the next one (the table of every pair is checked above, in the default run)."""
    import json

    from typer.testing import CliRunner

    from simulator.cli import app

    runner = CliRunner()
    names = sorted(shipped_scenarios())
    for i, name in enumerate(names):
        report, trace = tmp_path / f"{i}.html", tmp_path / f"{i}.json"
        r = runner.invoke(app, ["run", name, "--quiet", "--report", str(report), "--trace", str(trace)])
        assert r.exit_code in (0, 3), (name, r.output)
        assert report.stat().st_size > 100_000 and json.loads(trace.read_text())["traceEvents"], name
    for a, b in zip(names, names[1:], strict=False):
        out = tmp_path / "c.html"
        r = runner.invoke(app, ["compare", a, b, "--report", str(out)])
        assert r.exit_code in (0, 3) and out.stat().st_size > 100_000, (a, b, r.output)


@pytest.mark.slow
def test_every_pair_of_shipped_scenarios_draws_the_comparison_page(runs):
    """The comparison page's figures (compare --report) for every pair of shipped scenarios, serialised as the
    page embeds them: a value only some runs have never breaks a chart (the files themselves are written for
    neighbour pairs above)."""
    from simulator.report.compare_html import compare_figures

    for pair in itertools.combinations(runs, 2):
        figures = compare_figures(list(pair))
        assert len(figures) == 3 and all(f.to_json() for f in figures), [name for name, _ in pair]
