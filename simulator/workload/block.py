"""A block of the model (a transformer layer, the embedding, the output head) as kernels for one micro-batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from simulator.workload.ops import Op


@dataclass(frozen=True)
class Block:
    """Work of one block (a transformer layer, the embedding, or the output head) for one microbatch."""

    name: str
    forward: tuple[Op, ...]
    backward: tuple[Op, ...]
    recompute_selective: tuple[Op, ...]  # forward ops re-run by selective recompute (its modules)
    params: (
        int  # parameters held by one rank and reduced over data parallelism (for MoE: all but the experts)
    )
    recompute_full: tuple[Op, ...] = ()  # full recompute: fetch the checkpoint, then the forward again
    expert_params: int = 0  # routed experts' parameters on one rank, reduced over expert data parallelism
    moe: bool = False  # a mixture-of-experts layer
    recompute_op: tuple[Op, ...] = ()  # torchtitan's per-op policy: the forward ops it re-runs (recompute.py)
    offloaded: bool = False  # its activations go to host memory (workload/offload.py)
    # "layer" (attention then an MLP or MoE MLP), or a hybrid stack's layer of its own (model.hybrid_pattern):
    # "mamba", "attention", "mlp", "moe"
    kind: str = "layer"

    def recompute_ops(self, policy: str) -> tuple[Op, ...]:
        """What a recompute ``policy`` (workload/recompute.py) re-runs of this block before its backward."""
        if policy == "full":
            return self.recompute_full or self.forward
        if policy == "selective":
            return self.recompute_selective
        if policy == "op":
            return self.recompute_op
        return ()

    def map_ops(self, f: Callable[[tuple[Op, ...]], tuple[Op, ...]]) -> Block:
        """This block with ``f`` applied to each of its op lists: forward, backward and what each recompute policy
        re-runs (FP8 quantization, async TP's chunking)."""
        return replace(
            self,
            forward=f(self.forward),
            backward=f(self.backward),
            recompute_selective=f(self.recompute_selective),
            recompute_full=f(self.recompute_full),
            recompute_op=f(self.recompute_op),
        )

    @property
    def forward_model_flops(self) -> float:
        return sum(op.model_flops for op in self.forward)


@dataclass(frozen=True)
class Part:
    """A piece of a block (attention, an MLP): its ops and the parameters it holds on one rank."""

    forward: tuple[Op, ...]
    backward: tuple[Op, ...]
    params: int = 0  # reduced over data parallelism
    expert_params: int = 0  # reduced over expert data parallelism
    activations: tuple[Op, ...] = ()  # an MoE MLP's expert activation kernels (Megatron's moe_act recompute)
    shared: tuple[Op, ...] = ()  # an MoE MLP's shared-expert forward (Megatron's shared_experts recompute)


def present(*ops: Op | None) -> tuple[Op, ...]:
    """The ops that exist in this configuration (a collective or framework kernel may be None)."""
    return tuple(op for op in ops if op is not None)
