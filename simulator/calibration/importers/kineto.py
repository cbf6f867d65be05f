"""Kernel and collective rows from a PyTorch profiler (Kineto) Chrome trace, plain or .gz, recorded with
``record_shapes=True``.

Each GPU kernel belongs to the CPU op that launched it (``External id``); walking up the CPU op nesting on its
thread, the outermost op of a known kind names the row (``aten::addmm`` -> gemm, ``aten::cross_entropy_loss``
-> cross_entropy, ...) and its ``Input Dims`` give the shape. A row's time is the sum of that op's kernels,
its host time the op's CPU duration; repeated shapes keep the median. A CPU-only trace has no kernels: there
the op's own duration is its time (the CPU ran it). NCCL kernels become collective rows, with the op, element
count, data type and group size from PyTorch's ``record_param_comms`` record and the algorithm / protocol from
the kernel's name (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``); gloo ops (``gloo:all_reduce``, CPU) likewise.
What the trace does not say (nodes, ranks per node, and for gloo the group size) comes from the command line.
Ops not listed in KINDS (copies, optimizer internals, ...) are counted and reported, not guessed.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from math import prod
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.scenario.files import gunzip, parse_json, read_bytes
from simulator.tables.format import DTYPE_BYTES, CollectiveRow, KernelRow

# A profiler trace of a few training steps of a large model is tens to hundreds of MB; read and inflated, at most
MAX_TRACE_BYTES = 512 * 2**20

DTYPES = {
    "float": "fp32",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "double": "fp32",
    "Float": "fp32",
    "Half": "fp16",
    "BFloat16": "bf16",
}
COLLECTIVE_NAMES = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "send": "send_recv",
    "recv": "send_recv",
}


def _rows_cols(dims) -> tuple[int, int] | None:
    if not dims or not all(isinstance(d, int) for d in dims):
        return None
    return prod(dims[:-1]) or 1, dims[-1]


def _mm(a, b):
    return (a[0], b[1], a[1], 1) if len(a) == 2 and len(b) == 2 else None


def _bmm(a, b):
    return (a[1], b[2], a[2], a[0]) if len(a) == 3 and len(b) == 3 else None


def _grouped(a, b):
    """torch._grouped_mm of every expert's rows [rows, k] by the experts' weights [experts, k, n]: the mean rows
    per expert (the offsets are not in the trace's Input Dims)."""
    if len(a) != 2 or len(b) != 3 or not b[0]:
        return None
    return (max(round(a[0] / b[0]), 1), b[2], a[1], b[0])


def _sdpa(q, k):  # [B, H, L, E] x [B, H, S, E]
    return (q[2], k[2], q[3], q[0] * q[1]) if len(q) == 4 and len(k) == 4 else None


def _memory(x):
    rc = _rows_cols(x)
    return (*rc, 0, 1) if rc else None


def _embedding(weight, idx):
    return (prod(idx) or 1, weight[1], weight[0], 1) if len(weight) == 2 else None


def _tensor_list_elements(dims):
    return (sum(prod(d) for d in dims if isinstance(d, list)), 1, 0, 1) if dims else None


def _sdpa_forward(d):  # q, k, v, ...
    return _sdpa(d[0], d[1])


def _sdpa_backward(d):  # grad_out, q, k, v, ...
    return _sdpa(d[1], d[2])


def _first(d):
    return _memory(d[0])


_SDPA = ("flash_attention", "efficient_attention", "cudnn_attention", "flash_attention_for_cpu")

# aten op -> (kernel kind, direction, shape from its Input Dims -> (m, n, k, batch))
KINDS = {
    "aten::mm": ("gemm", "forward", lambda d: _mm(d[0], d[1])),
    "aten::addmm": ("gemm", "forward", lambda d: _mm(d[1], d[2])),
    "aten::bmm": ("batched_gemm", "forward", lambda d: _bmm(d[0], d[1])),
    "aten::baddbmm": ("batched_gemm", "forward", lambda d: _bmm(d[1], d[2])),
    "aten::_grouped_mm": ("grouped_gemm", "forward", lambda d: _grouped(d[0], d[1])),
    **{f"aten::_scaled_dot_product_{a}": ("flash_attention", "forward", _sdpa_forward) for a in _SDPA},
    **{
        f"aten::_scaled_dot_product_{a}_backward": ("flash_attention", "backward", _sdpa_backward)
        for a in _SDPA
    },
    "aten::native_layer_norm": ("layernorm", "forward", _first),
    "aten::native_layer_norm_backward": ("layernorm", "backward", _first),
    "aten::_fused_rms_norm": ("rmsnorm", "forward", _first),
    "aten::_fused_rms_norm_backward": ("rmsnorm", "backward", _first),
    "aten::_softmax": ("softmax", "forward", _first),
    "aten::_softmax_backward_data": ("softmax", "backward", _first),
    "aten::native_dropout": ("dropout", "forward", _first),
    "aten::native_dropout_backward": ("dropout", "backward", _first),
    "aten::gelu": ("gelu", "forward", _first),
    "aten::gelu_backward": ("gelu", "backward", _first),
    "aten::relu": ("relu", "forward", _first),
    "aten::threshold_backward": ("relu", "backward", _first),
    "aten::embedding": ("embedding", "forward", lambda d: _embedding(d[0], d[1])),
    "aten::cross_entropy_loss": ("cross_entropy", "forward", _first),
    "aten::_log_softmax_backward_data": ("cross_entropy", "backward", _first),
    "aten::_fused_adam_": ("adam_step", "forward", lambda d: _tensor_list_elements(d[0])),
    "aten::_fused_adamw_": ("adam_step", "forward", lambda d: _tensor_list_elements(d[0])),
}


def load_trace(path: Path) -> tuple[list[dict], dict]:
    """The trace's events and its other top-level fields; one clear error for a file that is not a (complete)
    profiler trace."""
    label = str(path)
    raw = read_bytes(path, limit=MAX_TRACE_BYTES)
    if raw[:2] == b"\x1f\x8b":
        raw = gunzip(raw, label, MAX_TRACE_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not a UTF-8 JSON trace") from None
    data = parse_json(text, label)
    events = data.get("traceEvents") if isinstance(data, dict) else data if isinstance(data, list) else None
    if not isinstance(events, list):
        raise ScenarioError(f"{path}: no 'traceEvents' list (not a PyTorch profiler Chrome trace)")
    top = {k: v for k, v in data.items() if k != "traceEvents"} if isinstance(data, dict) else {}
    return [e for e in events if isinstance(e, dict)], top


def _dtype(args: dict) -> str:
    for t in args.get("Input type", []) or []:
        if t in DTYPES:
            return DTYPES[t]
    return "fp32"


class _Ops:
    """CPU ops of a trace, each with its parent (the op it ran inside, same thread)."""

    def __init__(self, events: list[dict]):
        ops = [
            e
            for e in events
            if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "operator", "user_annotation")
        ]
        ops.sort(
            key=lambda e: (
                str(e.get("pid")),
                str(e.get("tid")),
                float(e.get("ts", 0)),
                -float(e.get("dur", 0)),
            )
        )
        self.ops = ops
        self.parent: list[int] = [-1] * len(ops)
        self.outer: list[int] = []  # per op: its outermost ancestor (or itself) that KINDS imports, else -1
        self.in_backward: list[bool] = []
        # per op: the nearest record_param_comms at or above it (NCCL's args), else -1
        self.comms: list[int] = []
        self.by_external: dict = {}
        stack: list[int] = []
        thread = None
        for i, e in enumerate(ops):
            if (e.get("pid"), e.get("tid")) != thread:
                thread, stack = (e.get("pid"), e.get("tid")), []
            start = float(e.get("ts", 0))
            while stack and float(ops[stack[-1]]["ts"]) + float(ops[stack[-1]].get("dur", 0)) <= start:
                stack.pop()
            self.parent[i] = parent = stack[-1] if stack else -1
            # an op's outermost imported ancestor and whether it runs under autograd's backward follow from its
            # parent's (parents come first): linear in the trace, however deep the nesting (a walk up the chain
            # per op took 28 s for 20,000 nested ops)
            name = e.get("name")
            outer = self.outer[parent] if parent >= 0 else -1
            self.outer.append(outer if outer >= 0 else (i if name in KINDS else -1))
            self.in_backward.append(
                (parent >= 0 and self.in_backward[parent])
                or str(name).startswith("autograd::engine::evaluate_function")
            )
            self.comms.append(
                i if name == "record_param_comms" else self.comms[parent] if parent >= 0 else -1
            )
            stack.append(i)
            ext = (e.get("args") or {}).get("External id")
            if ext is not None and e.get("cat") != "user_annotation":
                self.by_external.setdefault(ext, i)

    def outermost_known(self, i: int) -> int:
        return self.outer[i]

    def backward(self, i: int) -> bool:
        return self.in_backward[i]


def import_trace(
    path: Path, ranks: int | None = None, nodes: int = 1, ranks_per_node: int | None = None
) -> tuple[list[KernelRow], list[CollectiveRow], dict]:
    """(kernel rows, collective rows, what was found: device, counts of ops not imported)."""
    events, top = load_trace(path)
    try:
        return _import(events, top, ranks, nodes, ranks_per_node)
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # an event not shaped as Kineto writes it
        raise ScenarioError(
            f"{path}: an event is not in the profiler's format ({type(e).__name__}: {e})"
        ) from None


def _import(events: list[dict], top: dict, ranks, nodes, ranks_per_node):
    ops = _Ops(events)
    kernels = [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"]
    times: dict[tuple, list[tuple[float, float | None]]] = defaultdict(list)  # key -> [(us, host us)]
    names: dict[tuple, str] = {}
    skipped: dict[str, int] = defaultdict(int)
    collectives: dict[tuple, list[float]] = defaultdict(list)
    meta: dict[tuple, tuple[str, str]] = {}

    def add_kernel_row(i: int, us: float, host: float | None) -> None:
        e = ops.ops[i]
        kind, direction, shape_of = KINDS[e["name"]]
        args = e.get("args") or {}
        try:
            shape = shape_of(args.get("Input Dims") or [])
        except (IndexError, TypeError):
            shape = None
        if not shape or min(shape[0], shape[1], shape[3]) < 1:
            skipped[f"{e['name']} (no usable Input Dims: record with record_shapes=True)"] += 1
            return
        if kind in ("gemm", "batched_gemm", "grouped_gemm"):
            direction = "backward" if ops.backward(i) else "forward"
        key = (kind, direction, _dtype(args), *shape)
        times[key].append((us, host))
        names.setdefault(key, e["name"])

    if kernels:  # a GPU trace: kernels carry the time, CPU ops the host time
        per_op: dict[int, float] = defaultdict(float)
        for k in kernels:
            args = k.get("args") or {}
            i = ops.by_external.get(args.get("External id"), -1)
            name = str(k.get("name", ""))
            if name.startswith("nccl"):
                _nccl(k, i, ops, collectives, meta, ranks, nodes, ranks_per_node, skipped)
                continue
            j = ops.outermost_known(i) if i >= 0 else -1
            if j < 0:
                skipped[str(ops.ops[i]["name"]) if i >= 0 else "kernel without a CPU op"] += 1
                continue
            per_op[j] += float(k.get("dur", 0))
        for j, us in per_op.items():
            add_kernel_row(j, us, float(ops.ops[j].get("dur", 0)))
    else:  # a CPU trace: the op's own duration is its time
        for i, e in enumerate(ops.ops):
            name = e["name"]
            if name.startswith("gloo:"):
                _gloo(e, collectives, meta, ranks, nodes, ranks_per_node, skipped)
            elif name in KINDS and ops.outermost_known(i) == i:
                add_kernel_row(i, float(e.get("dur", 0)), None)
    krows = []
    for key, samples in sorted(times.items()):
        us = [t for t, _ in samples]
        hosts = [h for _, h in samples if h is not None]
        mid = statistics.median(us)
        kind, direction, dtype, m, n, k, batch = key
        if mid <= 0:
            continue
        krows.append(
            KernelRow(
                kind,
                dtype,
                m,
                n,
                k,
                batch,
                mid,
                direction,
                len(us),
                round(100 * (max(us) - min(us)) / mid, 1),
                statistics.median(hosts) if hosts else None,
                names[key],
            )
        )
    crows = []
    for key, us in sorted(collectives.items()):
        op, n_ranks, n_nodes, rpn, nbytes = key
        mid = statistics.median(us)
        if mid <= 0:
            continue
        dtype, algo_proto = meta[key]
        algo, _, proto = algo_proto.partition("/")
        crows.append(
            CollectiveRow(
                op,
                n_ranks,
                n_nodes,
                rpn,
                nbytes,
                mid,
                len(us),
                round(100 * (max(us) - min(us)) / mid, 1),
                dtype,
                algo,
                proto,
            )
        )
    props = top.get("deviceProperties") or [{}]
    device = props[0] if isinstance(props, list) and props and isinstance(props[0], dict) else {}
    return krows, crows, {"skipped": dict(skipped), "device": device, "gpu_trace": bool(kernels)}


_NCCL_ALGO = re.compile(r"_(RING|TREE|COLLNET\w*|NVLS\w*|PAT)_(LL128|LL|SIMPLE)", re.IGNORECASE)


def _group(op: str, size: int | None, ranks, nodes, rpn, what: str, skipped) -> tuple[int, int, int] | None:
    n = 2 if op == "send_recv" else (size or ranks)
    if not n or n < 2:
        skipped[f"{what}: group size unknown (pass --ranks)" if not n else f"{what} on one rank"] += 1
        return None
    per_node = rpn or max(n // nodes, 1)
    if per_node * nodes != n:
        skipped[f"{what}: {n} ranks do not split into {nodes} nodes"] += 1
        return None
    return n, nodes, per_node


def _nccl(kernel: dict, i: int, ops: _Ops, out, meta, ranks, nodes, rpn, skipped) -> None:
    record = ops.ops[ops.comms[i]] if i >= 0 and ops.comms[i] >= 0 else None
    args = (record or {}).get("args") or {}
    op = COLLECTIVE_NAMES.get(str(args.get("Collective name", "")).lower())
    if op is None:
        skipped[f"NCCL kernel {str(kernel.get('name'))[:40]} without a record_param_comms record"] += 1
        return
    dtype = DTYPES.get(str(args.get("dtype", "")), "fp32")
    elements = args.get("Out msg nelems") if op == "all_gather" else args.get("In msg nelems")
    group = _group(op, args.get("Group size"), ranks, nodes, rpn, f"NCCL {op}", skipped)
    if group is None or not elements:
        return
    key = (op, *group, float(elements) * DTYPE_BYTES.get(dtype, 4))
    out[key].append(float(kernel.get("dur", 0)))
    found = _NCCL_ALGO.search(str(kernel.get("name", "")))
    meta[key] = (dtype, f"{found.group(1).lower()}/{found.group(2).upper()}" if found else "/")


def _gloo(e: dict, out, meta, ranks, nodes, rpn, skipped) -> None:
    op = COLLECTIVE_NAMES.get(e["name"].split(":", 1)[1])
    args = e.get("args") or {}
    dims = (args.get("Input Dims") or [[]])[0]
    if op is None or not dims or not all(isinstance(d, int) for d in dims):
        skipped[str(e["name"])] += 1
        return
    group = _group(op, None, ranks, nodes, rpn, e["name"], skipped)
    if group is None:
        return
    dtype = _dtype(args)
    elements = prod(dims) * (group[0] if op == "all_gather" else 1)  # gloo records one rank's input
    key = (op, *group, float(elements) * DTYPE_BYTES.get(dtype, 4))
    out[key].append(float(e.get("dur", 0)))
    meta[key] = (dtype, "/")
