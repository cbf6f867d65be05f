"""Strategies turn a workload into per-rank programs. One module per strategy; ``build_program`` picks one."""

from __future__ import annotations

from simulator.hardware.gpus import GPU
from simulator.program import Program
from simulator.scenario.schema import Scenario
from simulator.strategy import ddp, fsdp, megatron, onebit, zero
from simulator.strategy.common import placement_for
from simulator.strategy.runtime_memory import add_runtime_memory
from simulator.workload.transformer import Workload


def build_program(s: Scenario, w: Workload, gpu: GPU, phase: str | None = None) -> Program:
    """``phase``: for optimizers whose steps differ over training (1-bit Adam), which kind of step. Every rank's
    memory includes what runs outside its tensors (CUDA context, NCCL buffers, allocator reserve)."""
    p = s.parallelism
    if s.training.optimizer in onebit.OPTIMIZERS:
        program = onebit.build(s, w, gpu, phase or "compressed")
    elif p.pipeline_parallel > 1:
        program = megatron.build(s, w, gpu)
    elif p.fsdp is not None:
        program = fsdp.build(s, w, gpu)
    elif p.zero_stage:
        program = zero.build(s, w, gpu)
    else:
        program = ddp.build(s, w, gpu)
    add_runtime_memory(program, s, w.framework, placement_for(s))
    return program
