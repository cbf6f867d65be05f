"""The layouts a plan searches: every way to lay a model out on N GPUs that divides (tensor, context, pipeline
and data parallel sizes, virtual stages, micro-batch size, weight / gradient sharding (DDP, ZeRO-1/2/3, FSDP and
HSDP with shard groups of whole nodes), activation recompute; for a mixture-of-experts model expert parallel and
expert tensor parallel sizes too; DeepSeek's DualPipe and DualPipeV beside Megatron's pipeline schedules)."""

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
MAX_MICRO_BATCH = 16  # micro-batches searched by default: every one up to this dividing a rank's batch


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
        return " ".join(parts) + f" mbs{self.mbs} {self.sharding_label()} rc:{self.recompute}"

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


def divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, (limit or n) + 1) if n % d == 0]


def candidates(
    base: Scenario, gpus: int, gpn: int, options: dict | None = None, batch: int | None = None
) -> list[Layout]:
    """Every layout that divides: TP within a node and dividing heads / query groups / FFN, PP dividing the
    layers, CP (FlashAttention only) leaving at least 2,048 tokens per rank, micro-batches up to
    MAX_MICRO_BATCH dividing a data-parallel rank's batch, interleaving by every number of virtual stages that
    divides a stage's layers, only where the microbatches are a multiple of PP, ZeRO-2/3, FSDP and HSDP only without PP
    (HSDP without CP, its shard groups whole nodes: ``hsdp_shards``); for
    a mixture-of-experts model EP dividing the experts and ETP (1 or TP) with ETP x EP dividing TP x CP x DP,
    sharding by DDP or ZeRO-1/2 (what the MoE frameworks run)."""
    o = options or {}
    m, batch = base.model, batch or base.training.global_batch_size
    tps = [
        t
        for t in divisors(gpn)
        if m.num_attention_heads % t == 0 and m.query_groups % t == 0 and m.ffn_size % t == 0
    ]
    cps = [1] + (
        [c for c in (2, 4, 8, 16) if m.seq_length // c >= 2048 and m.seq_length % (2 * c) == 0]
        if m.attention == "flash"
        else []
    )
    pps = [p for p in range(1, min(m.num_layers, o.get("max_pp", 64)) + 1) if stage_split(m.num_layers, p)]
    mbss = o.get("micro_batch_sizes")  # default: every micro-batch up to 16 dividing a rank's batch (below)
    moe = m.moe
    shardings = o.get("shardings", SHARDINGS if moe is None else ("ddp", "zero1", "zero2"))
    # selective recompute re-runs the attention scores that FlashAttention never stores: the same as none, unless
    # the base names Megatron-Core's other recompute modules
    plain = m.attention == "flash" and base.training.recompute.modules == ("core_attn",)
    recomputes = o.get("recompute", tuple(r for r in RECOMPUTE if not (r == "selective" and plain)))
    out = []
    for tp in o.get("tp", tps):
        for cp in o.get("cp", cps):
            for pp in o.get("pp", pps):
                if gpus % (tp * cp * pp):
                    continue
                dp = gpus // (tp * cp * pp)
                local = batch // dp if batch % dp == 0 else 0  # a data-parallel rank's samples
                split = stage_split(m.num_layers, pp)
                if split is None:
                    continue
                first, middle, last = split
                ends = (first, last) if m.num_layers % pp else (0, 0)
                for mbs in mbss or divisors(local, MAX_MICRO_BATCH):
                    if not local or local % mbs:
                        continue
                    gas = batch // (mbs * dp)
                    vs = [1] + [
                        v
                        for v in o.get("virtual", range(2, m.num_layers // pp + 1))
                        if pp > 1 and middle % v == 0 and min(first, last) >= v - 1 and gas % pp == 0
                    ]
                    # DeepSeek's DualPipe / DualPipeV where their stages split the layers (dual_plans)
                    plans = [(v, "", ends) for v in vs] + dual_plans(m.num_layers, pp, gas, o)
                    for v, schedule, cut in plans:
                        for sh in shardings:
                            if pp > 1 and sh not in ("ddp", "zero1"):
                                continue
                            if dp == 1 and sh != "ddp":
                                continue
                            shards = (0,)  # HSDP: its shard-group sizes, none with context parallelism
                            if sh == "hsdp":
                                shards = hsdp_shards(tp * cp, dp, gpn) if cp == 1 else ()
                                if not shards:
                                    continue
                            for ep, etp in _expert_layouts(moe, tp, cp, dp, o):
                                for rc in recomputes:
                                    for shard in shards:
                                        out.append(
                                            Layout(
                                                tp, pp, cp, dp, v, mbs, sh, rc, ep, etp, shard, *cut, schedule
                                            )
                                        )
    return out


def dual_plans(num_layers: int, pp: int, gas: int, o: dict) -> list[tuple[int, str, tuple[int, int]]]:
    """(virtual stages, schedule, (first, last)) of DeepSeek's schedules where their stages split the layers
    (``stage_split`` over PP stages for DualPipe, 2 PP for DualPipeV) and the micro-batches fill them (at least
    2 PP; DualPipe an even count over an even PP: strategy/pipeline/partition.py)."""
    out = []
    for name in o.get("schedules", ("dualpipe", "dualpipev")):
        stages = path_stages(name, pp, 2)
        split = stage_split(num_layers, stages)
        if pp < 2 or gas < 2 * pp or split is None or (name == "dualpipe" and (pp % 2 or gas % 2)):
            continue
        out.append((2, name, (0, 0) if num_layers % stages == 0 else (split[0], split[2])))
    return out


def stage_split(num_layers: int, pp: int) -> tuple[int, int, int] | None:
    """(first, middle, last) stage layers of ``pp`` stages: alike where PP divides the layers; else each middle
    stage ceil(L / PP) and the rest on the two end stages, the last (with the output layer and loss) the lighter,
    each with at least one layer and at most a middle stage's (DeepSeek-V3's 61 layers on 16 stages: 3, 4, 2);
    None where no such split exists."""
    if num_layers % pp == 0:
        return (num_layers // pp,) * 3
    if pp < 2:
        return None
    middle = -(-num_layers // pp) if pp > 2 else 0
    rest = num_layers - (pp - 2) * middle
    last = rest // 2
    first = rest - last
    if last < 1 or (pp > 2 and first > middle):
        return None
    return first, middle, last


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


def hsdp_shards(inner: int, dp: int, gpn: int) -> tuple[int, ...]:
    """HSDP shard-group sizes (data-parallel ranks) whose groups fill 1, 2, 4 or 8 whole nodes, leaving at least two
    replicas (``inner``: the TP x CP ranks of one data-parallel rank)."""
    out = []
    for nodes in HSDP_NODES:
        ranks = nodes * gpn
        if ranks % inner:
            continue
        shard = ranks // inner
        if 1 < shard < dp and dp % shard == 0:
            out.append(shard)
    return tuple(out)


def _expert_layouts(moe, tp: int, cp: int, dp: int, o: dict) -> list[tuple[int, int]]:
    """(EP, ETP) pairs a layout's ranks can fold the experts over (Megatron-Core: ETP x EP divides TP x CP x DP)."""
    if moe is None:
        return [(1, 1)]
    ranks = tp * cp * dp
    eps = o.get("ep", divisors(moe.num_experts))
    etps = o.get("etp", sorted({1, tp}))
    return [(ep, etp) for ep in eps for etp in etps if ranks % (ep * etp) == 0]


def why_none(
    base: Scenario, gpus: int, gpn: int, options: dict | None = None, batch: int | None = None
) -> str:
    """Which dimension left ``candidates`` empty: the first of TP, PP, TP x CP x PP against the GPUs, the batch
    against the data-parallel sizes, the micro-batches, and the expert layouts that no choice passes."""
    o = options or {}
    m, batch = base.model, batch or base.training.global_batch_size
    tps = [
        t
        for t in o.get("tp", divisors(gpn))
        if t <= gpn and not (m.num_attention_heads % t or m.ffn_size % t)
    ]
    tps = [t for t in tps if m.query_groups % t == 0]
    if not tps:
        return (
            f"no tensor-parallel size ({', '.join(map(str, o.get('tp', divisors(gpn))))}) fits a {gpn}-GPU node and "
            f"divides the {m.num_attention_heads} heads, {m.query_groups} query groups and FFN width {m.ffn_size}"
        )
    pps = [
        p
        for p in o.get("pp", range(1, min(m.num_layers, o.get("max_pp", 64)) + 1))
        if stage_split(m.num_layers, p)
    ]
    if not pps:
        return (
            f"no pipeline size ({', '.join(map(str, o.get('pp', ())))}) splits the {m.num_layers} layers (evenly, "
            "or with the first and last stages holding the rest)"
        )
    cps = o.get("cp", [1])
    shapes = [(t, c, p) for t in tps for c in cps for p in pps if gpus % (t * c * p) == 0]
    if not shapes:
        return f"no TP ({tps}) x CP ({cps}) x PP ({pps}) divides the {gpus} GPUs"
    dps = sorted({gpus // (t * c * p) for t, c, p in shapes})
    if all(batch % dp for dp in dps):
        return f"the global batch ({batch}) divides by none of the data-parallel sizes these leave ({dps})"
    mbss = o.get("micro_batch_sizes")
    if mbss and all(batch % dp or (batch // dp) % mbs for dp in dps for mbs in mbss):
        return f"no micro-batch size ({', '.join(map(str, mbss))}) divides a data-parallel rank's batch"
    if m.moe is not None and not any(
        _expert_layouts(m.moe, t, c, gpus // (t * c * p), o) for t, c, p in shapes
    ):
        return (
            f"no expert-parallel size ({', '.join(map(str, o.get('ep', ())))}) folds the {m.moe.num_experts} "
            "experts over these layouts"
        )
    return "every combination is refused by the shardings, recompute or HSDP groups given"


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
