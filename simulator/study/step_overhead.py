"""What one micro-batch costs a stage beyond its layers, as the simulation runs a Megatron pipeline
(``strategy/pipeline/chunk_ops.py`` chunk_pieces, ``strategy/megatron.py``), for the planner's screen:

- every forward step starts with the framework's per-micro-batch setup: Megatron's ``get_batch`` (pretrain_gpt.py
  broadcasts the batch over the TP group), which each model chunk's forward step calls. Where the host waits for
  the GPU at that step (a blocking input copy, or Megatron's synchronised batched p2p: ``host.syncs``), the GPU
  sits idle while the host prepares it: the setup's lead (``costs/dispatch.py`` task_cost), 2.1 ms a step in
  the megatron-2021 profile;
- with TP and without sequence parallelism, a model chunk that received its input all-gathers it over the TP
  group, in forward and again for the gradient in backward (Narayanan et al. SC21 Sec. 4.1, scatter / gather);
- Megatron's blocking pipeline sends (not overlapped: ``strategy/megatron.py`` p2p_overlapped), one per chunk and
  pass; DeepSpeed's lock-step schedule, about two per pass.

Measured on GPT-3 175B at TP 8, PP 8 and 1,024 A100 (benchmarks/plan.py, 2026-11-27): the screen had put these
layouts 1.3-6.2% fast, more so with more virtual stages, leaving the first two out.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.engine.engine import TaskCost
from simulator.scenario.schema import Scenario
from simulator.strategy.megatron import overlaps_p2p
from simulator.strategy.pipeline.chunk_ops import send_bytes
from simulator.workload.ops import collective_op
from simulator.workload.transformer import Workload

# Transfers on the critical path per micro-batch: Megatron's schedules send once per pass; DeepSpeed's lock-step
# TrainSchedule meets both neighbours every step, about 4 transfers a micro-batch (strategy/deepspeed_pipe.py;
# tests/test_pipeline.py: (m + p - 1)(f + b) + (4m + 2p - 8) T with free compute imbalance)
SENDS_PER_STEP = {"deepspeed": 4}


def synchronised(s: Scenario, w: Workload, pp: int, schedule: str) -> bool:
    """Does the host wait for the GPU before each forward step's setup? (strategy/megatron.py ``sync_forward``;
    without a pipeline, strategy/steps.py microbatch_sync). ``s``: any layout's scenario of the same base (the
    overlap switch is the base's)."""
    syncs = w.framework.host.syncs
    return syncs.microbatch or (pp > 1 and syncs.p2p and not _overlapped(s, w, pp, schedule))


def _overlapped(s: Scenario, w: Workload, pp: int, schedule: str) -> bool:
    """``strategy/megatron.py`` p2p_overlapped for a layout of ``pp`` stages run by ``schedule``."""
    return overlaps_p2p(s.parallelism.overlap_p2p_comm, w.framework.overlap_p2p, pp, schedule)


def step_overhead_s(
    s: Scenario,
    w: Workload,
    cost: Callable[[tuple], TaskCost],
    pp: int,
    v: int,
    link_Bps: float,
    schedule: str,
) -> float:
    """Seconds one micro-batch adds to a stage's step beyond its layers (a stage of the pipeline's middle: each of
    its ``v`` chunks sets up a forward, with TP and no sequence parallelism re-gathers in forward and backward,
    and, where Megatron's sends block, sends in both passes over a ``link_Bps`` link); ``s``: a scenario of the
    layout's shape (TP, CP, micro-batch), ``pp``, ``v`` and ``schedule`` the layout's (study/layouts.py
    schedule_of); ``cost`` prices a tuple of ops as a task (``costs/dispatch.py`` task_cost, the screen's TP
    collectives)."""
    par = s.parallelism
    setup = cost(w.microbatch_setup) if w.microbatch_setup else TaskCost(0.0)
    # synchronised, the GPU idles until the host issues the step's first kernel: the setup's own, else the layers'
    idle = (setup.lead_s if setup.seconds > 0 else setup.host_s) if synchronised(s, w, pp, schedule) else 0.0
    per_step = setup.seconds + idle
    if pp == 1:
        return per_step
    if par.tensor_parallel > 1 and not par.sequence_parallel:
        act = send_bytes(s) * par.tensor_parallel  # the whole activation, of which each rank sent 1/t
        regather = collective_op("tp all-gather (pipeline scatter/gather)", "all_gather", "tp", act)
        per_step += 2 * cost((regather,)).seconds
    if not _overlapped(s, w, pp, schedule):  # blocking sends: each chunk's, each pass
        per_step += SENDS_PER_STEP.get(schedule, 2) * send_bytes(s) / link_Bps
    return v * per_step
