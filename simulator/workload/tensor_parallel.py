"""Tensor parallelism's collectives (Narayanan et al. SC21 Sec. 3.2, Fig. 5): the column-parallel input needs
the full activation (identity forward, all-reduce of its gradient backward), the row-parallel output is
all-reduced forward. Sequence parallelism (Korthikanti et al. Sec. 4.2.2) turns each all-reduce into an
all-gather before and a reduce-scatter after, so the norms and dropouts between them work on s/t tokens."""

from __future__ import annotations

from simulator.workload import async_tp, te_userbuffers
from simulator.workload.ops import collective_op


def tp_collectives(
    t: int, sequence_parallel: bool, nbytes: float, overlap: bool | str = False, async_grad: bool = False
):
    """Factories for the four tensor-parallel collectives around a column- then row-parallel pair:
    (before column-parallel forward, after row-parallel forward, column-parallel input gradient,
    row-parallel output gradient). Each returns None where the collective does not exist. With ``overlap``
    (Megatron-Core --tp-comm-overlap, Transformer Engine userbuffers) an all-gather runs alongside the GEMM after
    it and a reduce-scatter alongside the GEMM before it, chunked as workload/te_userbuffers.py says. With
    ``async_grad`` the column-parallel input gradient's all-reduce runs alongside the weight-gradient GEMM issued
    after it (Megatron's
    async_tensor_model_parallel_allreduce: megatron/core/tensor_parallel/layers.py,
    LinearWithGradAccumulationAndAsyncCommunication.backward)."""

    def make(kind: str | None, direction: str = "forward", side: str = ""):
        if t == 1 or kind is None:
            return lambda name: None
        if overlap == "async" and (direction == "forward" or kind == "all_gather"):
            side = "async"  # PyTorch async TP: rewritten with its GEMM by workload/async_tp.py
        elif overlap == "async":
            # the input gradient's reduce-scatter: Inductor fuses a reduce-scatter only with the one matmul whose
            # output is its only input (torch/_inductor/fx_passes/micro_pipeline_tp.py,
            # fuse_matmul_reduce_scatter); torchtitan's layers sum several dgrads there (separate wq / wk / wv,
            # w1 / w3: models/llama3/model.py), so it stays the plain NCCL collective it is without async TP
            pass
        elif overlap:
            # Transformer Engine userbuffers (workload/te_userbuffers.py): ring exchange for the all-gathers,
            # pipelined chunks for the forward reduce-scatter, the input gradient's beside its wgrad GEMM (bulk)
            side = "previous" if kind == "reduce_scatter" and direction == "backward" else "te"
        return lambda name: collective_op(
            f"tp {kind.replace('_', '-')} ({name})", kind, "tp", nbytes, side, direction
        )

    if sequence_parallel:
        return (
            make("all_gather"),
            make("reduce_scatter"),
            make("reduce_scatter", "backward"),
            make("all_gather", "backward"),
        )
    return (
        make(None),
        make("all_reduce"),
        make("all_reduce", "backward", "previous" if async_grad else ""),
        make(None),
    )


def tp_overlapped(blocks: tuple, overlap: bool | str, t: int, e: int) -> tuple:
    """``blocks`` with their TP collectives run as the overlap runs them, after FP8 has placed its casts: PyTorch
    async TP's chunks (``async``, workload/async_tp.py) or Transformer Engine's userbuffers (``true`` / ``te``,
    workload/te_userbuffers.py, on TE's own layers: the transformer blocks, not the output layer)."""
    if t == 1 or not overlap:
        return blocks
    if overlap == "async":
        return async_tp.decompose_blocks(blocks, t, e)
    return te_userbuffers.decompose_blocks(blocks, t)
