"""The planner screen's memory of one layout (:class:`ScreenMemory`, which :class:`~simulator.study.screen.Screen`
extends): model states by sharding, the activations the first pipeline stage holds, the runtime's own, as the
simulation counts them (strategy/memory.py)."""

from __future__ import annotations

from simulator.scenario.schema import Scenario
from simulator.strategy.runtime_memory import layout_runtime_bytes
from simulator.strategy.state_bytes import grad_bytes
from simulator.strategy.zero import screen_buffer_bytes
from simulator.study.layout import Layout
from simulator.workload.cuda_graphs import mean_static_input_bytes
from simulator.workload.loss import head_activation_bytes
from simulator.workload.memory import activation_bytes_per_layer
from simulator.workload.offload import BUFFERS


class ScreenMemory:
    """Bytes a layout needs per GPU; the screen sets ``base``, ``framework``, ``_state_bytes``, ``_act`` and
    ``_footprints`` and gives ``_shape`` and ``_mean_layer``."""

    def _footprint(self, lay: Layout, copies: int) -> tuple:
        """(scenario, workload, layers on the fullest stage, its parameters, its routed experts' parameters,
        expert data-parallel ranks, bytes per GPU but DDP's bucket copy) of ``lay``, cached for the layouts that
        differ only in their data-parallel overlaps (plan's searched switches)."""
        key = (
            lay.shape_key(),
            lay.pp,
            lay.dp,
            lay.v,
            lay.sharding,
            lay.shard,
            lay.first,
            lay.last,
            lay.schedule,
        )
        got = self._footprints.get(key)
        if got is not None:
            return got
        s, w = self._shape(lay)
        layers = max(lay.stage_layers(self.base.model.num_layers))
        # parameters of one GPU's (first or last) stage (DeepSeek's schedules: the first rank holds both ends)
        ends = w.embedding.params + w.head.params if lay.schedule else max(w.embedding.params, w.head.params)
        psi = w.params_per_rank if lay.pp == 1 else layers * self._mean_layer(w) + ends
        # a mixture-of-experts model's routed experts: reduced over expert data parallelism, states sharded there
        experts = w.expert_params_per_rank / lay.pp * copies
        edp = lay.tp * lay.cp * lay.dp // (lay.ep * lay.etp)
        memory = self.memory(lay, psi, s, experts, edp)
        memory += screen_buffer_bytes(
            s, self.framework, lay.kind, lay.pp, psi + experts
        )  # DeepSpeed's buckets
        # TE's FP8 weight copies unless FSDP / ZeRO-3 gathers them (``s``: this shape's first layout, not its sharding)
        if w.fp8 is not None and lay.stage < 3:
            memory += w.fp8.weight_copy_bytes * sum(w.fp8_params_per_rank) * layers / w.num_layers
        got = self._footprints[key] = (s, w, layers, psi, experts, edp, memory)
        return got

    def memory(self, lay: Layout, psi: float, s: Scenario, experts: float = 0.0, edp: int = 1) -> float:
        w_b, _, k_b = self._state_bytes
        g_b = grad_bytes(s, self.framework)  # as the simulation keeps them (Megatron's fp32 main grads)
        stage = lay.stage
        states = 0.0
        for params, n in ((psi, lay.state_shards), (experts, edp)):
            states += w_b * params / (n if stage >= 3 else 1)
            # offloaded: the optimizer states and the gradient partition in host memory (strategy/offload.py)
            if not lay.offload:
                states += g_b * params / (n if stage >= 2 else 1) + k_b * params / (n if stage >= 1 else 1)
        layers = max(lay.stage_layers(self.base.model.num_layers))
        # micro-batches' activations the first stage holds: PP (1F1B), or interleaved 1F1B's warm-up of 2(PP - 1) +
        # (v - 1) PP chunks and one more, each 1/v of the stage (Megatron-LM schedules.py); DualPipeV's PP + 1 halves
        in_flight = (2 * (lay.pp - 1) + (lay.v - 1) * lay.pp + 1) / lay.v if lay.v > 1 else max(lay.pp, 1)
        in_flight = {"dualpipev": lay.pp + 0.5, "dualpipe": (lay.pp + 1) / 2}.get(lay.schedule, in_flight)
        per_layer, head, whole = self._activations(lay, s)
        # the loss's working set and a recomputation's are never live together (strategy/memory.py)
        # offloaded layers (no pipeline): at most BUFFERS of them on the GPU at once (strategy/memory.py)
        away = s.training.activation_offload_layers
        held = layers - away + min(BUFFERS, away)
        act = per_layer * held * in_flight + max(head, whole if lay.recompute == "full" else 0.0)
        # what must fit, as the simulation counts it: with the allocator's stated reserve, the context, NCCL
        runtime = layout_runtime_bytes(s, self.framework, (lay.tp, lay.cp, lay.dp, lay.ep, lay.etp), lay.pp)
        return (states + act) * (1 + s.memory.allocator_fragmentation) + runtime

    def _activations(self, lay: Layout, s: Scenario) -> tuple[float, float, float]:
        """(bytes kept per layer, the output layer's, one layer's whole activations for its recomputation) of
        ``lay``'s scenario ``s``, per shape (``Layout.shape_key``)."""
        key = lay.shape_key()
        if key not in self._act:
            m = self.base.model
            moe_share = m.moe_layers / m.num_layers if m.moe is not None else 0.0
            per_layer = (1 - moe_share) * activation_bytes_per_layer(s) + (
                moe_share * activation_bytes_per_layer(s, moe=True) if moe_share else 0.0
            )
            whole = activation_bytes_per_layer(s, recompute="none")
            if m.hybrid_pattern:  # each kind of layer by its share of the stack
                kinds = {k: m.layers_of(k) for k in set(map(m.layer_kind, range(m.num_layers)))}
                per_layer = sum(
                    n * activation_bytes_per_layer(s, moe=k == "moe", kind=k) for k, n in kinds.items()
                )
                per_layer /= m.num_layers
                whole = max(activation_bytes_per_layer(s, "none", k == "moe", k) for k in kinds)
            per_layer += mean_static_input_bytes(s)  # CUDA graphs' inputs, a set per layer in flight
            self._act[key] = (per_layer, head_activation_bytes(s), whole)
        return self._act[key]
