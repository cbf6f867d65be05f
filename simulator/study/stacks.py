"""Which training stack runs a planned layout when the plan is given none (``plan --model`` with the framework
left to auto): each layout is screened and simulated with the profile and the usual switches of the stack that
would run it, so that the plan's time is what ``run`` gives for the scenario it writes.

- Tensor, pipeline or context parallelism, and any mixture-of-experts model, under DDP, the distributed optimizer
  (``zero1``) or DeepSpeed's ZeRO: Megatron. On Hopper and later Megatron-Core with Transformer Engine
  (``megatron-core-2024``) with the switches of NVIDIA's own recipes: sequence parallelism with TP,
  Transformer Engine's TP communication overlap (``--tp-comm-overlap``) and both distributed-optimizer overlaps
  (``--overlap-grad-reduce --overlap-param-gather``; Megatron-LM examples and the Megatron-Core performance table
  of docs/validation.md, whose runs set all three); before Hopper Megatron-LM's own layer (``megatron-2022``) with
  sequence parallelism (Korthikanti et al. 2022, ``--sequence-parallel``) and its DDP's defaults.
- FSDP and HSDP, with or without TP / PP / CP (torchtitan's 2D / 3D / 4D), and data parallelism alone (PyTorch
  DDP, DeepSpeed ZeRO): eager PyTorch (``pytorch-2024``), as ``run`` picks for a scenario that names no profile
  (``frameworks.default_framework``).

``plan --stack NAME`` makes the stack a choice: every layout on that stack, its profile and its shardings alone.

- ``megatron``: Megatron-LM / Megatron-Core (profile as above), data parallelism by its DDP or its distributed
  optimizer (``ddp``, ``zero1``).
- ``torchtitan``: FSDP2 and HSDP with TP / PP / CP, or replication alone (``ddp``), on ``pytorch-2024``.
- ``deepspeed``: DeepSpeed's ZeRO stages 0-3 and ZeRO-Offload; Megatron-DeepSpeed's layer (``megatron-2022``,
  Megatron-LM's 2022 code it forks) where TP, PP or CP is above 1, else ``pytorch-2024``.
"""

from __future__ import annotations

from simulator.frameworks import AUTO, megatron_profile
from simulator.hardware.cluster import Cluster
from simulator.scenario.loader import load_scenario
from simulator.scenario.schema import Scenario
from simulator.study.layout import Layout
from simulator.study.screen import Screen

# the parallelism switches each stack's runs set (carried onto a layout where it has what they switch:
# layouts.carried); profiles not named here keep their own defaults
SWITCHES = {
    "megatron-core-2024": {
        "sequence_parallel": True,
        "tp_comm_overlap": True,
        "ddp": {"overlap_grad_reduce": True, "overlap_param_gather": True},
    },
    "megatron-2022": {"sequence_parallel": True},
    # torchtitan's TP runs the norms and the dropout sequence-parallel (parallelize.py: SequenceParallel)
    "pytorch-2024": {"sequence_parallel": True},
}


# plan --stack: the shardings each stack runs (layouts.SHARDINGS' names)
STACK_SHARDINGS = {
    "megatron": ("ddp", "zero1"),
    "torchtitan": ("ddp", "fsdp", "hsdp"),
    "deepspeed": ("ddp", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload"),
}
STACKS = tuple(STACK_SHARDINGS)
# DeepSeek's schedules each stack runs: torchtitan DualPipeV (torch.distributed.pipelining ScheduleDualPipeV),
# Megatron-LM and DeepSpeed neither
STACK_SCHEDULES = {"megatron": (), "torchtitan": ("dualpipev",), "deepspeed": ()}


def stack_of(base: Scenario, lay: Layout, architecture: str, stack: str = AUTO) -> str:
    """The profile that runs ``lay`` on ``stack`` (module docstring)."""
    megatron = megatron_profile(architecture)
    if stack == "megatron":
        return megatron
    if stack == "torchtitan":
        return "pytorch-2024"
    if stack == "deepspeed":
        return "megatron-2022" if max(lay.tp, lay.pp, lay.cp) > 1 else "pytorch-2024"
    if base.model.moe is not None:
        return megatron
    if lay.kind in ("fsdp", "hsdp"):
        return "pytorch-2024"
    return megatron if max(lay.tp, lay.pp, lay.cp) > 1 else "pytorch-2024"


def stack_base(base: Scenario, framework: str) -> Scenario:
    """``base`` run by ``framework``, with that stack's switches set."""
    data = base.model_dump(mode="json", exclude_none=True)
    data["framework"] = framework
    par = data["parallelism"]
    for k, v in SWITCHES.get(framework, {}).items():
        par[k] = {**par.get(k, {}), **v} if isinstance(v, dict) else v
    return load_scenario(data)


class ByStack:
    """One :class:`Screen` per stack, each layout estimated and made a scenario by its own stack's."""

    def __init__(self, base: Scenario, cluster: Cluster, batch: int | None, gpus: int, stack: str = AUTO):
        self.base, self.cluster, self.batch, self.gpus, self.stack = base, cluster, batch, gpus, stack
        self._screens: dict[str, Screen] = {}
        self._capacity = cluster.gpu.hbm_bytes
        self._prune = False

    def screen(self, lay: Layout) -> Screen:
        name = stack_of(self.base, lay, self.cluster.gpu.architecture, self.stack)
        if name not in self._screens:
            s = Screen(stack_base(self.base, name), self.cluster, self.batch, self.gpus)
            s.capacity, s.prune = self._capacity, self._prune
            self._screens[name] = s
        return self._screens[name]

    @property
    def capacity(self) -> float:
        return self._capacity

    @capacity.setter
    def capacity(self, value: float) -> None:
        self._capacity = value
        for s in self._screens.values():
            s.capacity = value

    @property
    def prune(self) -> bool:
        """Screen.prune, for every stack's screen."""
        return self._prune

    @prune.setter
    def prune(self, value: bool) -> None:
        self._prune = value
        for s in self._screens.values():
            s.prune = value

    def estimate(self, lay: Layout, bound: bool = False):
        return self.screen(lay).estimate(lay, bound)

    def scenario(self, lay: Layout) -> Scenario:
        return self.screen(lay).scenario(lay)


def screen_for(base: Scenario, cluster: Cluster, batch: int | None, gpus: int, stack: str | None):
    """The plan's screen: per layout by its stack where ``stack`` is auto or a stack's name, else ``base``'s own
    profile."""
    if stack == AUTO or stack in STACKS:
        return ByStack(base, cluster, batch, gpus, stack)
    return Screen(base, cluster, batch, gpus)
