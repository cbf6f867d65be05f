"""Transformer Engine's userbuffers tensor-parallel overlap (``tp_comm_overlap: true`` / ``te``; Megatron-Core
--tp-comm-overlap, which passes TE's defaults unless --tp-comm-overlap-cfg names others:
megatron/training/initialize.py ``_initialize_tp_communicators``).

TransformerEngine v1.13 (transformer_engine/pytorch/module/base.py ``initialize_ub``, the method table and
``get_default_config``; common/comm_gemm_overlap/comm_gemm_overlap.cpp) runs each TP GEMM of a layer one of
three ways:

* ``ring_exchange`` (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad: an all-gather feeding the GEMM):
  ``CommOverlapP2PBase::split_overlap_ag`` runs the GEMM in TP chunks of the gathered rows, the local shard's
  first (it waits for nothing); each next shard comes from the ring neighbour by a copy-engine
  ``cudaMemcpyAsync`` (userbuffers push mode, one signalling thread) while the chunk before it multiplies. The
  same mechanics as PyTorch's async TP, so :func:`simulator.workload.async_tp.all_gather_matmul` builds it.
* ``pipeline`` (proj_fprop, fc2_fprop: the GEMM whose output is reduce-scattered): ``split_overlap_rs`` cuts the
  GEMM into ``num_splits`` = 4 chunks of its output features; chunk i's reduce-scatter (an SM kernel,
  ``reducescatter2_userbuff_stridedoutput``, on its own stream) runs while chunk i + 1 multiplies, and the last
  chunk's runs after the last GEMM, exposed.
* ``bulk`` (qkv_dgrad / fc1_dgrad, qkv_wgrad / fc1_wgrad): one collective beside one whole GEMM; the input
  gradient's reduce-scatter beside the weight-gradient GEMM, as the workload already places it ("previous").

TE's own layers only: the output layer and the embedding are Megatron's ColumnParallelLinear /
VocabParallelEmbedding, whose sequence-parallel gather / scatter is a blocking NCCL call (marked ``te`` and left
undecomposed here, so the engine waits for it).

The communication kernels' SMs are not charged to the GEMMs beside them: ring exchange uses the copy engines, and a
GEMM with 16 of the H200's 132 SMs left to a communication kernel (cuBLASLt's SM count target, as TE v2's
``set_sm_margin``) measured 1.00x its whole-GPU time in bf16 and 1.06x in FP8 (median of 48 TP GEMM shapes each,
benchmarks/tp_split_gemm.py, docs/measurements/h200-tp-split-gemm.json): a power-capped GEMM's clocks rise on
fewer SMs.
"""

from __future__ import annotations

from simulator.workload.async_tp import all_gather_matmul, chunk, each_block, rewrite
from simulator.workload.block import Block
from simulator.workload.ops import Op

SPLITS = 4  # the pipelined reduce-scatter's num_splits (get_default_config)


def matmul_reduce_scatter(g: Op, c: Op, t: int, parts: int = SPLITS) -> list[Op]:
    """The pipelined GEMM + reduce-scatter: each chunk's reduce-scatter beside the next chunk, the last exposed.

    Userbuffers' reduce-scatter is one kernel in which each rank loads its slice of the chunk from every peer's
    buffer at once and sums it (``reducescatter2_userbuff_stridedoutput``, userbuffers.cu): (t - 1) / t of the
    chunk through the rank's own NVLink ports, in one step, not NCCL's ring of t - 1 steps. So it is costed as one
    transfer of that many bytes between a pair of ranks."""
    out: list[Op] = []
    for i in range(parts):
        out.append(chunk(g, parts, i, "TE pipeline", columns=True))
        out.append(
            c.evolve(
                name=f"{c.name}: TE pipeline chunk {i + 1}/{parts} (userbuffers, one step)",
                collective="send_recv",
                bytes=c.bytes / parts * (t - 1) / t,
                overlaps="next" if i < parts - 1 else "",
            )
        )
    return out


def decompose(ops: tuple[Op, ...], t: int) -> tuple[Op, ...]:
    """``ops`` with each ``te`` all-gather run as a ring exchange with the GEMM after it (past an FP8 cast: TE
    gathers FP8 shards, ``fp8_buf``) and each ``te`` reduce-scatter pipelined with the GEMM before it; one with no
    GEMM beside it stays a blocking collective."""
    return rewrite(
        ops,
        "te",
        lambda c, g: all_gather_matmul(c, g, t, "TE ring exchange"),
        lambda g, c: matmul_reduce_scatter(g, c, t),
        ("", ""),
    )


def decompose_blocks(blocks: tuple[Block, ...], t: int) -> tuple[Block, ...]:
    """:func:`decompose` over every op list of each block (blocks repeated in ``blocks`` decomposed once)."""
    return each_block(blocks, lambda ops: decompose(ops, t))
