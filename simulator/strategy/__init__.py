"""Strategies turn a workload into per-rank programs. One module per strategy; ``build_program`` picks one."""

from __future__ import annotations

from simulator.errors import ScenarioError
from simulator.hardware.gpus import GPU
from simulator.scenario.schema import Scenario
from simulator.strategy import ddp, fsdp, zero
from simulator.strategy.program import Program
from simulator.workload.transformer import Workload


def build_program(s: Scenario, w: Workload, gpu: GPU) -> Program:
    p = s.parallelism
    unsupported = [
        f"{name} ({v})"
        for name, v in (
            ("pipeline_parallel", p.pipeline_parallel),
            ("context_parallel", p.context_parallel),
        )
        if v > 1
    ]
    if unsupported:
        raise ScenarioError(
            f"parallelism: {', '.join(unsupported)} is not simulated yet; this version simulates single-GPU, "
            "DDP, ZeRO-1/2/3 and FSDP2/HSDP, each with tensor (and sequence) parallelism"
        )
    if p.fsdp is not None:
        return fsdp.build(s, w, gpu)
    if p.zero_stage:
        return zero.build(s, w, gpu)
    return ddp.build(s, w, gpu)
