"""The package as users install it: every subpackage and data file is in the wheel's list."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_every_subpackage_is_listed_for_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "simulator").rglob("__init__.py")}
    data_dirs = {"simulator.tables.shipped", "simulator.hardware.gpus", "simulator.hardware.routes",
                 "simulator.scenario.presets"}  # fmt: skip
    # scenarios/ and its folders ship as simulator.scenarios[.folder] (setuptools warns about a folder not listed)
    scenario_dirs = {f"simulator.scenarios.{d.name}" for d in (ROOT / "scenarios").iterdir() if d.is_dir()}
    assert found | data_dirs | scenario_dirs | {"simulator.topologies", "simulator.scenarios"} == listed


def test_data_the_simulator_reads_is_covered_by_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = data["simulator"]
    for needed in (
        "hardware/gpus/a100-sxm4-80gb.yaml",
        "frameworks/ideal.yaml",
        "validation/published.yaml",
        "tables/shipped/a100-sxm4-80gb/kernels.csv",
        "tables/shipped/h100-sxm5-80gb/table.yaml",
        "costs/nccl.yaml",
        "validation/nccl_tests.yaml",
        next((ROOT / "simulator" / "hardware" / "routes").glob("*.json"))
        .relative_to(ROOT / "simulator")
        .as_posix(),
    ):
        assert any((ROOT / "simulator").glob(g) and Path(needed).match(g) for g in globs), needed
    assert data["simulator.topologies"] == ["*.yaml"] and list((ROOT / "topologies").glob("*.yaml"))
    shipped = {p.relative_to(ROOT / "scenarios") for p in (ROOT / "scenarios").rglob("*") if p.is_file()}
    assert shipped
    for p in shipped:
        package = ".".join(("simulator.scenarios", *p.parent.parts))
        assert any(Path(p.name).match(g) for g in data.get(package, [])), p
