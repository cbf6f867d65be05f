"""Kernels and the constructors of the common ones: what a workload is made of.

``flops`` are executed FLOPs (what takes time); ``model_flops`` the FLOPs the model needs (full causal
attention counted, as in Megatron's MFU formula). ``bytes`` is the HBM traffic of memory-bound kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter


@dataclass(frozen=True)
class Op:
    """One kernel. ``flops`` are executed FLOPs (what takes time); ``model_flops`` the FLOPs the model needs
    (full causal attention counted, as in Megatron's MFU formula)."""

    name: str
    kind: str  # gemm | memory | flash_attention | collective | host (host work only) | sync (host waits)
    flops: float = 0.0
    bytes: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    model_flops: float = 0.0
    collective: str = ""  # collective ops: all_reduce, all_gather, reduce_scatter, send_recv
    group: str = ""  # collective ops: the group kind (tp, pp, ...)
    # collective ops: "previous" / "next" = runs alongside that neighbouring kernel; "alongside" = beside the
    # collective before it (one kernel moving data over two kinds of links at once)
    overlaps: str = ""
    # what a calibration table calls this kernel (simulator/tables/format.py: KERNEL_OPS) and its pass;
    # memory-bound kernels keep their tensor's rows x columns in m x n. "" = no table row can describe it
    kernel: str = ""
    direction: str = "forward"
    launches: int = (
        1  # kernels this op stands for (a bundle of a framework's small kernels); 0 = host work only
    )
    recompute: bool = False  # re-run by activation recomputation: hardware FLOPs, not model FLOPs
    host_s: float = 0.0  # kind "host": host seconds of work that launches no kernel
    dtype: str = ""  # the GEMM's tensor-core type where it is not the training's (FP8 linear layers)
    linear: bool = False  # a linear layer's GEMM (forward, dgrad or wgrad): what FP8 training quantizes
    # a chunk of a split GEMM (TP overlap): the whole GEMM's (m, n, k), which the cost model prices the chunk
    # from (costs/compute.py ComputeModel); () = not a chunk
    whole: tuple[int, int, int] | tuple[()] = ()
    # the layer module the kernel belongs to, as Megatron-Core's CUDA graph scopes name them (attn, mlp, moe,
    # moe_router, moe_preprocess, mamba; workload/graph_modules.py): "" = none of them (embedding, head, step)
    module: str = ""
    # a fused epilogue's HBM bytes beyond the GEMM's own operands and output (Transformer Engine's fused grouped
    # MLP writes the activation, quantized, from the GEMM's output tiles): the GEMM's traffic, so it costs time
    # only where it makes the GEMM memory-bound (workload/fused_grouped_mlp.py)
    epilogue_bytes: float = 0.0
    # a linear GEMM whose varying operand (X forward, dY in dgrad) the kernel before it wrote already quantized,
    # in that kernel's epilogue: FP8 training adds no cast for it (workload/fp8.py quantized)
    prequantized: bool = False
    # a sliding-window attention kernel: the keys each query attends to at most (Mistral, Gemma, GPT-OSS); 0 = every
    # earlier key. Its cost follows the blocks the kernel walks, not its FLOPs (costs/attention_rate.py window_factor)
    window: int = 0

    # Ops are looked up by value many times a simulation (the cost model's cache, a periodic replay's tasks, the
    # sources' sums): the hash of their 24 fields is computed once and kept (never pickled: a string's hash
    # differs between processes)
    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash(_FIELD_VALUES(self))
        return h

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    def evolve(self, **changes) -> Op:
        """This op with ``changes``: dataclasses.replace without re-running __init__ (Op has no __post_init__),
        about 7x cheaper; workload builds copy ops by the thousand (module tags, recomputation, TP overlap's
        chunks). The names are not checked: only Op's fields may be passed. The cached hash is this op's, not
        the copy's, so it is dropped."""
        new = object.__new__(Op)
        state = new.__dict__
        state.update(self.__dict__)
        state.update(changes)
        state.pop("_hash", None)
        return new

    def with_module(self, module: str) -> Op:
        """This op tagged with ``module`` (workload/graph_modules.py tags every op of every layer)."""
        return self.evolve(module=module)


_FIELD_VALUES = attrgetter(*(f.name for f in fields(Op)))  # an Op's fields as one tuple


def collective_op(
    name: str, collective: str, group: str, nbytes: float, overlaps: str = "", direction: str = "forward"
) -> Op:
    """A collective inside a block: blocking (Megatron's tensor-parallel all-reduces, pipeline send/recv), or
    with ``overlaps`` ("previous" / "next") running alongside that neighbouring kernel, so only what outlasts
    the kernel is exposed (ring attention; Transformer Engine's TP communication overlap)."""
    return Op(
        name,
        "collective",
        bytes=float(nbytes),
        collective=collective,
        group=group,
        overlaps=overlaps,
        direction=direction,
    )


def host_op(name: str, seconds: float, direction: str = "forward") -> Op:
    """Host work that launches no kernel of its own (data loading, masks, schedule bookkeeping, Python loops
    over parameters): ``seconds`` of the host thread, none of the GPU."""
    return Op(name, "host", direction=direction, launches=0, host_s=seconds)


def sync_op(name: str, seconds: float) -> Op:
    """A call that makes the host wait for the GPU (``.item()``, a device tensor from a host scalar): the host
    resumes ``seconds`` after the GPU has finished everything issued before it."""
    return Op(name, "sync", launches=0, host_s=seconds)


def recomputed(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """The forward ops as activation recomputation re-runs them: the same kernels, counted as hardware FLOPs
    only (MFU counts the model's FLOPs once; HFU counts the recompute too)."""
    return tuple(op.evolve(recompute=True) for op in ops)


def gemm(
    name: str,
    m: int,
    n: int,
    k: int,
    batch: int = 1,
    elem_bytes: int = 2,
    direction: str = "forward",
    linear: bool = False,
    grouped: bool = False,
) -> Op:
    """A (batched) matrix multiply C[m,n] = A[m,k] B[k,n]: 2mnk FLOPs, reads A and B, writes C. ``linear``: a
    linear layer's weight GEMM (X W^T), which FP8 training runs in FP8. ``grouped``: one grouped-GEMM kernel over
    ``batch`` problems (MoE experts, ``m`` rows each), not a batched GEMM of attention."""
    flops = 2.0 * m * n * k * batch
    kernel = "gemm" if batch == 1 else "grouped_gemm" if grouped else "batched_gemm"
    nbytes = elem_bytes * batch * (m * k + k * n + m * n)
    return Op(
        name, "gemm", flops, nbytes, m, n, k, batch, flops, kernel=kernel, direction=direction, linear=linear
    )


def linear(name: str, m: int, n: int, k: int) -> Op:
    """A linear layer's forward GEMM: ``m`` tokens x ``k`` inputs -> ``n`` outputs (a Transformer Engine / torch
    Linear; FP8 training quantizes its three GEMMs)."""
    return gemm(name, m, n, k, linear=True)


def memory_op(
    name: str, nbytes: float, kernel: str = "", rows: int = 0, cols: int = 0, direction: str = "forward"
) -> Op:
    """A memory-bound kernel moving ``nbytes``; ``kernel`` and its tensor's ``rows`` x ``cols`` name it for the
    calibration tables (left empty where no table kind fits, e.g. quantization kernels)."""
    return Op(name, "memory", 0.0, float(nbytes), rows, cols, kernel=kernel, direction=direction)


def routed_share(op: Op, share: float) -> Op:
    """A GEMM over padded rows (MoE experts) counts only its routed tokens' ``share`` as model FLOPs."""
    return op if share >= 1.0 else op.evolve(model_flops=op.model_flops * share)


def gemm_backward(op: Op, has_weight: bool = True) -> tuple[Op, Op]:
    """dX = dY W^T (m x k, reduce over n) and dW = X^T dY (k x n, reduce over m): each as many FLOPs as forward.
    Only a GEMM with a weight has a "wgrad" (which zero-bubble schedules may defer); attention's batched GEMMs
    multiply two activations, so both their gradients are input gradients."""
    second = "wgrad" if has_weight else "dgrad (second input)"
    kw = {"direction": "backward", "linear": op.linear, "grouped": op.kernel == "grouped_gemm"}
    return (
        gemm(f"{op.name} dgrad", op.m, op.k, op.n, op.batch, **kw),
        gemm(f"{op.name} {second}", op.k, op.n, op.m, op.batch, **kw),
    )


class OpsMemo:
    """A value computed once per tuple of ops: by the tuple's id (the tuple kept in its entry, so its id is not
    reused while the memo lives), else by its value (Op is frozen: equal ops hash alike, each its hash computed
    once), so that tasks built apart with equal ops (a periodic replay's programs, ZeRO-3's and FSDP's per-module
    pieces, a pipeline's micro-batches) share one."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple] = {}
        self._by_value: dict[tuple, object] = {}

    def get(self, ops: tuple, make):
        hit = self._by_id.get(id(ops))
        if hit is None:
            value = self._by_value.get(ops)
            if value is None:
                value = self._by_value[ops] = make(ops)
            hit = self._by_id[id(ops)] = (ops, value)
        return hit[1]
