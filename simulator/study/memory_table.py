"""Per-GPU memory of a scenario across the ways of sharding and recomputing it: what DeepSpeed's
``estimate_zero*_mem_needs`` gives, with activations, buffers and the runtime's own memory included.

Each variant is the scenario with one change (the data-parallel strategy: DDP, ZeRO-1/2/3, FSDP, ZeRO-3 with the
optimizer or the parameters offloaded; and the activation recompute), validated as a scenario file is; its
memory comes from the strategy's program (as ``run`` reports it), nothing is simulated. A variant the scenario
cannot take (ZeRO-2/3 under a pipeline, NVMe on a node without drives) is listed with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simulator.errors import ScenarioError
from simulator.scenario.loader import load_scenario
from simulator.scenario.presets import merged
from simulator.scenario.schema import Scenario
from simulator.study.fit import peak_memory

GIB = 2**30
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class MemoryRow:
    strategy: str  # as the user would write it
    recompute: str
    current: bool  # the scenario as given
    gib: dict[str, float] | None  # params, grads, optimizer, activations, other, device, capacity, host
    fits: bool | None
    reason: str = ""  # why the variant cannot be taken

    def to_dict(self) -> dict:
        return {
            "strategy": self.strategy,
            "activation_recompute": self.recompute,
            "current": self.current,
            "memory_gib": self.gib,
            "fits": self.fits,
            "reason": self.reason,
        }


def strategies(s: Scenario) -> list[tuple[str, dict]]:
    """(label, parallelism changes) of the data-parallel strategies to compare."""
    none = {"device": "none"}
    plain = {"fsdp": None, "zero_stage": 0, "zero": {"offload_optimizer": none, "offload_param": none}}
    cpu, nvme = {"device": "cpu"}, {"device": "nvme"}
    if s.parallelism.data_parallel == 1:  # nothing to shard over: only recompute changes anything
        return []
    return [
        ("DDP", plain),
        ("ZeRO-1", {**plain, "zero_stage": 1}),
        ("ZeRO-2", {**plain, "zero_stage": 2}),
        ("ZeRO-3", {**plain, "zero_stage": 3}),
        ("FSDP", {**plain, "fsdp": {}}),
        ("ZeRO-3 + CPU optimizer", {**plain, "zero_stage": 3, "zero": {"offload_optimizer": cpu}}),
        (
            "ZeRO-3 + CPU optim., params",
            {**plain, "zero_stage": 3, "zero": {"offload_optimizer": cpu, "offload_param": cpu}},
        ),
        (
            "ZeRO-Infinity (NVMe)",
            {**plain, "zero_stage": 3, "zero": {"offload_optimizer": nvme, "offload_param": nvme}},
        ),
    ]


def memory_table(s: Scenario, progress: Callable[[str], None] | None = None) -> list[MemoryRow]:
    """Every strategy x recompute variant of ``s`` with its per-GPU memory and whether it fits; the scenario's
    own strategy is marked (and listed first as "as given" where it is none of the compared ones)."""
    base = s.model_dump(mode="json", exclude_none=True)
    base.pop("deepspeed_config", None)  # its settings are already in the scenario
    loaded: list[tuple[str, Scenario | None, str]] = []
    for label, par in strategies(s):
        data = merged(base, {"parallelism": par})
        if par.get("fsdp", "absent") is None:
            data["parallelism"].pop("fsdp", None)
        try:
            loaded.append((label, load_scenario(data), ""))
        except ScenarioError as e:
            loaded.append((label, None, str(e).splitlines()[0]))
    if not any(v is not None and v.parallelism == s.parallelism for _, v, _ in loaded):
        loaded.insert(0, ("as given", s, ""))
    rows = []
    for label, variant, reason in loaded:
        current_strategy = variant is not None and variant.parallelism == s.parallelism
        if variant is None:  # one row: the reason holds whatever the recompute
            rows.append(MemoryRow(label, "-", False, None, None, reason))
            continue
        for recompute in RECOMPUTE:
            current = current_strategy and recompute == s.training.activation_recompute
            if progress:
                progress(f"{label}, {recompute}")
            training = variant.training.model_copy(update={"activation_recompute": recompute})
            try:
                mem = peak_memory(
                    load_scenario(variant.model_copy(update={"training": training}).model_dump())
                )
            except (
                ScenarioError
            ) as e:  # the strategy does not go with the rest of the scenario: one row says why
                rows.append(MemoryRow(label, "-", False, None, None, str(e).splitlines()[0]))
                break
            rows.append(MemoryRow(label, recompute, current, _gib(mem), not (mem.oom or mem.host_oom)))
    return rows


def _gib(mem) -> dict[str, float]:
    other = mem.buffers + mem.graphs + mem.step_extra + mem.context + mem.nccl + mem.fragmentation
    return {
        "params": mem.params / GIB,
        "grads": mem.grads / GIB,
        "optimizer": mem.optimizer / GIB,
        "activations": mem.activations / GIB,
        "other": other / GIB,
        "device": mem.device / GIB,
        "capacity": mem.capacity / GIB,
        "host_per_node": mem.host / GIB,
    }
