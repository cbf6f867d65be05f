"""The package's shape as docs/architecture.md draws it: floors from what is given up to the command line, each
importing only from its own floor and the ones below, no import cycle, and no file past the size where it is
usually two ideas. Read from the source with ast, lazy imports inside functions included."""

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).parents[1] / "simulator"

# Lowest first. A module belongs to the floor of the longest prefix that names it.
FLOORS = [
    (
        "given: scenario sections, hardware data, framework profiles",
        [
            "simulator.errors",
            "simulator.paths",
            "simulator.scenario.files",
            "simulator.scenario.section",
            "simulator.scenario.model",
            "simulator.scenario.attention_parts",
            "simulator.scenario.moe_config",
            "simulator.scenario.cluster",
            "simulator.scenario.training",
            "simulator.scenario.parallelism",
            "simulator.scenario.pipeline_layout",
            "simulator.scenario.memory",
            "simulator.scenario.schema",
            "simulator.scenario.presets",
            "simulator.scenario.hf_config",
            "simulator.scenario.shipped",
            "simulator.scenario.deepspeed",
            "simulator.hardware",
            "simulator.frameworks",
        ],
    ),
    ("tables: the cost-table format and lookup", ["simulator.tables"]),
    (
        "the resolved scenario",
        ["simulator.scenario.loader", "simulator.scenario.resolve", "simulator.scenario"],
    ),
    ("workload and the program IR", ["simulator.workload", "simulator.program"]),
    ("strategy", ["simulator.strategy"]),
    ("timeline", ["simulator.timeline"]),
    ("engine", ["simulator.engine"]),
    ("costs", ["simulator.costs"]),
    ("metrics", ["simulator.metrics"]),
    ("api and report", ["simulator.api", "simulator.report", "simulator"]),
    (
        "study, calibration tools, validation",
        ["simulator.study", "simulator.calibration", "simulator.validation"],
    ),
    ("cli", ["simulator.cli", "simulator.__main__"]),
]
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The simulator modules ``path`` imports (``from package import module`` counts as the module)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("simulator")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("simulator"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
    return out - {name}


def floor_of(name: str) -> int:
    best, floor = -1, None
    for i, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, floor = len(p), i
    assert floor is not None, f"{name} is on no floor of tests/test_architecture.py"
    return floor


def import_graph() -> nx.DiGraph:
    mods = modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        for dep in imports(path, name, set(mods)):
            g.add_edge(name, dep)
    return g


def test_no_import_cycle_among_simulator_modules():
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_every_import_points_to_its_own_floor_or_one_below():
    g = import_graph()
    upward = [
        f"{a} ({FLOORS[floor_of(a)][0]}) imports {b} ({FLOORS[floor_of(b)][0]})"
        for a, b in g.edges
        if floor_of(b) > floor_of(a)
    ]
    assert not upward, "\n".join(upward)


def test_the_floor_test_can_fail():
    """The rules above see a violation where there is one: a strategy module importing the API would be flagged
    (the floors are ordered), and the graph holds the edges the source has."""
    g = import_graph()
    assert (
        floor_of("simulator.api") > floor_of("simulator.strategy.zero") > floor_of("simulator.workload.ops")
    )
    assert g.has_edge("simulator.strategy.megatron", "simulator.strategy.pipeline.flush")
    assert g.has_edge("simulator.api", "simulator.strategy")
    assert not g.has_edge("simulator.strategy.megatron", "simulator.strategy.deepspeed_pipe")
    assert not g.has_edge("simulator.strategy.deepspeed_pipe", "simulator.strategy.megatron")


def test_strategies_are_handed_the_hardware_and_load_no_file():
    readers = ("simulator.hardware.topology", "simulator.scenario.", "simulator.tables")
    g = import_graph()
    found = [
        f"{a} imports {b}"
        for a, b in g.edges
        if a.startswith("simulator.strategy")
        and b != "simulator.scenario.schema"
        and any(b.startswith(r) for r in readers)
    ]
    assert not found, "\n".join(found)
    for path in (ROOT / "strategy").rglob("*.py"):
        text = path.read_text()
        assert "open(" not in text and "read_text" not in text and "cluster_spec" not in text, path


def test_no_file_in_the_package_is_over_400_lines():
    long = {
        str(p.relative_to(ROOT.parent)): n
        for p in ROOT.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines (usually two ideas): {long}"


def test_a_run_imports_only_the_strategy_it_runs(tmp_path):
    """A data-parallel run (the quickstart) imports its strategy and none of the others: no pipeline schedule,
    no ZeRO-3 fetch planner, no FSDP; nor numpy.random, which the group-shape projection once drew its weights
    from (8 ms of a 0.25 s run)."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, sys; from simulator import load_scenario, simulate; "
        "simulate(load_scenario('quickstart')); "
        "print(json.dumps([m for m in sys.modules if m.startswith(('simulator.strategy', 'numpy.random'))]))"
    )
    env = {**os.environ, "CLUSTERSIM_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    loaded = set(json.loads(out.stdout))
    assert "simulator.strategy.ddp" in loaded
    unwanted = {"simulator.strategy.megatron", "simulator.strategy.schedules", "simulator.strategy.zero3_fetch",
                "simulator.strategy.fsdp", "simulator.strategy.deepspeed_pipe", "numpy.random"}  # fmt: skip
    assert not loaded & unwanted, loaded & unwanted


def test_importing_the_command_line_builds_no_pydantic_validator():
    """Every scenario, hardware, framework and table model defers building its validator to its first use
    (``defer_build``): a process that only starts, or runs a command that never reads a kind of file, does not pay
    for it (17 ms of a 0.175 s start-up, benchmarks/bench_scale.py, 2026-11-27). Their defaults are made by
    factories, which a class body calls at import time otherwise."""
    import json
    import subprocess
    import sys

    code = (
        "import json, simulator.cli, simulator.api, simulator.scenario.loader; from pydantic import BaseModel; "
        "from pydantic._internal._mock_val_ser import MockValSer\n"
        "def subs(c):\n    for s in c.__subclasses__():\n        yield s\n        yield from subs(s)\n"
        "ms = [c for c in subs(BaseModel) if c.__module__.startswith('simulator')]\n"
        "print(json.dumps([len(ms), [c.__name__ for c in ms "
        "if not isinstance(c.__dict__.get('__pydantic_validator__'), MockValSer)]]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    models, built = json.loads(out.stdout)
    assert models >= 30 and built == []


def test_the_command_line_imports_the_simulator_only_in_the_command_that_runs():
    """``clustersim --help`` and the command modules import Typer and the CLI alone: numpy, pydantic, yaml and the
    scenario models come with the command that runs (0.42 s -> 0.12 s for ``clustersim --help``, 2026-12-06)."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys, simulator.cli; "
        "print(json.dumps([m for m in ('numpy', 'pydantic', 'yaml', 'rich', 'simulator.api', "
        "'simulator.scenario.schema') if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_command_line_imports_simpy_only_when_it_simulates():
    """simpy reads its own version through importlib.metadata when imported (8 ms of a 0.155 s start-up,
    2026-11-27): the engine imports it at the first simulation, so a command that checks a file, lists scenarios
    or prints help does not pay for it; a simulation does."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys, simulator.cli; before = 'simpy' in sys.modules; "
        "from simulator import load_scenario, simulate; simulate(load_scenario('quickstart')); "
        "print(json.dumps([before, 'simpy' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [False, True]
