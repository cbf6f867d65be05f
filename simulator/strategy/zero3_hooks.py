"""Where DeepSpeed ZeRO-3's module hooks act inside a unit's kernels: their host time before each module's GEMMs,
and the point in a unit's backward where a module's gradients are ready, which its gradient hooks flush to the
reduce-scatter (deepspeed/runtime/zero/stage3.py ``reduce_partition_and_remove_grads``: a hook on each
parameter's AccumulateGrad, which runs as soon as autograd has issued that module's weight gradient)."""

from __future__ import annotations

from simulator.workload.ops import host_op

# The op (workload/block.py and attention.py names) each module's backward ends with, by the module names of
# strategy/zero3_fetch.py model_modules (Megatron's fused modules and Hugging Face's)
MODULE_OPS = {
    "query_key_value": "qkv projection",
    "q_proj": "qkv projection",
    "k_proj": "qkv projection",
    "v_proj": "qkv projection",
    "dense": "attention output projection",
    "o_proj": "attention output projection",
    "dense_h_to_4h": "mlp up projection",
    "gate_proj": "mlp up projection",
    "up_proj": "mlp up projection",
    "fc1": "mlp up projection",
    "dense_4h_to_h": "mlp down projection",
    "down_proj": "mlp down projection",
    "fc2": "mlp down projection",
    "input_layernorm": "input layernorm",
    "post_attention_layernorm": "post-attention layernorm",
}


def module_ends(ops: tuple, modules: list[str]) -> list[int]:
    """For each module, the position in a unit's backward ``ops`` just after its last op (where its gradients
    are ready); the end of ``ops`` for a module with no op of its own (the embedding, the output layer, a
    mixture-of-experts layer's experts)."""
    out = []
    for m in modules:
        name = MODULE_OPS.get(m)
        ends = [i + 1 for i, op in enumerate(ops) if name and name in op.name]
        out.append(max(ends) if ends else len(ops))
    return out


class ModuleHooks:
    """A unit's ops with its modules' hook time (per module invocation, the profile's ``zero3_module_*_s``)
    spread before its GEMMs: a module's hooks run just before its kernels, so the GPU works on the previous
    module's kernels meanwhile. Cached per block (unit, phase)."""

    def __init__(self, modules, host):
        self.seconds: dict[tuple, float] = {}
        for m in modules:
            cost = host.zero3_module_forward_s if m.forward else host.zero3_module_backward_s
            self.seconds[m.block] = self.seconds.get(m.block, 0.0) + cost
        self.cache: dict[tuple, tuple] = {}

    def __call__(self, block, ops: tuple) -> tuple:
        seconds = self.seconds.get(block, 0.0)
        if not seconds:
            return ops
        if block not in self.cache:
            gemms = sum(op.kind == "gemm" for op in ops)
            piece = host_op("DeepSpeed ZeRO-3 module hooks", seconds / max(gemms, 1), block[1])
            if gemms:
                self.cache[block] = tuple(
                    x for op in ops for x in ((piece, op) if op.kind == "gemm" else (op,))
                )
            else:
                self.cache[block] = (piece, *ops)
        return self.cache[block]
