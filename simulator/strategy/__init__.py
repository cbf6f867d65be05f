"""Strategies turn a workload into per-rank programs. One module per strategy; ``build_program`` picks one."""

from __future__ import annotations

from simulator.hardware.gpus import GPU
from simulator.scenario.schema import Scenario
from simulator.strategy import ddp, fsdp, megatron, onebit, zero
from simulator.strategy.program import Program
from simulator.workload.transformer import Workload


def build_program(s: Scenario, w: Workload, gpu: GPU, phase: str | None = None) -> Program:
    """``phase``: for optimizers whose steps differ over training (1-bit Adam), which kind of step."""
    p = s.parallelism
    if s.training.optimizer in onebit.OPTIMIZERS:
        return onebit.build(s, w, gpu, phase or "compressed")
    if p.pipeline_parallel > 1:
        return megatron.build(s, w, gpu)
    if p.fsdp is not None:
        return fsdp.build(s, w, gpu)
    if p.zero_stage:
        return zero.build(s, w, gpu)
    return ddp.build(s, w, gpu)
