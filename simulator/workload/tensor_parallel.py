"""Tensor parallelism's collectives (Narayanan et al. SC21 Sec. 3.2, Fig. 5): the column-parallel input needs
the full activation (identity forward, all-reduce of its gradient backward), the row-parallel output is
all-reduced forward. Sequence parallelism (Korthikanti et al. Sec. 4.2.2) turns each all-reduce into an
all-gather before and a reduce-scatter after, so the norms and dropouts between them work on s/t tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from simulator.workload import async_tp, te_userbuffers
from simulator.workload.ops import collective_op

if TYPE_CHECKING:
    from simulator.frameworks import Framework
    from simulator.scenario.parallelism import ParallelismConfig


class TPCollectives(NamedTuple):
    """Factories (name -> Op or None) of the tensor-parallel collectives around a column- then row-parallel pair."""

    gather_in: Callable  # before the column-parallel forward (SP: all-gather)
    scatter_out: Callable  # after the row-parallel forward (all-reduce; SP: reduce-scatter)
    grad_in: Callable  # the column-parallel input gradient (all-reduce; SP: reduce-scatter)
    grad_out: Callable  # the row-parallel output gradient (SP: all-gather)
    regather: Callable  # SP in Megatron's and TE's layers: the column-parallel input again, for its wgrad


def tp_collectives(t: int, p: ParallelismConfig, nbytes: float, fw: Framework) -> TPCollectives:
    """The tensor-parallel collectives around a column- then row-parallel pair of ``t`` ranks (``p``: the
    scenario's parallelism, ``fw``: the framework profile), ``nbytes`` each; each factory returns None where its
    collective does not exist. With ``p.tp_comm_overlap`` (Megatron-Core --tp-comm-overlap, Transformer Engine
    userbuffers) an all-gather runs alongside the GEMM after it and a reduce-scatter alongside the GEMM before it,
    chunked as workload/te_userbuffers.py says. With ``fw.overlap_tp_grad_allreduce`` the column-parallel input
    gradient's all-reduce runs alongside the weight-gradient GEMM issued after it (Megatron's
    async_tensor_model_parallel_allreduce). In Megatron's and TE's layers (``fw.modules`` megatron) with sequence
    parallelism the column-parallel layer keeps only its s/t-token input shard for backward and gathers it again
    beside the input-gradient GEMM
    (megatron/core/tensor_parallel/layers.py, LinearWithGradAccumulationAndAsyncCommunication.backward:
    ``dist_all_gather_func(..., async_op=True)`` before ``grad_output.matmul(weight)``, waited on before the
    weight gradient; Transformer Engine's layernorm_linear.py the same, as userbuffers' bulk all-gather beside
    qkv_dgrad / fc1_dgrad). PyTorch's DTensor keeps the gathered input instead (torchtitan's layers gather once)."""

    sequence_parallel, overlap = p.sequence_parallel, p.tp_comm_overlap
    async_grad, regathers = fw.overlap_tp_grad_allreduce, fw.modules == "megatron"

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
        again = make("all_gather", "backward") if regathers else make(None)
        return TPCollectives(
            make("all_gather"),
            make("reduce_scatter"),
            make("reduce_scatter", "backward"),
            make("all_gather", "backward"),
            lambda name: (op := again(name)) and replace(op, overlaps="next"),  # beside the dgrad GEMM
        )
    return TPCollectives(
        make(None),
        make("all_reduce"),
        make("all_reduce", "backward", "previous" if async_grad else ""),
        make(None),
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
