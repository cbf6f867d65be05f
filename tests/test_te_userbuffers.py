"""Transformer Engine's userbuffers TP overlap (tp_comm_overlap: true, workload/te_userbuffers.py): ring-exchange
chunks behind copy-engine copies, the pipelined reduce-scatter's 4 chunks with the last exposed, counted by hand."""

from dataclasses import replace

import pytest

from simulator import load_scenario
from simulator.costs.dispatch import gpu_times
from simulator.workload.ops import collective_op, gemm, memory_op
from simulator.workload.te_userbuffers import SPLITS, decompose
from simulator.workload.transformer import build_workload


class Fixed:
    """A compute model whose GEMMs take ``gemm_s`` each and other kernels ``other_s``."""

    def __init__(self, gemm_s: float, other_s: float = 1e-6):
        self.gemm_s, self.other_s = gemm_s, other_s

    def op_time_s(self, op):
        return self.gemm_s if op.kind == "gemm" else self.other_s


def test_ring_exchange_runs_the_gemm_in_tp_chunks_behind_the_copies():
    t = 8
    ag = collective_op("tp all-gather (attention input)", "all_gather", "tp", 64e6, "te")
    qkv = gemm("qkv projection", 4096, 3072, 8192, linear=True)
    ops = decompose((ag, qkv), t)
    chunks = [o for o in ops if o.kind == "gemm"]
    copies = [o for o in ops if o.kind == "collective"]
    assert len(chunks) == t and {c.m for c in chunks} == {512} and sum(c.flops for c in chunks) == qkv.flops
    assert all(c.collective == "send_recv" and c.bytes == 64e6 / t and c.overlaps == "next" for c in copies)
    # the local shard's chunk first, then each chunk behind the copy of the next shard; the last waits for none
    assert [o.kind for o in ops] == ["collective", "gemm"] * (t - 1) + ["gemm"]
    # exposed: what each copy outlasts its chunk by, (t - 1) times
    chunk_s, copy_s = 40e-6, 55e-6
    gpu, _ = gpu_times(ops, Fixed(chunk_s), lambda op: copy_s)
    assert sum(gpu) == pytest.approx(t * chunk_s + (t - 1) * (copy_s - chunk_s), rel=1e-12)


def test_pipelined_reduce_scatter_hides_all_but_the_last_chunk():
    proj = gemm("attention output projection", 4096, 8192, 1024, linear=True)
    rs = collective_op("tp reduce-scatter (attention output)", "reduce_scatter", "tp", 64e6, "te")
    ops = decompose((proj, rs), 8)
    assert [o.kind for o in ops] == ["gemm", "collective"] * SPLITS
    chunks, scatters = ops[0::2], ops[1::2]
    assert {c.n for c in chunks} == {8192 // SPLITS} and {c.m for c in chunks} == {4096}
    assert sum(c.flops for c in chunks) == proj.flops
    assert [s.overlaps for s in scatters] == ["next"] * (SPLITS - 1) + [""]
    # one userbuffers kernel: each rank loads its slice of the chunk from its 7 peers at once, 7/8 of the chunk
    # through its own NVLink ports in one step
    assert {(s.collective, s.bytes) for s in scatters} == {("send_recv", 64e6 / SPLITS * 7 / 8)}
    chunk_s, scatter_s = 38e-6, 66e-6
    gpu, _ = gpu_times(ops, Fixed(chunk_s), lambda op: scatter_s)
    # 3 scatters outlast the chunk beside them by 28 us each; the last runs alone
    expected = SPLITS * chunk_s + (SPLITS - 1) * (scatter_s - chunk_s) + scatter_s
    assert sum(gpu) == pytest.approx(expected, rel=1e-12)


def test_fp8_cast_runs_once_before_the_ring_and_a_lone_collective_blocks():
    ag = collective_op("tp all-gather (mlp input)", "all_gather", "tp", 32e6, "te")
    cast = memory_op("fp8 quantize (mlp input)", 1e6, "elementwise", 4096, 8192)
    up = gemm("mlp up projection", 4096, 7168, 8192, linear=True)
    ops = decompose((ag, cast, replace(up, dtype="fp8")), 4)
    assert ops[0] == cast and sum(1 for o in ops if o.kind == "gemm") == 4
    (alone,) = decompose((ag,), 4)
    assert alone.overlaps == ""
    gpu, _ = gpu_times((alone,), Fixed(1.0), lambda op: 7e-6)
    assert gpu == [7e-6]


def scenario(overlap):
    return load_scenario(
        {
            "framework": "megatron-core-2024",
            "model": {
                "num_layers": 2,
                "hidden_size": 8192,
                "num_attention_heads": 64,
                "seq_length": 4096,
                "vocab_size": 32000,
                "attention": "flash",
            },
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {"global_batch_size": 8, "micro_batch_size": 1, "precision": "bf16"},
            "parallelism": {"tensor_parallel": 8, "sequence_parallel": True, "tp_comm_overlap": overlap},
        }
    )


def test_the_layers_run_te_overlaps_and_megatrons_own_output_layer_gathers_blocking():
    w = build_workload(scenario(True))
    layer = w.layers[0]
    fwd = [o.name for o in layer.forward]
    assert sum("TE ring exchange chunk" in n for n in fwd) == 2 * 8  # QKV and MLP up, TP 8 chunks each
    assert sum("TE pipeline chunk" in n and "projection" in n for n in fwd) == 2 * SPLITS  # proj and MLP down
    bwd = layer.backward
    assert sum("TE ring exchange chunk" in o.name for o in bwd) == 2 * 8  # proj dgrad, MLP down dgrad
    # the input gradients' reduce-scatters beside the weight-gradient GEMM before them (TE's bulk overlap)
    scatters = [i for i, o in enumerate(bwd) if o.collective == "reduce_scatter"]
    assert len(scatters) == 2
    assert all(bwd[i].overlaps == "previous" and "wgrad" in bwd[i - 1].name for i in scatters)
    # the logits' all-gather is Megatron's ColumnParallelLinear's: a blocking NCCL call
    (gather,) = [o for o in w.head.forward if o.kind == "collective" and o.collective == "all_gather"]
    assert gather.overlaps == "te"
    gpu, _ = gpu_times((gather, gemm("logits", 4096, 4000, 8192)), Fixed(1.0), lambda op: 7e-6)
    assert gpu[0] == 7e-6  # not hidden behind the GEMM after it
    without = build_workload(scenario(False))
    assert sum(o.kind == "gemm" for o in without.layers[0].forward) == 4


def test_megatrons_sequence_parallel_layers_gather_their_input_again_beside_the_input_gradient_gemm():
    """megatron/core/tensor_parallel/layers.py (LinearWithGradAccumulationAndAsyncCommunication.backward) and TE's
    bulk all-gather beside qkv_dgrad / fc1_dgrad: the column-parallel input, s/t tokens kept, gathered again."""
    bwd = build_workload(scenario(True)).layers[0].backward
    again = [i for i, o in enumerate(bwd) if o.collective == "all_gather" and "TE" not in o.name]
    assert [bwd[i].name for i in again] == ["tp all-gather (mlp input)", "tp all-gather (attention input)"]
    for i in again:
        assert bwd[i].overlaps == "next" and bwd[i + 1].kind == "gemm" and "dgrad" in bwd[i + 1].name
        assert bwd[i].bytes == 2 * 4096 * 8192  # the whole s x h input, as the forward's gather
    # PyTorch's layers (DTensor) keep the gathered input: backward gathers only the output gradient
    torch = load_scenario({**scenario(False).model_dump(exclude_unset=True), "framework": "pytorch-2024"})
    gathers = [o.name for o in build_workload(torch).layers[0].backward if o.collective == "all_gather"]
    assert gathers == ["tp all-gather (mlp output gradient)", "tp all-gather (attention output gradient)"]


def test_deepspeed_zero3_hooks_between_a_copy_and_its_chunk_leave_the_copy_hidden():
    """DeepSpeed ZeRO-3's module hooks are host work placed before each GEMM (strategy/zero3_hooks.py): in TE's
    ring the hook lands between a copy and the chunk it hides behind. Host work runs no kernel, so the copy still
    hides behind the chunk, as without the hooks (it had become blocking: 1.8 s of a 175B ZeRO-3 layout)."""
    from types import SimpleNamespace

    from simulator.strategy.zero3_hooks import ModuleHooks

    class NoHost(Fixed):
        def op_time_s(self, op):
            return 0.0 if op.kind == "host" else super().op_time_s(op)

    t = 8
    ag = collective_op("tp all-gather (attention input)", "all_gather", "tp", 64e6, "te")
    ops = decompose((ag, gemm("qkv projection", 4096, 3072, 8192, linear=True)), t)
    block = ("layer", "forward")
    host = SimpleNamespace(zero3_module_forward_s=3e-4, zero3_module_backward_s=5e-4)
    hooked = ModuleHooks([SimpleNamespace(block=block, forward=True)], host)(block, ops)
    assert [o.kind for o in hooked][:3] == ["collective", "host", "gemm"] and len(hooked) == len(ops) + t
    chunk_s, copy_s = 40e-6, 55e-6
    plain, _ = gpu_times(ops, NoHost(chunk_s), lambda op: copy_s)
    with_hooks, _ = gpu_times(hooked, NoHost(chunk_s), lambda op: copy_s)
    assert sum(with_hooks) == pytest.approx(sum(plain), rel=1e-12)
    assert sum(plain) == pytest.approx(t * chunk_s + (t - 1) * (copy_s - chunk_s), rel=1e-12)
