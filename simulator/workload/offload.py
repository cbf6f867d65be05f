"""Activation offloading to host memory as Megatron-Core runs it (``--cpu-offloading
--cpu-offloading-num-layers N``; Transformer Engine transformer_engine/pytorch/cpu_offload.py,
``get_cpu_offload_context`` with its double-buffered handler, v1.x): the activations a layer saves for backward
are copied to pinned host buffers on a side stream while the next layer computes, and copied back on the side
stream while the backward of the layer after it (in backward order) runs, so at most two offloaded layers' worth
are on the GPU at once. Only the first N layers are offloaded (the last ones' backward comes too soon to reload).

As ops: each offloaded layer's forward starts with the previous offloaded layer's copy to the host and its
backward with the next reload, both ``behind`` that layer's kernels (costs/dispatch.py): only a copy longer than
a layer's compute adds time (PCIe, shared by a node's GPUs, costs/host.py).
"""

from __future__ import annotations

from dataclasses import replace

from simulator.scenario.schema import Scenario
from simulator.workload.block import Block
from simulator.workload.memory import activation_bytes_per_layer
from simulator.workload.ops import collective_op
from simulator.workload.recompute import chunk_policies

BUFFERS = 2  # layers of offloaded activations on the GPU at once (the double buffer)


def offloaded(block: Block, nbytes: float) -> Block:
    """``block`` with its activations (``nbytes`` per micro-batch) going to the host and back."""
    out = replace(
        collective_op("activation offload to host", "d2h_pinned", "host", nbytes), overlaps="behind"
    )
    back = replace(
        collective_op("activation reload from host", "h2d_pinned", "host", nbytes),
        overlaps="behind",
        direction="backward",
    )
    return replace(block, forward=(out, *block.forward), backward=(back, *block.backward), offloaded=True)


def offloaded_layers(s: Scenario, layers: tuple[Block, ...], n: int) -> tuple[Block, ...]:
    """The first ``n`` layers with their activations (as their recompute policy keeps them) offloaded."""
    policies = chunk_policies(s, len(layers))
    done: dict[tuple, Block] = {}
    out = []
    for i, b in enumerate(layers):
        if i >= n:
            out.append(b)
            continue
        key = (id(b), policies[i])
        if key not in done:
            nbytes = activation_bytes_per_layer(s, recompute=policies[i], moe=b.moe, kind=b.kind)
            done[key] = offloaded(b, nbytes)
        out.append(done[key])
    return tuple(out)
