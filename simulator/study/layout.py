"""One parallel layout of a plan (:class:`Layout`): its degrees, schedule, sharding, recompute and searched switches,
as a scenario's parallelism section and a label; the screen's :class:`Estimate` of it; the base scenario's switches it
keeps (``carried``), the collectives' span and the pipeline bubble the screen prices it with."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from simulator.scenario.schema import DUAL_SCHEDULES, Scenario, path_stages

SHARDINGS = ("ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp", "zero2-offload", "zero3-offload")
# weights sharded too (--no-zero3 leaves them out)
FULL_SHARDINGS = ("zero3", "fsdp", "hsdp", "zero3-offload")
# ZeRO stage of each sharding; ``-offload``: DeepSpeed's optimizer on the host CPU (ZeRO-Offload, Ren et al.
# ATC'21; with stage 3 the weights stay on the GPU), without pipelining as DeepSpeed and the simulation allow
STAGES = {
    "ddp": 0,
    "zero1": 1,
    "zero2": 2,
    "zero3": 3,
    "fsdp": 3,
    "hsdp": 3,
    "zero2-offload": 2,
    "zero3-offload": 3,
}
OFFLOAD = {"offload_optimizer": {"device": "cpu", "pin_memory": True}}
HSDP_NODES = (1, 2, 4, 8)  # HSDP shard groups searched: this many whole nodes
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    cp: int
    dp: int
    v: int
    mbs: int
    sharding: str
    recompute: str
    ep: int = 1  # expert parallel (MoE models)
    etp: int = 1  # expert tensor parallel (MoE models)
    # HSDP: data-parallel ranks per shard group (FSDP2 hybrid sharding; replicated across groups)
    shard: int = 0
    # an uneven pipeline (PP not dividing the layers): layers on the first and last stage, the rest alike between
    # (Megatron's --decoder-first / --decoder-last-pipeline-num-layers); 0: every stage the same
    first: int = 0
    last: int = 0
    # a schedule beyond Megatron's: DeepSeek's "dualpipe" (each rank stages i and PP - 1 - i, every stage twice) or
    # "dualpipev" (2 PP stages in a V), first and last then the path's end stages, both on rank 0; "": Megatron's
    schedule: str = ""
    # the switches a plan with ``switches`` searches (None: the base's, or its stack's, as ``carried`` says):
    # sequence parallelism and Transformer Engine's TP communication overlap (TP > 1), the data-parallel gradient
    # reduction beside backward (DP > 1) and the distributed optimizer's weight gather beside forward (ZeRO-1)
    sp: bool | None = None
    tp_overlap: bool | None = None
    grad_overlap: bool | None = None
    param_overlap: bool | None = None
    # layers whose activations go to host memory and back (Megatron-Core --cpu-offloading-num-layers; Calculon's
    # ``activations_offload``): without PP and full recompute, under DDP or ZeRO-1/2 (what the simulation runs)
    act_offload: int | None = None

    def shape_key(self) -> tuple:
        """What sets a layer's ops, costs and activations: TP, CP, micro-batch, recompute, EP, ETP and the switches
        that change a layer (SP, TP overlap, activation offloading); the screen caches its costs by it."""
        return (
            self.tp,
            self.cp,
            self.mbs,
            self.recompute,
            self.ep,
            self.etp,
            self.sp,
            self.tp_overlap,
            self.act_offload,
        )

    def stage_layers(self, num_layers: int) -> tuple[int, int, int]:
        """Layers on the first, a middle and the last stage (DualPipe, DualPipeV: the first rank's, whose two chunks
        are the model's ends with the embedding and the output layer, and a middle rank's)."""
        if self.schedule in ("dualpipe", "dualpipev"):
            stages = path_stages(self.schedule, self.pp, self.v)
            middle = (
                (num_layers - self.first - self.last) // max(stages - 2, 1)
                if self.first
                else num_layers // stages
            )
            ends = self.first + self.last if self.first else 2 * middle
            return (ends,) * 3 if stages == 2 else (ends, 2 * middle, ends)
        if not self.first:
            return (num_layers // self.pp,) * 3
        middle = (num_layers - self.first - self.last) // (self.pp - 2) if self.pp > 2 else 0
        return self.first, middle, self.last

    def slowest_stage_s(self, num_layers: int, per_layer: float, embedding: float, head: float) -> float:
        """A micro-batch's time on the slowest stage: its layers at ``per_layer`` s each and the embedding /
        output layer it holds (all of them without a pipeline)."""
        if self.pp == 1:
            return num_layers * per_layer + embedding + head
        first, middle, last = self.stage_layers(num_layers)
        return max(first * per_layer + embedding, middle * per_layer, last * per_layer + head)

    def parallelism(self) -> dict:
        par: dict[str, Any] = {
            "tensor_parallel": self.tp,
            "pipeline_parallel": self.pp,
            "context_parallel": self.cp,
            "data_parallel": self.dp,
        }
        if self.schedule:
            par.update(pipeline_schedule=self.schedule)
        elif self.v > 1:
            par.update(pipeline_schedule="interleaved-1f1b", virtual_pipeline_stages=self.v)
        if self.first:
            par.update(first_pipeline_stage_layers=self.first, last_pipeline_stage_layers=self.last)
        if self.sp is not None:
            par.update(sequence_parallel=self.sp, tp_comm_overlap=bool(self.tp_overlap))
        ddp = {
            k: v
            for k, v in (
                ("overlap_grad_reduce", self.grad_overlap),
                ("overlap_param_gather", self.param_overlap),
            )
            if v is not None
        }
        if ddp:
            par["ddp"] = ddp
        if self.sharding == "fsdp":
            par["fsdp"] = {}
        elif self.sharding == "hsdp":
            par["fsdp"] = {"hybrid_shard_size": self.shard}
        elif self.sharding != "ddp":
            par["zero_stage"] = self.stage
            if self.offload:
                par["zero"] = OFFLOAD
        return par

    @property
    def stage(self) -> int:
        """The ZeRO stage the sharding amounts to (FSDP and HSDP: 3)."""
        return STAGES[self.sharding]

    @property
    def state_shards(self) -> int:
        """Data-parallel ranks the model states are sharded over (HSDP: its shard group; DDP keeps them whole
        whatever this says)."""
        return self.shard if self.sharding == "hsdp" else self.dp

    @property
    def offload(self) -> bool:
        """The optimizer runs on the host CPU (ZeRO-Offload)."""
        return self.sharding.endswith("-offload")

    @property
    def kind(self) -> str:
        """The sharding without its offload: how the GPUs exchange gradients and weights."""
        return self.sharding.removesuffix("-offload")

    def label(self) -> str:
        name = DUAL_SCHEDULES.get(self.schedule)
        pipe = f"PP{self.pp}" + (f" {name}" if name else f"x{self.v}" if self.v > 1 else "")
        if self.first:  # PP16[3..2]: 3 layers on the first stage, 2 on the last, the rest alike between
            pipe += f"[{self.first}..{self.last}]"
        parts = [f"TP{self.tp}", pipe, f"DP{self.dp}"]
        if self.cp > 1:
            parts.insert(2, f"CP{self.cp}")
        if self.ep > 1 or self.etp > 1:
            parts.append(f"EP{self.ep}" + (f" ETP{self.etp}" if self.etp > 1 else ""))
        return " ".join(parts) + f" mbs{self.mbs} {self.variant_label()}"

    def variant_label(self) -> str:
        """What a layout's shape leaves open: sharding, recompute and the searched switches (``sp+tpo``: sequence
        parallel with TP overlap; ``ovl:grad+param``: both data-parallel overlaps; ``ovl:-``: neither)."""
        text = f"{self.sharding_label()} rc:{self.recompute}"
        if self.sp is not None:
            text += " " + ("sp+tpo" if self.tp_overlap else "sp" if self.sp else "no-sp")
        if self.grad_overlap is not None or self.param_overlap is not None:
            on = [k for k, v in (("grad", self.grad_overlap), ("param", self.param_overlap)) if v]
            text += " ovl:" + ("+".join(on) or "-")
        if self.act_offload:
            text += f" act-offload:{self.act_offload}"
        return text

    def sharding_label(self) -> str:
        """The sharding as a table shows it: ``hsdp8`` for HSDP with shard groups of 8 data-parallel ranks."""
        return f"hsdp{self.shard}" if self.sharding == "hsdp" else self.sharding


@dataclass
class Estimate:
    layout: Layout
    iteration_s: float
    memory_gib: float
    compute_s: float
    bubble_s: float
    comm_s: float
    fits: bool
    bound: bool = False  # a lower bound: ZeRO-3's calls taken as hidden, the coordinator not replayed yet


# The base scenario's parallelism switches a planned layout keeps: they do not depend on the degrees (rank order,
# MoE dispatcher and overlap, DDP buckets and overlaps, collective algorithm, Megatron's p2p overlap); the others
# hold only where the layout has what they switch (``carried``). Degrees, stage splits and the sharding come from
# the layout.
KEPT = ("rank_order", "moe", "ddp", "collective_algorithm", "overlap_p2p_comm")
SEQUENTIAL_SCHEDULES = ("gpipe", "1f1b", "zb-h1", "pipedream-2bw", "deepspeed")


def carried(par: dict, lay: Layout) -> dict:
    """The base's parallelism settings (``par``, dumped) that apply to ``lay``: ``KEPT`` always; sequence
    parallelism and TP communication overlap with TP > 1; the ZeRO settings under ZeRO (but its offload, which the
    sharding decides), FSDP's under FSDP / HSDP; a non-interleaved pipeline schedule with PP > 1 and no virtual
    stages."""
    out = {k: v for k, v in par.items() if k in KEPT}
    if lay.tp > 1:
        out.update({k: par[k] for k in ("sequence_parallel", "tp_comm_overlap") if k in par})
    if lay.sharding.startswith("zero") and "zero" in par:  # offload is the layout's to say
        out["zero"] = {
            k: v for k, v in par["zero"].items() if k not in ("offload_optimizer", "offload_param")
        }
    if lay.sharding in ("fsdp", "hsdp") and par.get("fsdp"):
        out["fsdp"] = {k: v for k, v in par["fsdp"].items() if k != "hybrid_shard_size"}
    if lay.pp > 1 and lay.v == 1 and par.get("pipeline_schedule") in SEQUENTIAL_SCHEDULES:
        out["pipeline_schedule"] = par["pipeline_schedule"]
    return out


def schedule_of(base: Scenario, lay: Layout) -> str:
    """The pipeline schedule ``lay`` runs (``Layout.parallelism`` and ``carried``)."""
    if lay.schedule:
        return lay.schedule
    if lay.v > 1:
        return "interleaved-1f1b"
    given = base.parallelism.pipeline_schedule
    return given if given in SEQUENTIAL_SCHEDULES else "1f1b"


def collective_span(lay: Layout, gpn: int) -> tuple[int, int]:
    """(data-parallel ranks, pipeline stages) a layout's in-layer collectives (TP, CP, EP, ETP) are costed over:
    enough for one expert group, and for the expert groups as they fall on nodes (the least common multiple of a
    group and a node: 32-rank groups straddle 72-GPU NVL72 racks), at most the layout's; where a stage's ranks are
    no whole number of nodes, the stages until they are again (PP 9 of 64 GPUs each on 72-GPU racks: all 9)."""
    inner, group = lay.tp * lay.cp, lay.ep * lay.etp
    dp = max(1, -(-(math.lcm(group, gpn) if group > 1 else 1) // inner))
    while (inner * dp) % group:
        dp += 1
    dp = min(dp, lay.dp)
    stage = inner * dp
    pp = min(lay.pp, math.lcm(stage, gpn) // stage) if group > 1 and dp == lay.dp and stage % gpn else 1
    return dp, pp


def pipeline_bubble(lay: Layout, step: float) -> float:
    """Pipeline idle time at ``step`` s a rank per micro-batch: (PP - 1) steps / v (1F1B, interleaved); DualPipe's
    README's (PP/2 - 1)(F&B + B - 3W) of its stages at B = 2F = 2W: DualPipeV (PP - 1) / 3 steps, DualPipe a third."""
    if lay.pp == 1:
        return 0.0
    if lay.schedule == "dualpipev":
        return (lay.pp - 1) / 3 * step
    if lay.schedule == "dualpipe":
        return (lay.pp / 2 - 1) * 2 / 3 * step / 2
    return (lay.pp - 1) / lay.v * step
