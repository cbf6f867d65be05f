"""GPU memory outside the program's tensors: the CUDA context, NCCL's buffers, the caching allocator's reserve
(simulator/strategy/runtime_memory.py, docs/memory.md)."""

import pytest
from conftest import make

from simulator import simulate
from simulator.frameworks import get_framework
from simulator.workload.memory import NCCL_CONNECTION_BYTES, MemoryBreakdown, nccl_buffer_bytes

MIB, GIB = 2**20, 2**30


def test_nccl_buffers_are_its_three_protocol_fifos_per_channel_and_communicator():
    """NCCL's defaults (src/init.cc, src/include/device.h): LL 8 lines x 512 threads x 8 steps x 16 B = 512 KiB,
    LL128 120 x 640 x 8 x 8 B = 4.6875 MiB, Simple 4 MiB: 9.1875 MiB per connection and channel."""
    assert NCCL_CONNECTION_BYTES == 524_288 + 4_915_200 + 4_194_304 == 9.1875 * MIB
    assert nccl_buffer_bytes(3, 16) == 3 * 16 * 9.1875 * MIB


def test_the_device_total_is_the_reserve_plus_context_plus_nccl_and_decides_oom():
    m = MemoryBreakdown(
        10 * GIB, 0, 0, 60 * GIB, 0, 80 * GIB, context=1 * GIB, nccl=0.5 * GIB, fragmentation=0.1
    )
    assert m.peak == 70 * GIB
    assert m.device == pytest.approx(70 * 1.1 * GIB + 1.5 * GIB)  # 78.5 GiB: fits
    assert not m.oom
    tight = MemoryBreakdown(
        10 * GIB, 0, 0, 60 * GIB, 0, 80 * GIB, context=1 * GIB, nccl=0.5 * GIB, fragmentation=0.15
    )
    assert tight.peak < tight.capacity < tight.device and tight.oom  # 82 GiB
    assert tight.gib()["device"] == pytest.approx(70 * 1.15 + 1.5)


def three_d(tied: bool, **memory):
    s = make(
        model={
            "num_layers": 6,
            "hidden_size": 512,
            "num_attention_heads": 8,
            "seq_length": 256,
            "vocab_size": 1024,
            "tied_embeddings": tied,
        },
        training={"global_batch_size": 16},
        parallelism={
            "tensor_parallel": 2,
            "pipeline_parallel": 3,
            "data_parallel": 1,
            "pipeline_schedule": "1f1b",
        },
        cluster={"gpus_per_node": 6},
    )
    if memory:
        s = s.model_copy(update={"memory": s.memory.model_copy(update=memory)})
    return simulate(s)


def test_each_stage_pays_for_its_own_communicators():
    """TP 2 x PP 3: every rank runs tensor-parallel collectives (one communicator); pipeline transfers need one
    communicator per neighbour (PyTorch's send / recv pair keys), so the middle stage two; with tied embeddings the
    first and last stage share a third for the embedding's gradient."""
    per = 16 * NCCL_CONNECTION_BYTES  # default 16 channels
    untied = [r.memory.nccl / per for r in three_d(False).program.ranks]
    tied = [r.memory.nccl / per for r in three_d(True).program.ranks]
    assert untied == [2, 3, 2]
    assert tied == [3, 3, 3]


def test_context_and_channels_are_settings_and_the_framework_knows_its_cuda():
    r = three_d(False, cuda_context_gib=1.5, nccl_channels=4, allocator_fragmentation=0.2)
    first = r.program.ranks[0].memory
    assert first.context == 1.5 * GIB
    assert first.nccl == 2 * 4 * NCCL_CONNECTION_BYTES
    assert first.device == pytest.approx(first.peak * 1.2 + 1.5 * GIB + 8 * NCCL_CONNECTION_BYTES)
    assert r.metrics.memory_gib["device"] == pytest.approx(
        max(x.memory.device for x in r.program.ranks) / GIB
    )
    # lazy module loading (CUDA 11.7+, PyTorch 1.13+) against every kernel loaded at start (pytorch/pytorch#86509)
    assert get_framework("pytorch-2024").cuda_context_gib == 0.4
    assert get_framework("megatron-2022").cuda_context_gib == 0.62


def test_a_run_whose_allocation_fits_can_still_be_out_of_memory():
    """The quickstart allocates about 40 GiB of 80 (PyTorch DDP's buckets included); with a 16 GiB context and the allocator reserving twice its
    peak the GPU would hold more than 80: out of memory, with the numbers in the metrics."""
    from simulator import load_scenario
    from simulator.scenario.shipped import shipped_scenarios

    s = load_scenario(shipped_scenarios()["quickstart-gpt3-1.3b-ddp-8xa100"])
    ok = simulate(s).metrics
    assert not ok.oom and ok.memory_gib["device"] < 42
    big = s.model_copy(
        update={
            "memory": s.memory.model_copy(update={"cuda_context_gib": 16, "allocator_fragmentation": 1.0})
        }
    )
    m = simulate(big).metrics
    assert m.memory_gib["peak"] == pytest.approx(ok.memory_gib["peak"])
    assert m.oom and m.memory_gib["device"] == pytest.approx(
        2 * m.memory_gib["peak"] + 16 + m.memory_gib["nccl"]
    )
