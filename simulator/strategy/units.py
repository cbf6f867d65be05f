"""The model as a strategy sees it: units (embedding, transformer layers, output head) in forward order, each
with its work and the parameters its gradients cover."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.scenario.schema import Scenario
from simulator.workload.block import Block
from simulator.workload.params import tensors_per_layer
from simulator.workload.recompute import chunk_policies
from simulator.workload.transformer import Workload


@dataclass(frozen=True)
class Unit:
    """A block as the strategy sees it: a name, its work, and the parameters its gradients cover."""

    index: int
    name: str
    block: Block
    params: int  # reduced over data parallelism
    is_layer: bool
    expert_params: int = 0  # routed experts, reduced over expert data parallelism
    recompute: str = "none"  # what activation recompute does to it (workload/recompute.py policies)


def units(w: Workload) -> list[Unit]:
    """Embedding, transformer layers, output head, in forward order. With tied embeddings the output layer's
    weight is the embedding's, so the head unit only owns the final norm."""
    m, t = w.scenario.model, w.scenario.parallelism.tensor_parallel
    head_params = w.head.params - (m.vocab_size * m.hidden_size // t if m.tied_embeddings else 0)
    policy = chunk_policies(w.scenario, len(w.layers) + len(w.mtp))  # the whole model as one chunk
    out = [Unit(0, "embedding", w.embedding, w.embedding.params, False)]
    out += [
        Unit(i + 1, f"layer {i}", b, b.params, True, b.expert_params, policy[i])
        for i, b in enumerate(w.layers)
    ]
    n = len(out)
    out += [
        Unit(n + i, f"mtp {i}", b, b.params, True, b.expert_params, policy[n - 1 + i])
        for i, b in enumerate(w.mtp)
    ]
    out.append(Unit(len(out), "head", w.head, head_params, False))
    return out


def gather_params(w: Workload, u: Unit) -> int:
    """Parameters a sharded strategy must gather before the unit runs: its own, except that the output head
    computes logits with the full output weight even when that weight is tied to the embedding."""
    return w.head.params if u.name == "head" else u.params


def parameter_tensors(s: Scenario, layers: int, embedding: bool, head: bool) -> int:
    """Parameter tensors of ``layers`` layers (plus the embedding and output head where held): what an
    optimizer step loops over in Python (Megatron's fp16 optimizer copies and clips per tensor)."""
    m = s.model
    norm = 2 if m.normalization == "layernorm" else 1
    n = layers * tensors_per_layer(m)
    if embedding:
        n += 1 + (m.position_embedding == "learned")
    if head:
        n += norm + (0 if m.tied_embeddings else 1)
    return n


def unit_tensors(s: Scenario, us: list[Unit]) -> int:
    """Parameter tensors of a set of units (a pipeline stage's), for the optimizer's per-tensor host work."""
    names = {u.name for u in us}
    return parameter_tensors(s, sum(u.is_layer for u in us), "embedding" in names, "head" in names)
