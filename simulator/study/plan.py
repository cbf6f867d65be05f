"""Parallel-layout search: enumerate tensor, pipeline, context and data parallel sizes, virtual stages,
micro-batch size, weight / gradient sharding and activation recompute for a model on N GPUs; screen every
candidate with a closed-form estimate built from the simulator's own costs; confirm the best with the simulation.

The estimate (:class:`Screen`) takes each layer's forward and backward time from the same kernel and collective
costs the engine uses (``build_workload`` + ``task_cost``, cached per shape), the pipeline as (m + (p - 1)/v)
steps of its slowest stage, data-parallel reductions as NCCL rings at the links' bandwidth (the simulator's
protocol latencies) exposed where the framework does not overlap them, FSDP's per-unit calls and DeepSpeed
ZeRO-3's per-module calls (the simulation's own replay of its coordinator) hidden under the compute of their
pass up to what their count and size cost, and memory from the same model-state and activation formulas. It
ranks; the discrete-event simulation of the best ``k`` decides.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from simulator.costs.collectives import CollectiveModel
from simulator.costs.compute import ComputeModel
from simulator.costs.dispatch import task_cost
from simulator.costs.nccl import fastest, protocol_costs
from simulator.costs.tables import table_lookups
from simulator.errors import ScenarioError
from simulator.frameworks import get_framework
from simulator.hardware.cluster import Cluster
from simulator.hardware.placement import Placement
from simulator.hardware.topology import cluster_spec
from simulator.scenario.loader import load_scenario
from simulator.scenario.schema import Scenario
from simulator.strategy.state_bytes import grad_bytes, weight_bytes
from simulator.strategy.zero import fetch_schedule
from simulator.tables.select import resolve_table
from simulator.workload.memory import activation_bytes_per_layer, head_activation_bytes, state_bytes_per_param
from simulator.workload.transformer import build_workload

SHARDINGS = ("ddp", "zero1", "zero2", "zero3", "fsdp")
RECOMPUTE = ("none", "selective", "full")
MEMORY_HEADROOM = 0.9  # screen out what needs more than 90% of the GPU (allocator, context, NCCL buffers)


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

    def parallelism(self) -> dict:
        par: dict[str, Any] = {
            "tensor_parallel": self.tp,
            "pipeline_parallel": self.pp,
            "context_parallel": self.cp,
            "data_parallel": self.dp,
        }
        if self.v > 1:
            par.update(pipeline_schedule="interleaved-1f1b", virtual_pipeline_stages=self.v)
        if self.sharding == "fsdp":
            par["fsdp"] = {}
        elif self.sharding != "ddp":
            par["zero_stage"] = int(self.sharding[-1])
        return par

    def label(self) -> str:
        parts = [f"TP{self.tp}", f"PP{self.pp}" + (f"x{self.v}" if self.v > 1 else ""), f"DP{self.dp}"]
        if self.cp > 1:
            parts.insert(2, f"CP{self.cp}")
        return " ".join(parts) + f" mbs{self.mbs} {self.sharding} rc:{self.recompute}"


@dataclass
class Estimate:
    layout: Layout
    iteration_s: float
    memory_gib: float
    compute_s: float
    bubble_s: float
    comm_s: float
    fits: bool


@dataclass
class Confirmed:
    layout: Layout
    estimate_s: float
    iteration_time_s: float | None
    mfu: float | None
    memory_gib: float | None
    bubble_fraction: float | None
    exposed_comm_s: float | None
    compute_s: float | None
    status: str
    reason: str = ""
    breakdown: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("layout"))
        d["layout"] = self.layout.label()
        return d


def divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, (limit or n) + 1) if n % d == 0]


def candidates(
    base: Scenario, gpus: int, gpn: int, options: dict | None = None, batch: int | None = None
) -> list[Layout]:
    """Every layout that divides: TP within a node and dividing heads / query groups / FFN, PP dividing the
    layers, CP (FlashAttention only) leaving at least 2,048 tokens per rank, micro-batches dividing the
    batch, interleaving only where the microbatches are a multiple of PP, ZeRO-2/3 and FSDP only without PP."""
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
    pps = [p for p in divisors(m.num_layers, min(m.num_layers, o.get("max_pp", 64)))]
    mbss = [b for b in o.get("micro_batch_sizes", (1, 2, 4, 8, 16))]
    shardings = o.get("shardings", SHARDINGS)
    # selective recompute re-runs the attention scores that FlashAttention never stores: the same as none
    recomputes = o.get(
        "recompute", tuple(r for r in RECOMPUTE if not (r == "selective" and m.attention == "flash"))
    )
    out = []
    for tp in o.get("tp", tps):
        for cp in o.get("cp", cps):
            for pp in o.get("pp", pps):
                if gpus % (tp * cp * pp):
                    continue
                dp = gpus // (tp * cp * pp)
                for mbs in mbss:
                    if batch % (mbs * dp):
                        continue
                    gas = batch // (mbs * dp)
                    vs = [1] + [
                        v
                        for v in o.get("virtual", (2, 4))
                        if pp > 1 and m.num_layers % (pp * v) == 0 and gas % pp == 0
                    ]
                    for v in vs:
                        for sh in shardings:
                            if pp > 1 and sh not in ("ddp", "zero1"):
                                continue
                            if dp == 1 and sh != "ddp":
                                continue
                            for rc in recomputes:
                                out.append(Layout(tp, pp, cp, dp, v, mbs, sh, rc))
    return out


class Screen:
    """The closed-form estimate of one layout, from the simulator's cached costs."""

    def __init__(self, base: Scenario, cluster: Cluster, batch: int | None = None, gpus: int | None = None):
        self.base = base
        self.batch = batch or base.training.global_batch_size
        self.cluster = cluster
        self.framework = get_framework(base.framework)
        # the kernel and collective tables the simulation would use (api.simulate)
        self.kernels, self.measured_comm, _ = table_lookups(
            resolve_table(base.kernels, cluster.gpu.name), cluster
        )
        # every layout uses all ``gpus``: its kernels run at the slowest one's pace (api.simulate)
        self.compute = ComputeModel(
            cluster.gpu,
            base.training.precision,
            self.framework,
            self.kernels,
            gpus or cluster.num_gpus,
            base.cluster.gpu_speed_sd,
        )
        self._blocks: dict[tuple, tuple] = {}
        self._tp_comm: dict[tuple, CollectiveModel] = {}
        self._calls: dict[tuple, tuple[float, float]] = {}
        spec = cluster.spec.node
        gpu = cluster.gpu
        self.nvlink = (spec.nvlink_bandwidth_GBps or gpu.nvlink_bandwidth_GBps) * 1e9
        if spec.intra_node != "nvswitch":
            self.nvlink = (spec.pcie_bandwidth_GBps or gpu.pcie_bandwidth_GBps) * 1e9
        self.nic_per_gpu = spec.nics * spec.nic_bandwidth_gbps / 8 * 1e9 / spec.gpus
        self.gpn = spec.gpus
        self.intra = "nvlink" if spec.intra_node == "nvswitch" else "pcie"
        self.tuning = cluster.spec.nccl.model_dump()
        self.capacity = cluster.gpu.hbm_bytes

    def scenario(self, lay: Layout) -> Scenario:
        data = self.base.model_dump(mode="json", exclude_none=True)
        data["parallelism"] = {
            **{k: v for k, v in data["parallelism"].items() if k in ("rank_order",)},
            **lay.parallelism(),
        }
        data["training"] = {
            **data["training"],
            "global_batch_size": self.batch,
            "micro_batch_size": lay.mbs,
            "activation_recompute": lay.recompute,
        }
        data["name"] = lay.label()
        return load_scenario(data)

    def _block_times(self, lay: Layout):
        """(embedding f+b, layer f, layer b, layer recompute, head f+b) for this layout's shapes, cached."""
        key = (lay.tp, lay.cp, lay.mbs, lay.recompute)
        if key not in self._blocks:
            s = self.scenario(lay)
            w = build_workload(s, self.framework)
            comm = self._tp_comm.get((lay.tp, lay.cp))
            if comm is None:
                one = Cluster(self.cluster.spec, max(1, math.ceil(lay.tp * lay.cp / self.gpn)))
                measured = table_lookups(resolve_table(self.base.kernels, one.gpu.name), one)[1]
                comm = CollectiveModel(one, Placement(lay.tp, lay.cp, 1, 1), "auto", measured)
                self._tp_comm[(lay.tp, lay.cp)] = comm

            def t(ops) -> float:
                return task_cost(
                    ops,
                    self.compute,
                    lambda op: comm.standalone_time_s(op.collective, op.group, op.bytes),
                    self.framework.host,
                    s.training.cuda_graphs,
                )[0]

            rc = (
                w.layer.recompute_full
                if lay.recompute == "full"
                else (w.layer.recompute_selective if lay.recompute == "selective" else ())
            )
            self._blocks[key] = (
                t(w.embedding.forward) + t(w.embedding.backward),
                t(w.layer.forward),
                t(w.layer.backward),
                t(rc) if rc else 0.0,
                t(w.head.forward) + t(w.head.backward),
                w,
                s,
            )
        return self._blocks[key]

    def ring_s(self, op: str, n: int, per_node: int, nbytes: float) -> float:
        """An NCCL ring over ``n`` ranks, ``per_node`` of them in each node, at the links' bandwidth, with the
        simulator's protocol latencies (``costs/nccl.py``)."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        nodes = max(1, n // max(per_node, 1))
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        volume = (2 if op == "all_reduce" else 1) * (n - 1) / n * nbytes
        bw = self.nvlink if nodes == 1 else min(self.nvlink, per_node * self.nic_per_gpu)
        inter = 0 if nodes == 1 else (2 * nodes if op == "all_reduce" else nodes - 1)
        costs = protocol_costs(
            "ring", steps - min(inter, steps), min(inter, steps), self.intra, self.tuning, bw
        )
        p = fastest(costs, volume / bw)
        return p.latency_s + volume / bw / p.bandwidth_factor

    def estimate(self, lay: Layout) -> Estimate:
        emb, f, b, rc, head, w, s = self._block_times(lay)
        m = self.base.model
        gas = self.batch // (lay.mbs * lay.dp)
        layers = m.num_layers // lay.pp
        per_layer = f + b + rc
        first, last = layers * per_layer + emb, layers * per_layer + head
        if lay.pp == 1:
            first = last = layers * per_layer + emb + head
        step = max(first, last)
        compute = gas * (layers * per_layer + (emb + head) / lay.pp)
        bubble = (lay.pp - 1) / lay.v * step if lay.pp > 1 else 0.0
        pipeline = gas * step + bubble
        # data-parallel traffic per GPU: where the dp group's ranks sit (rank order tp-cp-dp-pp)
        w_b, g_b, k_b = state_bytes_per_param(self.base.training.precision, self.base.training.optimizer)
        # parameters of one GPU's (first or last) stage
        if lay.pp == 1:
            psi = w.params_per_rank
        else:
            psi = layers * w.layer.params + max(w.embedding.params, w.head.params)
        inner = lay.tp * lay.cp
        per_node = max(1, min(lay.dp, self.gpn // inner)) if inner < self.gpn else 1
        n = lay.dp * lay.cp if lay.cp > 1 else lay.dp
        grads = psi * g_b
        if lay.sharding == "ddp":
            comm = self.ring_s("all_reduce", n, per_node, grads)
            overlapped = self.framework.ddp.overlap_grad_reduce and lay.pp == 1
            exposed = max(0.0, comm - (b * layers if overlapped else 0.0))
        elif lay.sharding in ("zero1", "zero2"):
            per = (
                self.ring_s("all_reduce", n, per_node, grads)
                if self.framework.zero == "deepspeed"
                else self.ring_s("reduce_scatter", n, per_node, grads)
            )
            gather = self.ring_s("all_gather", n, per_node, psi * w_b)
            exposed = per * (gas if lay.sharding == "zero2" else 1) + gather
        elif lay.sharding == "zero3":
            # DeepSpeed's coordinator, call by call (the simulation's own replay, strategy/zero3_fetch.py): at
            # large data-parallel degree each call pays the ring's latency, n - 1 steps, so the number of calls
            # (one per module and prefetch, re-gathers in backward and recomputation, one per gradient bucket)
            # matters as much as the bytes. Forward's calls hide only under forward's compute; backward's
            # gathers and reduce-scatters, in turn (the host waits for the reduction three buckets back), under
            # backward's and the recomputation's
            fwd, bwd = self._zero3_calls_s(s, w, n, per_node)
            exposed = gas * (max(0.0, fwd - layers * f) + max(0.0, bwd - layers * (b + rc)))
        else:  # fsdp: each unit (layer, embedding, output layer) gathered in forward and again in backward (its
            # recomputation inside), its gradients reduce-scattered: one call each, each paying the ring's latency
            units = ((w.layer.params, layers), (w.embedding.params, 1), (w.head.params, 1))
            ag = sum(k * self.ring_s("all_gather", n, per_node, q * w_b) for q, k in units)
            rs = sum(k * self.ring_s("reduce_scatter", n, per_node, q * g_b) for q, k in units)
            exposed = gas * (max(0.0, ag - layers * f) + max(0.0, max(ag, rs) - layers * (b + rc)))
        opt_states = psi / (lay.dp if lay.sharding != "ddp" else 1)
        optimizer = opt_states * 30 / (self.cluster.gpu.hbm_bytes_per_s * 0.8)
        iteration = pipeline + exposed + optimizer
        memory = self.memory(lay, psi, s)
        return Estimate(
            lay,
            iteration,
            memory / 2**30,
            compute,
            bubble,
            exposed,
            memory <= MEMORY_HEADROOM * self.capacity,
        )

    def _zero3_calls_s(self, s: Scenario, w, n: int, per_node: int) -> tuple[float, float]:
        """(forward, backward) seconds of DeepSpeed ZeRO-3's all-gather and reduce-scatter calls for one
        microbatch, each a ring over the ``n`` data-parallel ranks (cached per call size)."""
        fs = fetch_schedule(s, w)
        w_b, g_b = weight_bytes(s), grad_bytes(s, self.framework)
        key = (id(fs), n, per_node, w_b, g_b)  # schedule_for caches fs for the process: its id names it
        if key not in self._calls:
            sizes = Counter(("all_gather", g.block[1], g.numel * w_b) for g in fs.gathers)
            sizes.update(("reduce_scatter", "backward", r.numel * g_b) for r in fs.reduces)
            self._calls[key] = tuple(
                sum(
                    k * self.ring_s(op, n, per_node, b)
                    for (op, phase, b), k in sizes.items()
                    if phase == want
                )
                for want in ("forward", "backward")
            )
        return self._calls[key]

    def memory(self, lay: Layout, psi: float, s: Scenario) -> float:
        w_b, _, k_b = state_bytes_per_param(self.base.training.precision, self.base.training.optimizer)
        g_b = grad_bytes(s, self.framework)  # as the simulation keeps them (Megatron's fp32 main grads)
        n = lay.dp
        stage = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}[lay.sharding]
        states = (
            w_b * psi / (n if stage >= 3 else 1)
            + g_b * psi / (n if stage >= 2 else 1)
            + k_b * psi / (n if stage >= 1 else 1)
        )
        layers = self.base.model.num_layers // lay.pp
        in_flight = lay.pp if lay.pp > 1 else 1
        act = activation_bytes_per_layer(s) * layers * in_flight + head_activation_bytes(s)
        if lay.recompute == "full":
            act += activation_bytes_per_layer(s, recompute="none")
        return states + act


def plan(
    base: Scenario,
    gpus: int,
    top: int = 10,
    options: dict | None = None,
    progress=None,
    batch: int | None = None,
) -> dict:
    """Screen every layout of ``base``'s model (``batch`` sequences per step, default the base's) and confirm
    the best ``top`` with the simulation. Returns the JSON-ready result."""
    from simulator.api import simulate

    spec = cluster_spec(base)
    gpn = spec.node.gpus
    if gpus % gpn and gpus > gpn:
        raise ScenarioError(f"--gpus ({gpus}) is not a whole number of {gpn}-GPU nodes")
    nodes = max(1, gpus // gpn)
    cluster = Cluster(spec, nodes)
    screen = Screen(base, cluster, batch, gpus)
    layouts = candidates(base, gpus, gpn, options, batch)
    if not layouts:
        raise ScenarioError("plan: no layout divides this model, batch and GPU count")
    t0 = time.perf_counter()
    estimates = []
    invalid = 0
    for lay in layouts:
        try:
            estimates.append(screen.estimate(lay))
        except ScenarioError:
            invalid += 1
    rate = len(layouts) / max(time.perf_counter() - t0, 1e-9)
    fitting = sorted((e for e in estimates if e.fits), key=lambda e: e.iteration_s)
    confirmed: list[Confirmed] = []
    for i, e in enumerate(fitting[:top]):
        if progress:
            progress(i, min(top, len(fitting)))
        s = screen.scenario(e.layout)
        try:
            m = simulate(s, cluster=cluster).metrics
        except ScenarioError as err:
            confirmed.append(
                Confirmed(e.layout, e.iteration_s, None, None, None, None, None, None, "invalid", str(err))
            )
            continue
        confirmed.append(
            Confirmed(
                e.layout,
                e.iteration_s,
                m.iteration_time_s,
                m.mfu,
                m.memory_gib["device"],  # what must fit: peak allocation, CUDA context, NCCL buffers
                m.bubble_fraction,
                m.comm["exposed_s"],
                m.host.get("gpu_busy_s"),
                "oom" if m.oom else "ok",
                "",
                m.breakdown,
            )
        )
    ranked = sorted(
        confirmed,
        key=lambda c: (c.status != "ok", c.iteration_time_s if c.iteration_time_s is not None else math.inf),
    )
    return {
        "screened": len(layouts),
        "screened_per_s": rate,
        "screened_invalid": invalid,
        "fit_in_memory": len(fitting),
        "confirmed": len(confirmed),
        "top": [c.to_dict() for c in ranked],
        "why": why(ranked),
    }


def why(ranked: list[Confirmed]) -> str:
    """One sentence on why the best beats the runner-up, from their simulated parts."""
    ok = [c for c in ranked if c.status == "ok"]
    if len(ok) < 2:
        return "only one layout fits" if ok else "no screened layout fits in memory"
    a, b = ok[0], ok[1]
    parts = [
        ("GPU compute", a.compute_s or 0.0, b.compute_s or 0.0),
        ("exposed communication", a.exposed_comm_s or 0.0, b.exposed_comm_s or 0.0),
        (
            "pipeline bubble",
            (a.bubble_fraction or 0.0) * a.iteration_time_s,
            (b.bubble_fraction or 0.0) * b.iteration_time_s,
        ),
    ]
    name, x, y = max(parts, key=lambda p: p[2] - p[1])
    gain = b.iteration_time_s - a.iteration_time_s
    return (
        f"{a.layout.label()} beats {b.layout.label()} by {gain:.3f} s ({100 * gain / b.iteration_time_s:.1f}%), "
        f"mostly in {name}: {x:.3f} s against {y:.3f} s"
    )
