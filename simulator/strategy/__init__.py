"""Strategies turn a workload into per-rank programs for a resolved cluster. One module per strategy;
``build_program`` picks one."""

from __future__ import annotations

from simulator.hardware.cluster import Cluster
from simulator.program import Program
from simulator.scenario.schema import ONEBIT_OPTIMIZERS, Scenario
from simulator.strategy.groups import placement_for
from simulator.strategy.runtime_memory import add_runtime_memory
from simulator.workload.transformer import Workload


def check_scenario(s: Scenario) -> None:
    """The strategy's own checks of the scenario as the user wrote it (a ScenarioError names what is wrong): run
    before any replay, so that a check on the micro-batch count sees the real count, not the few a periodic
    replay samples (api.simulate)."""
    if s.parallelism.pipeline_parallel > 1 and s.training.optimizer not in ONEBIT_OPTIMIZERS:
        from simulator.strategy.pipeline.partition import check

        check(s)


def build_program(s: Scenario, w: Workload, cluster: Cluster, phase: str | None = None) -> Program:
    """``phase``: for optimizers whose steps differ over training (1-bit Adam), which kind of step. Every rank's
    memory includes what runs outside its tensors (CUDA context, NCCL buffers, allocator reserve). Strategies
    read the hardware from ``cluster`` (GPU memory, GPUs and host memory per node) and never load files."""
    # the one strategy module the run needs is imported (a data-parallel run imports no pipeline schedule)
    p = s.parallelism
    if s.training.optimizer in ONEBIT_OPTIMIZERS:
        from simulator.strategy import onebit

        program = onebit.build(s, w, cluster, phase or "compressed")
    elif p.pipeline_parallel > 1 and p.pipeline_schedule == "deepspeed":
        from simulator.strategy import deepspeed_pipe

        program = deepspeed_pipe.build(s, w, cluster)
    elif p.pipeline_parallel > 1:
        from simulator.strategy import megatron

        program = megatron.build(s, w, cluster)
    elif p.fsdp is not None:
        from simulator.strategy import fsdp

        program = fsdp.build(s, w, cluster)
    elif p.zero_stage:
        from simulator.strategy import zero

        program = zero.build(s, w, cluster)
    else:
        from simulator.strategy import ddp

        program = ddp.build(s, w, cluster)
    add_runtime_memory(program, s, w.framework, placement_for(s))
    return program
