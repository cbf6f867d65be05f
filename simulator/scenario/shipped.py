"""The scenarios that ship with the package (``scenarios/`` of a checkout, ``simulator/scenarios`` of a wheel):
runnable by name from any directory (``clustersim run quickstart``), listed by ``clustersim scenarios``."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from simulator import paths
from simulator.errors import ScenarioError
from simulator.scenario.files import is_path


def scenario_dir() -> Path:
    checkout = Path(__file__).resolve().parents[2] / "scenarios"
    return checkout if checkout.is_dir() else Path(__file__).resolve().parents[1] / "scenarios"


@cache
def shipped_scenarios() -> dict[str, Path]:
    """Name (the file's stem) -> path, for every shipped scenario."""
    return {p.stem: p for p in sorted(scenario_dir().rglob("*.yaml"))}


# a full stop after these ends no sentence ("Dubey et al. (2024)")
ABBREVIATIONS = ("al.", "e.g.", "i.e.", "cf.", "vs.", "etc.", "Fig.", "Sec.", "Eq.", "No.")


def describe(path: Path) -> str:
    """The first sentence of the scenario's leading comment (what it is), or nothing."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    text = " ".join(lines)
    start = 0
    while (end := text.find(". ", start)) >= 0:
        if not text[: end + 1].endswith(ABBREVIATIONS):
            return text[: end + 1]
        start = end + 2
    return text


def resolve_scenario(source: str | Path) -> Path:
    """A scenario file: an existing path, or the name (or the unique start of a name) of a shipped scenario."""
    path = Path(source)
    if is_path(str(source)) or paths.exists(path, "scenario"):
        return path
    shipped = shipped_scenarios()
    name = str(source)
    if name in shipped:
        return shipped[name]
    matches = [n for n in shipped if n.startswith(name)]
    if len(matches) == 1:
        return shipped[matches[0]]
    if matches:
        raise ScenarioError(
            f"scenario '{name}' matches {len(matches)} shipped scenarios: {', '.join(matches[:8])}"
            + (", ..." if len(matches) > 8 else "")
        )
    raise ScenarioError(
        f"{name}: no such file, and no shipped scenario of that name (`clustersim scenarios` lists them)"
    )


STARTER = """\
# A starter scenario (clustersim init). Every field is documented by `clustersim schema`; run it with
# `clustersim run {name}`.
name: {stem}
model:
  preset: gpt3-1.3b          # or a Hugging Face config.json: {{hf_config: path/config.json, seq_length: 4096}}
cluster:
  topology: dgx-a100         # shipped: {topologies}; or a path
  num_nodes: 1
training:
  global_batch_size: 64      # sequences per optimizer step
  micro_batch_size: 4        # sequences per GPU per forward/backward
  precision: bf16
  activation_recompute: none # none | selective | full
parallelism:
  tensor_parallel: 1
  pipeline_parallel: 1
  zero_stage: 0              # DeepSpeed ZeRO 0-3 (or fsdp: {{}} for PyTorch FSDP2)
  # data_parallel is derived: GPUs / (tensor x pipeline x context)
# memory: {{cuda_context_gib: 0.4, nccl_channels: 16, allocator_fragmentation: 0.0}}  # beyond the tensors (docs/memory.md)
"""
