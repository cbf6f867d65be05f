"""What would fit: when a scenario does not fit in GPU memory, the nearest changes that do.

Each candidate change is applied to the scenario, validated as a scenario file would be, and its strategy's
program is built (the per-rank memory comes from the program, not from a second formula); nothing is simulated.
Tried in order, cheapest change first: activation recompute, sharding the model states (ZeRO-3 without a pipeline,
ZeRO-1 with one), both, a larger tensor-parallel degree on the same GPUs, then more nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import ScenarioError
from simulator.frameworks import get_framework
from simulator.hardware.cluster import Cluster
from simulator.hardware.topology import cluster_spec
from simulator.scenario.loader import load_scenario
from simulator.scenario.schema import Scenario
from simulator.strategy import build_program
from simulator.workload.memory import MemoryBreakdown
from simulator.workload.transformer import build_workload

MORE_NODES = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Fix:
    change: str  # as the user would write it: "zero_stage: 3, activation_recompute: full"
    device_gib: float  # what the GPU would hold: peak allocation, context, NCCL buffers, reserve
    capacity_gib: float


def peak_memory(s: Scenario) -> MemoryBreakdown:
    """The largest per-rank memory of ``s``'s program (the rank ``run`` reports)."""
    cluster = Cluster(cluster_spec(s), s.cluster.num_nodes)
    program = build_program(
        s, build_workload(s, get_framework(s.framework), cluster.gpus_per_node, cluster.gpu), cluster
    )
    return max((r.memory for r in program.ranks), key=lambda m: m.device)


def _variants(s: Scenario) -> list[tuple[str, dict]]:
    """(what changes, the scenario data with it) in the order a user would try them."""
    p, t = s.parallelism, s.training
    base = s.model_dump(mode="json", exclude_none=True)
    base.pop("deepspeed_config", None)  # its settings are already in the scenario

    def changed(**sections) -> dict:
        data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
        for section, updates in sections.items():
            data[section] = {**data[section], **updates}
        return data

    recompute = {"activation_recompute": "full"} if t.activation_recompute != "full" else None
    # sharding, the cheapest stage first: ZeRO-1 and ZeRO-2 cost no more communication than DDP (a
    # reduce-scatter and an all-gather instead of an all-reduce), ZeRO-3 gathers the weights at every layer
    stages: list[int] = []
    if p.data_parallel > 1 and p.fsdp is None and t.optimizer not in ("onebit-adam", "zero-one-adam"):
        if p.pipeline_parallel == 1:
            stages = [z for z in (1, 2, 3) if z > p.zero_stage]
        elif p.zero_stage == 0:
            stages = [1]
    shard = {"zero_stage": stages[-1]} if stages else None  # the deepest, for the combinations below
    gpus_per_node = cluster_spec(s).node.gpus
    out = []
    for z in stages:
        out.append((f"zero_stage: {z}", changed(parallelism={"zero_stage": z})))
    if recompute:
        out.append(("activation_recompute: full", changed(training=recompute)))
    for z in stages if recompute else ():
        out.append(
            (
                f"zero_stage: {z}, activation_recompute: full",
                changed(training=recompute, parallelism={"zero_stage": z}),
            )
        )
    both_t, both_p = recompute or {}, shard or {}
    tp = p.tensor_parallel * 2
    if p.data_parallel % 2 == 0:
        par = {**both_p, "tensor_parallel": tp, "data_parallel": p.data_parallel // 2}
        if tp > 1:
            par["sequence_parallel"] = True
        extra = ", ".join(f"{k}: {v}" for k, v in {**both_t, **par}.items() if k != "data_parallel")
        out.append((extra, changed(training=both_t, parallelism=par)))
    for k in MORE_NODES:
        nodes, dp = s.cluster.num_nodes * k, p.data_parallel * k
        training = dict(both_t)
        if t.global_batch_size % (t.micro_batch_size * dp):  # keep the batch per GPU instead
            training["global_batch_size"] = t.global_batch_size * k
        label = f"num_nodes: {nodes} ({nodes * gpus_per_node} GPUs)"
        extra = "".join(f", {key}: {v}" for key, v in {**training, **both_p}.items())
        out.append(
            (
                label + extra,
                changed(
                    training=training,
                    parallelism={**both_p, "data_parallel": dp},
                    cluster={"num_nodes": nodes},
                ),
            )
        )
    return out


def what_fits(s: Scenario, limit: int = 3) -> list[Fix]:
    """Up to ``limit`` changes to ``s`` that fit in GPU (and host) memory, the smallest change first; after a
    change that adds nodes fits, larger node counts are not tried."""
    fixes: list[Fix] = []
    for change, data in _variants(s):
        if len(fixes) >= limit:
            break
        try:
            mem = peak_memory(load_scenario(data))
        except ScenarioError:  # does not divide, or not supported with the rest of the scenario
            continue
        if not (mem.oom or mem.host_oom):
            fixes.append(Fix(change, mem.device / 2**30, mem.capacity / 2**30))
            if change.startswith("num_nodes"):
                break
    return fixes
