"""The planner's closed-form estimate of one layout (:class:`Screen`): each layer's times from the engine's
kernel and collective costs (``build_workload`` + ``task_cost``, cached per shape), the pipeline as (m + (p - 1)/v)
steps of its slowest stage, data-parallel reductions as NCCL rings at the links' bandwidth exposed where the
framework does not overlap them, FSDP's per-unit and ZeRO-3's per-module calls hidden under their pass's compute
up to what their count and size cost, memory from the same formulas. It ranks; the simulation of the best k decides."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

from simulator.costs.collectives import CollectiveModel
from simulator.costs.compute import ComputeModel
from simulator.costs.contention import sm_slowdown
from simulator.costs.dispatch import task_cost
from simulator.costs.host import HOST_GROUPS
from simulator.costs.nccl import tuning_of
from simulator.costs.tables import table_lookups
from simulator.engine.engine import TaskCost
from simulator.frameworks import get_framework
from simulator.hardware.cluster import Cluster
from simulator.scenario.loader import load_scenario
from simulator.scenario.schema import Scenario
from simulator.strategy.reduction import bucket_copy, ddp_settings
from simulator.strategy.sharded import FSDP_COPY_OUT_PER_BYTE
from simulator.strategy.state_bytes import fsdp_reduce_bytes, grad_bytes, weight_bytes
from simulator.strategy.steps import optimizer_step_bytes
from simulator.strategy.zero import fetch_key
from simulator.strategy.zero3_fetch import call_sizes
from simulator.study.layout import Estimate, Layout, carried, collective_span, pipeline_bubble, schedule_of
from simulator.study.offload import OffloadScreen
from simulator.study.screen_comm import ScreenComm
from simulator.study.screen_memory import ScreenMemory
from simulator.study.step_overhead import step_overhead_s
from simulator.tables.select import resolve_tables
from simulator.workload.fp8 import fp8_plan
from simulator.workload.memory import state_bytes_per_param
from simulator.workload.transformer import build_workload

MEMORY_HEADROOM = 0.9  # screen out what needs more than 90% of the GPU (allocator, context, NCCL buffers)


class Screen(ScreenComm, ScreenMemory):
    """The closed-form estimate of one layout, from the simulator's cached costs."""

    def __init__(self, base: Scenario, cluster: Cluster, batch: int | None = None, gpus: int | None = None):
        self.base = base
        self.batch = batch or base.training.global_batch_size
        self.cluster = cluster
        self.framework = get_framework(base.framework)
        tr = base.training
        self._state_bytes = state_bytes_per_param(tr.precision, tr.optimizer, tr.optimizer_moments)
        channels = base.memory.nccl_channels if base.cluster.nccl_sm_contention else 0
        self.contention = sm_slowdown(cluster.gpu.sm_count, channels)
        # the kernel and collective tables the simulation would use (api.simulate)
        self.kernels, self.measured_comm, _ = table_lookups(
            resolve_tables(base.kernels, cluster.gpu.lineage, base.kernels_only), cluster
        )
        # every layout uses all ``gpus``: its kernels run at the slowest one's pace (api.simulate)
        self.compute = ComputeModel(
            cluster.gpu,
            base.training.dtype,
            self.framework,
            self.kernels,
            gpus or cluster.num_gpus,
            base.cluster.gpu_speed_sd,
            plan.gemm_scale if (plan := fp8_plan(base, cluster.gpu)) else 1.0,
        )
        self._blocks: dict[tuple, tuple] = {}
        self._overheads: dict[tuple, float] = {}
        # costs of one workload, shared by the recompute policies it serves
        self._shapes: dict[tuple, tuple] = {}
        self._tp_comm: dict[tuple, CollectiveModel] = {}
        self._clusters, self._workloads = {}, {}  # (cluster, measured) per node count; workloads per shape
        self._calls, self._rings = {}, {}  # ZeRO-3's calls and rings, (seconds, seconds moving bytes)
        self._layer_params, self._act = {}, {}  # parameters per workload; activation bytes per shape
        self._scenarios, self._param_workloads = {}, {}  # per shape; per TP / CP / EP / ETP (``_shape``)
        # per layout but its data-parallel overlaps (``_footprint``); host copies' costs per node-wide placement
        self._footprints, self._hosts = {}, {}
        self.prune = False  # plan's screen: a layout that cannot fit is not timed (``estimate``)
        self.offload = OffloadScreen(cluster.spec)
        spec, gpu = cluster.spec.node, cluster.gpu
        self.nvlink = (spec.nvlink_bandwidth_GBps or gpu.nvlink_bandwidth_GBps) * 1e9
        if spec.intra_node != "nvswitch":
            self.nvlink = (spec.pcie_bandwidth_GBps or gpu.pcie_bandwidth_GBps) * 1e9
        self.nic_per_gpu = spec.nics * spec.nic_bandwidth_gbps / 8 * 1e9 / spec.gpus
        self.gpn = spec.gpus
        self.intra = "nvlink" if spec.intra_node == "nvswitch" else "pcie"
        self.tuning = tuning_of(cluster)
        self.architecture = gpu.architecture
        self.capacity = cluster.gpu.hbm_bytes
        self.nearest_nic = cluster.nearest_nic  # node 0's routes, found with the tables (not timed)

    def scenario(self, lay: Layout) -> Scenario:
        """``lay`` as a runnable scenario: the base's model, cluster and training, with the layout's degrees and
        the base's switches that hold for any layout (``carried``)."""
        data = self.base.model_dump(mode="json", exclude_none=True)
        par = carried(data["parallelism"], lay)
        for k, v in lay.parallelism().items():  # the layout's FSDP section over the base's FSDP switches
            par[k] = {**par[k], **v} if isinstance(v, dict) and isinstance(par.get(k), dict) else v
        if lay.tp_overlap and not self.framework.name.startswith("megatron"):
            # a searched TP overlap off Megatron: PyTorch's async TP (torchtitan)
            par["tp_comm_overlap"] = "async"
        data["parallelism"] = par
        if self.base.model.moe is not None:  # Megatron-Core's MoE needs sequence parallelism with TP
            data["parallelism"].update(
                expert_parallel=lay.ep, expert_tensor_parallel=lay.etp, sequence_parallel=lay.tp > 1
            )
        data["training"] = {
            **data["training"],
            "global_batch_size": self.batch,
            "micro_batch_size": lay.mbs,
            "activation_recompute": lay.recompute,
        }
        if lay.act_offload is not None:
            data["training"]["activation_offload_layers"] = lay.act_offload
        if lay.recompute != "selective":  # Megatron's recompute modules belong to selective recompute only
            data["training"].get("recompute", {}).pop("modules", None)
        data["name"] = lay.label()
        return load_scenario(data)

    def _block_times(self, lay: Layout):
        """(embedding f+b, layer f, layer b, layer recompute, head f+b, workload, scenario, ops pricer) for this
        layout's shapes, cached; the layer times are the mean over the model's layers (dense and mixture-of-experts
        ones). A layer's forward and backward ops do not depend on the recompute policy (workload/transformer.py:
        only what is re-run before backward does), so none and full recompute share one workload and its costs;
        selective (its module list) and activation offloading (copy sizes by policy) get their own."""
        switched = (lay.sp, lay.tp_overlap, lay.act_offload)  # searched switches that change a layer's ops
        key = (lay.shape_key(), collective_span(lay, self.gpn))
        if key not in self._blocks:
            s = self._shape(lay)[0]
            shared = lay.recompute != "selective" and not s.training.activation_offload_layers
            wkey = (lay.tp, lay.cp, lay.mbs, "shared" if shared else lay.recompute, lay.ep, lay.etp, switched)
            if wkey not in self._workloads:  # the same whatever nodes its collectives are costed on
                self._workloads[wkey] = build_workload(s, self.framework, self.gpn, self.cluster.gpu)
            if (wkey, key[-1]) not in self._shapes:
                w, comm = self._workloads[wkey], self._comm(lay)
                host = self._host(lay, s)

                def cost(ops) -> TaskCost:
                    return task_cost(
                        ops,
                        self.compute,
                        # host copies (activation offloading) on the host's links, as the simulation costs them
                        lambda op: (host if op.group in HOST_GROUPS else comm).standalone_time_s(
                            op.collective, op.group, op.bytes
                        ),
                        self.framework.host,
                        s.training.graph_capture,
                    )

                def t(ops) -> float:
                    return cost(ops).seconds

                f = b = 0.0
                shares = [(block, sum(x is block for x in w.layers) / w.num_layers) for block in w.kinds]
                for block, share in shares:
                    f += share * t(block.forward)
                    b += share * t(block.backward)
                rc = {
                    policy: sum(
                        share * t(ops) for block, share in shares if (ops := block.recompute_ops(policy))
                    )
                    for policy in ("none", "full", "selective")
                    if policy == lay.recompute or (shared and policy != "selective")
                }
                emb = t(w.embedding.forward) + t(w.embedding.backward)
                # the output layer with DeepSeek-V3's multi-token prediction depths after it, on the last stage
                head = sum(t(x.forward) + t(x.backward) for x in (w.head, *w.mtp))
                self._shapes[wkey, key[-1]] = (emb, f, b, rc, head, w, cost)
            emb, f, b, rc, head, w, cost = self._shapes[wkey, key[-1]]
            self._blocks[key] = (emb, f, b, rc[lay.recompute], head, w, s, cost)
        return self._blocks[key]

    def _mean_layer(self, w) -> float:
        """Parameters of the model's mean layer (dense and mixture-of-experts layers averaged), per workload."""
        key = id(w)  # the workload lives in ``_blocks`` for the screen's life: its id names it
        if key not in self._layer_params:
            self._layer_params[key] = sum(x.params for x in w.layers) / w.num_layers
        return self._layer_params[key]

    def _shape(self, lay: Layout) -> tuple[Scenario, object]:
        """(scenario, workload) of ``lay``'s shape, no kernel costed: what its memory needs. The scenario is the
        shape's (TP, CP, micro-batch, recompute, EP, ETP and the TP switches) with the base's data-parallel
        overlaps (a layout's own are applied where the estimate uses them); the workload one of its TP / CP / EP /
        ETP, whatever the micro-batch, for the parameters a rank holds."""
        key = lay.shape_key()
        got = self._scenarios.get(key)
        if got is None:
            s = self.scenario(replace(lay, grad_overlap=None, param_overlap=None))
            pkey = (lay.tp, lay.cp, lay.ep, lay.etp)
            if pkey not in self._param_workloads:
                self._param_workloads[pkey] = build_workload(s, self.framework, self.gpn, self.cluster.gpu)
            got = self._scenarios[key] = (s, self._param_workloads[pkey])
        return got

    def estimate(self, lay: Layout, bound: bool = False) -> Estimate:
        """The layout's iteration time, memory and their parts; ``bound``: for ZeRO-3, a lower bound without
        replaying DeepSpeed's coordinator (every call hidden), which ``plan`` refines where it can matter. With
        ``prune`` (plan's screen) a layout that cannot fit is not timed: its memory first, its time infinite."""
        gas = self.batch // (lay.mbs * lay.dp)
        # DualPipe: each stage twice, each copy half the batch
        copies = 2 if lay.schedule == "dualpipe" else 1
        s, w, layers, psi, experts, edp, memory = self._footprint(lay, copies)
        w_b, g_b, k_b = self._state_bytes
        grads = psi * g_b
        # the layout's searched switches, else the scenario's, else the framework's, as simulated
        overlap_reduce = ddp_settings(s, w)[0] if lay.grad_overlap is None else lay.grad_overlap
        overlap_gather = (
            s.parallelism.ddp.overlap_param_gather if lay.param_overlap is None else lay.param_overlap
        )
        # DDP's bucket copy
        if lay.sharding == "ddp" and lay.pp == 1 and lay.dp > 1 and bucket_copy(s, w, overlap_reduce):
            memory += grads
        fits = memory <= MEMORY_HEADROOM * self.capacity
        if self.prune and not fits:
            return Estimate(lay, math.inf, memory / 2**30, 0.0, 0.0, 0.0, False)
        emb, f, b, rc, head, w, s, cost = self._block_times(lay)
        per_layer = f + b + rc
        # each micro-batch's setup, pipeline re-gathers and blocking sends (step_overhead.py)
        link = self.nic_per_gpu if lay.tp * lay.cp * lay.dp >= self.gpn else self.nvlink
        okey = (lay.shape_key(), min(lay.pp, 2), lay.v, link)
        if okey not in self._overheads:
            self._overheads[okey] = step_overhead_s(
                s, w, cost, lay.pp, lay.v, link, schedule_of(self.base, lay)
            )
        step = lay.slowest_stage_s(self.base.model.num_layers, per_layer, emb, head) + self._overheads[okey]
        compute = gas * (layers * per_layer + (emb + head) / lay.pp) / copies
        bubble = pipeline_bubble(lay, step)
        pipeline = gas * step / copies + bubble
        # data-parallel traffic per GPU: where the dp group's ranks sit (rank order tp-cp-dp-pp)
        per_node_e = max(1, min(edp, self.gpn // (lay.ep * lay.etp))) if lay.ep * lay.etp < self.gpn else 1
        inner = lay.tp * lay.cp
        per_node = max(1, min(lay.dp, self.gpn // inner)) if inner < self.gpn else 1
        n = lay.dp * lay.cp if lay.cp > 1 else lay.dp
        hbm = self.cluster.gpu.hbm_bytes_per_s * 0.8  # memory-bound work's rate (copies, the optimizer step)
        beside = 0.0  # data-parallel communication hidden beside compute
        if lay.sharding == "ddp":
            comm = self.ring_s("all_reduce", n, per_node, grads)
            comm += self.ring_s("all_reduce", edp, per_node_e, experts * g_b) if experts else 0.0
            # with overlap_grad_reduce the buckets (a pipeline's chunks: pipeline/flush.py) hide under a backward
            exposed = max(0.0, comm - (layers * (b + rc) if overlap_reduce else 0.0))
            beside = comm - exposed
        elif lay.kind in ("zero1", "zero2"):
            reduce = "all_reduce" if self.framework.zero == "deepspeed" else "reduce_scatter"
            per = self.ring_s(reduce, n, per_node, grads)
            gather = self.ring_s("all_gather", n, per_node, psi * w_b)
            if experts:
                per += self.ring_s(reduce, edp, per_node_e, experts * g_b)
                gather += self.ring_s("all_gather", edp, per_node_e, experts * w_b)
            if lay.sharding == "zero1" and (self.framework.zero == "megatron" or lay.pp > 1):
                # the distributed optimizer's buckets, or a Megatron pipeline's chunks, reduced as the last
                # micro-batch's backward frees them (overlap_grad_reduce), the weights gathered under the next
                # forward (overlap_param_gather, Megatron-Core's): what is longer than that pass stays exposed
                whole = per + gather
                per = max(0.0, per - layers * (b + rc)) if overlap_reduce else per
                gather = max(0.0, gather - layers * f) if overlap_gather else gather
                beside = whole - per - gather
            exposed = per * (gas if lay.kind == "zero2" else 1) + gather
        elif lay.kind == "zero3":
            # DeepSpeed's calls (zero3_fetch.py), each paying the ring's latency: forward's hide under forward, the
            # rest under backward and recomputation (a layout that cannot fit is not replayed: the costliest step)
            if memory > MEMORY_HEADROOM * self.capacity:
                fwd = bwd = held = math.inf
            elif bound:
                fwd = bwd = held = 0.0
            else:
                fwd, bwd, held = self._zero3_calls_s(s, w, n, per_node)
            exposed = gas * (max(0.0, fwd - layers * f) + max(0.0, bwd - layers * (b + rc)))
            beside = gas * (fwd + bwd) - exposed if math.isfinite(exposed) else 0.0  # not replayed: no fit
        else:  # fsdp: each unit gathered in forward and again in backward, its gradients reduce-scattered, one
            # call each; HSDP (strategy/fsdp.py): inside a shard group, then each unit's shard all-reduced across
            # the replicas, every microbatch
            if lay.sharding == "hsdp":
                n, per_node = lay.shard, min(lay.shard, max(1, self.gpn // inner))
            # backward's gathers and reductions run on two streams at once: latencies overlap, bytes share links
            units = ((w.layer.params, layers), (w.embedding.params, 1), (w.head.params, 1))
            counts = [k for _, k in units]

            def calls(op: str, ranks: int, on_node: int, scale: float) -> tuple[float, float]:
                """(whole seconds, seconds moving bytes) of one such call per unit, each unit's count times."""
                parts = [self.ring_parts(op, ranks, on_node, q * scale) for q, _ in units]
                return (
                    sum(k * (lat + t) for k, (lat, t) in zip(counts, parts, strict=True)),
                    sum(k * t for k, (_, t) in zip(counts, parts, strict=True)),
                )

            ag, ag_moving = calls("all_gather", n, per_node, w_b)
            rs_b = fsdp_reduce_bytes(s, self.framework)  # torchtitan reduces in fp32
            rs, rs_moving = calls("reduce_scatter", n, per_node, rs_b)
            across = across_moving = 0.0
            if lay.sharding == "hsdp":  # n, per_node: the shard group's; one rank per node across replicas
                across, across_moving = calls("all_reduce", lay.dp // lay.shard, 1, rs_b / lay.shard)
            network = n > per_node  # the group's rings cross the NICs
            on_network = (ag_moving + rs_moving if network else 0.0) + across_moving
            on_node = 0.0 if network else ag_moving + rs_moving
            backward = max(ag, rs + across, on_network, on_node)
            exposed = gas * (max(0.0, ag - layers * f) + max(0.0, backward - layers * (b + rc)))
            beside = gas * (ag + backward) - exposed
            if self.framework.fsdp_copies:  # FSDP2's copy-outs, forward and backward, at the step's HBM rate
                copies = gas * sum(2 * FSDP_COPY_OUT_PER_BYTE * q * k * w_b for q, k in units) / hbm
                compute, pipeline = compute + copies, pipeline + copies
        sharded = lay.sharding != "ddp"
        opt_states = psi / (lay.state_shards if sharded else 1) + experts / (edp if sharded else 1)
        optimizer = opt_states * optimizer_step_bytes(self.base, self.framework) / hbm
        if lay.offload:  # ZeRO-Offload: gradients to the host in backward, the step on the CPU, weights back
            # ZeRO-3's blocking copy of each reduced partition holds the host at the boundary: its reductions
            held = held if lay.kind == "zero3" else None
            optimizer = self.offload.exposed_s(s, psi / lay.dp, gas, layers * (b + rc), held)
        # the compute beside that communication runs on the SMs NCCL leaves it (costs/contention.py)
        iteration = pipeline + exposed + optimizer + beside * (self.contention - 1.0)
        zero3_bound = bound and lay.kind == "zero3"
        return Estimate(lay, iteration, memory / 2**30, compute, bubble, exposed, fits, zero3_bound)

    def _zero3_calls_s(self, s: Scenario, w, n: int, per_node: int) -> tuple[float, float, float]:
        """(forward, backward, backward's reduce-scatters alone) seconds of DeepSpeed ZeRO-3's calls for one
        microbatch, rings over the ``n`` ranks, counted on a replay of a few layers (zero3_fetch.call_sizes);
        backward's gathers and reduce-scatters one after another on the group's one NCCL queue
        (strategy/zero3_replay.py DP_NCCL_STREAM)."""
        key, knobs = fetch_key(s, w)
        w_b, g_b = weight_bytes(s), grad_bytes(s, self.framework)
        memo = (key, knobs, n, per_node, w_b, g_b)
        if memo not in self._calls:
            whole, moving = Counter(), Counter()
            for (op, phase, numel), k in call_sizes(key, knobs).items():
                lat, t = self.ring_parts(op, n, per_node, numel * (w_b if op == "all_gather" else g_b))
                whole[op, phase] += k * (lat + t)
                moving[phase] += k * t
            rs = whole["reduce_scatter", "backward"]
            self._calls[memo] = (whole["all_gather", "forward"], whole["all_gather", "backward"] + rs, rs)
        return self._calls[memo]
