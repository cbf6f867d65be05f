"""PyTorch's async tensor parallelism (``tp_comm_overlap: async``; torchtitan ``enable_async_tensor_parallel``,
Inductor's micro-pipeline TP pass over the compiled graph, torch/distributed/_symmetric_memory/__init__.py,
PyTorch 2.5+: ``_fused_all_gather_matmul_impl`` and ``_fused_matmul_reduce_scatter_impl``).

* all-gather then matmul: the matmul runs in TP chunks of the gathered rows, the local shard's first; while one
  chunk multiplies, the next shard is copied from its peer into symmetric memory by the copy engine.
* matmul then reduce-scatter: the matmul runs in TP chunks, one per destination rank (the local one last); each
  chunk's partial result is copied to its rank while the next chunk multiplies; each rank then sums the TP
  partials it received (a memory-bound reduction).

So the communication hides behind GEMMs a TP-th the size, which run at their own (lower) efficiency, plus the
reduction, instead of behind one whole GEMM: the overlap is partial where chunks are short. The backward's
all-gather (of the output gradient) feeds its input-gradient GEMM the same way. Its reduce-scatter (of the
input gradient) is not fused: Inductor's pass (torch/_inductor/fx_passes/micro_pipeline_tp.py,
fuse_matmul_reduce_scatter) fuses a reduce-scatter only with the single matmul producing its input, and
torchtitan's layers sum several dgrads there (workload/tensor_parallel.py keeps it a plain collective).
With FP8 linear layers (torchao's Float8 under TP casts the input before the all-gather) the fused op gathers
FP8 shards and multiplies them chunk by chunk; nothing is cast per chunk (``decompose``).
"""

from __future__ import annotations

from math import ceil

from simulator.workload.block import Block
from simulator.workload.ops import Op, collective_op, memory_op


def chunk(g: Op, t: int, i: int, label: str = "async TP", columns: bool = False) -> Op:
    """Chunk ``i`` of ``t`` of GEMM ``g`` along its rows (or its output features, ``columns``)."""
    m, n = (g.m, ceil(g.n / t)) if columns else (ceil(g.m / t), g.n)
    per_elem = g.bytes / (g.m * g.k + g.k * g.n + g.m * g.n) if g.bytes else 0.0
    return g.evolve(
        name=f"{g.name} ({label} chunk {i + 1}/{t})",
        m=m,
        n=n,
        flops=g.flops / t,
        model_flops=g.model_flops / t,
        bytes=per_elem * (m * g.k + g.k * n + m * n),
        whole=g.whole or (g.m, g.n, g.k),
    )


def copy(c: Op, t: int, i: int, label: str = "async TP") -> Op:
    """The copy of one TP-th of collective ``c``'s buffer to or from a peer, behind the next GEMM chunk."""
    return collective_op(
        f"{c.name}: {label} copy {i}/{t - 1}", "send_recv", "tp", c.bytes / t, "next", c.direction
    )


def all_gather_matmul(c: Op, g: Op, t: int, label: str = "async TP") -> list[Op]:
    out: list[Op] = []
    for i in range(t):
        if i < t - 1:
            out.append(copy(c, t, i + 1, label))  # the next shard arrives while this chunk multiplies
        out.append(chunk(g, t, i, label))
    return out


def matmul_reduce_scatter(g: Op, c: Op, t: int, e: int) -> list[Op]:
    out: list[Op] = []
    for i in range(t):
        out.append(chunk(g, t, i))
        if i < t - 1:
            out.append(copy(c, t, i + 1))  # this chunk's partial goes to its rank behind the next chunk
    rows = ceil(g.m / t)
    reduce = memory_op(f"{c.name}: async TP reduction", e * (t + 1) * rows * g.n, "elementwise", rows, g.n)
    out.append(reduce.evolve(direction=c.direction))
    return out


def decompose(ops: tuple[Op, ...], t: int, e: int) -> tuple[Op, ...]:
    """``ops`` with each collective marked ``async`` and its GEMM rewritten as above (an all-gather with the
    next GEMM, a reduce-scatter with the GEMM just before it); where no GEMM adjoins, the collective keeps
    Transformer Engine's overlap (behind the neighbouring kernel). An FP8 GEMM's quantize kernel between the
    all-gather and the GEMM runs once, before the chunks: the fused op multiplies operands already in FP8
    (torch/distributed/_symmetric_memory/__init__.py ``_fused_all_gather_scaled_matmul``; torchao casts the
    input and the weight once, float8/float8_tensor_parallel.py), so a chunk does not cast the weight again."""
    return rewrite(
        ops,
        "async",
        lambda c, g: all_gather_matmul(c, g, t),
        lambda g, c: matmul_reduce_scatter(g, c, t, e),
        alone=("next", "previous"),
    )


def rewrite(
    ops: tuple[Op, ...], mark: str, gather_matmul, matmul_scatter, alone: tuple[str, str]
) -> tuple[Op, ...]:
    """``ops`` with each collective ``overlaps``-marked ``mark`` fused with its GEMM: an all-gather with the GEMM it
    feeds (past FP8 quantize kernels, which stay before it, run once) by ``gather_matmul(collective, gemm)``, a
    reduce-scatter with the GEMM just before it by ``matmul_scatter(gemm, collective)``; where no GEMM adjoins,
    the collective gets ``alone``'s overlap (all-gather, reduce-scatter)."""
    out: list[Op] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        if op.kind != "collective" or op.overlaps != mark:
            out.append(op)
            i += 1
            continue
        if op.collective == "all_gather":
            nxt = gemm_after(ops, i)
            if nxt is not None:
                out += ops[i + 1 : nxt]  # the FP8 GEMM's quantize kernels, once
                out += gather_matmul(op, ops[nxt])
                i = nxt + 1
                continue
            out.append(op.evolve(overlaps=alone[0]))
        elif out and out[-1].kind == "gemm":
            out += matmul_scatter(out.pop(), op)
        else:
            out.append(op.evolve(overlaps=alone[1]))
        i += 1
    return tuple(out)


def gemm_after(ops: tuple[Op, ...], i: int) -> int | None:
    """The index of the GEMM the all-gather at ``i`` feeds, past the FP8 quantize kernels between them
    (workload/fp8.py: a memory-bound kernel followed by a typed GEMM); None where no GEMM follows."""
    nxt = i + 1
    while nxt + 1 < len(ops) and ops[nxt].kind == "memory" and ops[nxt + 1].dtype:
        nxt += 1
    return nxt if nxt < len(ops) and ops[nxt].kind == "gemm" else None


def each_block(blocks: tuple[Block, ...], rewrite) -> tuple[Block, ...]:
    """``rewrite`` (of an op list) over every op list of each block; blocks repeated in ``blocks`` rewritten once."""
    done: dict[int, Block] = {}
    for b in blocks:
        if id(b) not in done:
            done[id(b)] = b.map_ops(rewrite)
    return tuple(done[id(b)] for b in blocks)


def decompose_block(block: Block, t: int, e: int) -> Block:
    """``block`` with every op list decomposed (forward, backward and what each recompute policy re-runs), after
    FP8 quantization has put its casts and FP8 all-gathers in place."""
    return block.map_ops(lambda ops: decompose(ops, t, e))


def decompose_blocks(blocks: tuple[Block, ...], t: int, e: int) -> tuple[Block, ...]:
    """:func:`decompose_block` of each block (blocks repeated in ``blocks`` decomposed once)."""
    return each_block(blocks, lambda ops: decompose(ops, t, e))
