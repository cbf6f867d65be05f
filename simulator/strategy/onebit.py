"""DeepSpeed's communication-compressed Adam: 1-bit Adam (Tang et al. ICML 2021) and 0/1 Adam (Lu et al. ICLR
2023), on data parallelism.

A run of these optimizers has steps of three kinds, each simulated as its own program:

* ``warm-up`` (full precision): plain DDP, gradients all-reduced in buckets under the backward pass.
* ``compressed``: no gradient all-reduce in backward; in the step, the momentum is all-reduced with
  error-compensated 1-bit compression (DeepSpeed's ``compressed_allreduce``): each rank packs signs (1 bit per
  element) and one fp32 scale per chunk, sends chunk j to rank j (all-to-all), each rank averages and
  recompresses its chunk, and the chunks are all-gathered. Per rank 2(n-1)/n x E/8 bytes instead of a 16-bit
  ring all-reduce's 2(n-1)/n x 2E: 1/16 (1/32 against fp32).
* ``local`` (0/1 Adam after ``var_freeze_step``): steps that skip synchronisation altogether.

``step_counts`` says how many steps of each kind a run of ``total_steps`` has, for the amortised average.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.hardware.cluster import Cluster
from simulator.program import COMPUTE, Program
from simulator.scenario.schema import ONEBIT_OPTIMIZERS, OneBitConfig, Scenario
from simulator.strategy import ddp
from simulator.strategy.groups import grad_group, grad_group_size
from simulator.strategy.steps import add_optimizer
from simulator.strategy.units import parameter_tensors
from simulator.workload.ops import memory_op
from simulator.workload.transformer import Workload

OPTIMIZERS = ONEBIT_OPTIMIZERS  # training.optimizer values this module builds
PHASES = ("warm-up", "compressed", "local")
SCALE_BYTES = 4  # one fp32 scale per rank's chunk
# GPU memory traffic of compression per momentum element: the worker reads the momentum and its error buffer
# and writes the error back (12 bytes), the server side does the same on its 1/n, and the final decompression
# writes the fp32 momentum (4): ~16 bytes.
COMPRESS_BYTES_PER_ELEMENT = 16


def build(s: Scenario, w: Workload, cluster: Cluster, phase: str = "compressed") -> Program:
    if phase not in PHASES:
        raise ValueError(phase)
    n, E = grad_group_size(s), w.params_per_rank
    p = ddp.build(s, w, cluster, reduce_gradients=phase == "warm-up")
    p.strategy = f"{s.training.optimizer} ({phase})"
    if phase != "warm-up":
        deps: tuple = ()
        if phase == "compressed" and n > 1:
            kernel = memory_op("1-bit compress / decompress", COMPRESS_BYTES_PER_ELEMENT * E)
            prev = p.add(0, COMPUTE, "optimizer", "optimizer", "momentum compression", (), ops=(kernel,))
            for kind in ("all_to_all", "all_gather"):
                prev = p.add(
                    0,
                    "comm.dp",
                    kind,
                    "optimizer",
                    f"1-bit momentum {kind.replace('_', '-')}",
                    (prev,),
                    group=grad_group(s),
                    bytes=compressed_bytes(E, n),
                )
            deps = (prev,)
        add_optimizer(p, s, E, deps, w=w, tensors=parameter_tensors(s, w.num_layers, True, True))
    # error feedback: the worker's error on the whole momentum, the server's on its 1/n chunk (fp32)
    rank = p.ranks[0]
    rank.memory = replace(rank.memory, buffers=rank.memory.buffers + 4 * E + 4 * E / n)
    return p


def compressed_bytes(elements: float, n: int) -> float:
    """The buffer one compressed step exchanges (NCCL-style full size): a sign bit per element plus a scale per
    rank's chunk."""
    return elements / 8 + SCALE_BYTES * n


def step_counts(optimizer: str, cfg: OneBitConfig, total: int) -> dict[str, int]:
    """Steps of each kind in ``total`` training steps.

    1-bit Adam: ``freeze_step`` warm-up steps, then compressed ones. 0/1 Adam (DeepSpeed ``ZeroOneAdam``): before
    ``var_freeze_step`` a step updates the variance (a full-precision all-reduce) every ``interval`` steps,
    the interval starting at 1 and doubling after every ``var_update_scaler`` updates, and the other steps are
    compressed; after it, a compressed sync happens every ``local`` steps, ``local`` starting at 1 and doubling
    every ``local_step_scaler`` steps up to ``local_step_clipper``; the rest are local steps.
    """
    if optimizer == "onebit-adam":
        warm = min(cfg.freeze_step, total)
        return {"warm-up": warm, "compressed": total - warm, "local": 0}
    full = 0
    step, interval, freeze = 0, 1, min(cfg.var_freeze_step, total)
    while step < freeze:  # segments of var_update_scaler variance updates at spacing ``interval``
        span = min(interval * cfg.var_update_scaler, freeze - step)
        full += -(-span // interval)
        step += span
        interval *= 2
    synced, local = 0, 1
    while step < total:
        span = min(cfg.local_step_scaler, total - step) if local < cfg.local_step_clipper else total - step
        synced += -(-span // local)
        step += span
        local = min(2 * local, cfg.local_step_clipper)
    return {"warm-up": full, "compressed": freeze - full + synced, "local": total - freeze - synced}
