"""ZeRO-Offload and ZeRO-Infinity: what moves off the GPU, what the copies cost on shared PCIe and NVMe links."""

import pytest
from conftest import make

from simulator import simulate
from simulator.costs.host import COPY_LAUNCH_S, HostModel, aio_bandwidth_Bps
from simulator.errors import ScenarioError

GPT_1B = {
    "num_layers": 24,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "seq_length": 1024,
    "vocab_size": 50304,
}
GPT_175B = {
    "num_layers": 96,
    "hidden_size": 12288,
    "num_attention_heads": 96,
    "seq_length": 2048,
    "vocab_size": 50304,
}


def run(stage=2, model=GPT_1B, cluster=None, training=None, **zero):
    return simulate(
        make(
            model=model,
            cluster=cluster,
            training={"global_batch_size": 8, "micro_batch_size": 1, **(training or {})},
            parallelism={"zero_stage": stage, "zero": zero},
        )
    )


def test_offload_moves_optimizer_states_and_gradients_to_host_memory():
    plain, off = run(), run(offload_optimizer={"device": "cpu"})
    psi, n = plain.workload.params_per_rank, 8
    m0, m1 = plain.program.ranks[0].memory, off.program.ranks[0].memory
    assert m0.optimizer == pytest.approx(12 * psi / n) and m1.optimizer == 0
    assert m0.grads == pytest.approx(2 * psi / n) and m1.grads == 0
    assert m1.params == m0.params  # 16-bit weights stay on the GPU (ZeRO-2)
    # every rank of the node keeps K = 12 bytes of states and a 4-byte fp32 gradient per parameter of its 1/N
    assert m1.host == pytest.approx(n * (12 + 4) * psi / n)
    assert off.metrics.memory_gib["host"] == pytest.approx(16 * psi / 2**30)
    assert off.metrics.memory_gib["optimizer"] == 0


def test_zero_infinity_keeps_states_and_shards_on_nvme():
    r = run(stage=3, offload_optimizer={"device": "nvme"}, offload_param={"device": "nvme"})
    psi = r.workload.params_per_rank
    mem = r.program.ranks[0].memory
    assert mem.nvme == pytest.approx((12 + 2) * psi)  # per node: every rank's states and 16-bit shard
    assert mem.optimizer == 0 and mem.grads == 0


def test_slow_pcie_makes_offload_slower_than_zero2_and_fast_pcie_shrinks_the_gap():
    def gap(pcie_GBps):
        cluster = {"pcie_bandwidth_GBps": pcie_GBps}
        plain = run(cluster=cluster).metrics.iteration_time_s
        off = run(
            cluster=cluster, offload_optimizer={"device": "cpu", "pin_memory": True}
        ).metrics.iteration_time_s
        return off, plain

    slow_off, slow_plain = gap(2.0)
    fast_off, fast_plain = gap(64.0)
    assert slow_off > slow_plain
    assert fast_off - fast_plain < 0.5 * (slow_off - slow_plain)
    assert fast_off >= fast_plain  # the CPU step still costs something


def test_a_model_out_of_memory_under_zero3_fits_with_zero_infinity():
    training = {"activation_recompute": "full"}
    z3 = run(stage=3, model=GPT_175B, training=training)
    inf = run(
        stage=3,
        model=GPT_175B,
        training=training,
        offload_optimizer={"device": "nvme"},
        offload_param={"device": "nvme"},
    )
    assert z3.metrics.oom and z3.metrics.memory_gib["peak"] > 300  # 16 bytes x 175 B / 8 GPUs = 350 GB
    assert not inf.metrics.oom and not inf.metrics.host_oom
    assert inf.metrics.memory_gib["peak"] < 40


def test_host_memory_has_its_own_out_of_memory_verdict():
    r = run(
        stage=3,
        model=GPT_175B,
        training={"activation_recompute": "full"},
        offload_optimizer={"device": "cpu"},
        offload_param={"device": "cpu"},
    )
    assert not r.metrics.oom
    assert r.metrics.host_oom  # 18 bytes x 175 B parameters > the node's 1 TiB
    assert r.metrics.memory_gib["host"] == pytest.approx(18 * r.workload.params_per_rank / 2**30)


def test_two_gpus_behind_one_pcie_switch_share_its_uplink():
    """DGX A100: each PCIe switch holds two GPUs, so copying S bytes from every GPU to host memory takes
    2 S / B_pcie on the switch's uplink (host memory, 4 GPUs per socket at ~164 GB/s, is not the bottleneck)."""
    r = run(offload_optimizer={"device": "cpu", "pin_memory": True})
    host = HostModel(r.comm, r.scenario)
    S = 1e9
    (phase,) = host.phases("d2h", "host", S)
    pcie = r.cluster.link_info((0, "pcie0", "cpu0")).bandwidth_Bps
    _, latency = r.cluster.local_route(0, "gpu0", "hostmem")
    assert phase.duration_s == pytest.approx(latency + COPY_LAUNCH_S + 2 * S / pcie)
    # pageable memory stages the copy through a pinned buffer: two more passes over host memory
    unpinned = HostModel(r.comm, run(offload_optimizer={"device": "cpu"}).scenario).phases("d2h", "host", S)[
        0
    ]
    assert max(unpinned.demand_s.values()) >= max(phase.demand_s.values())


def test_aio_queue_bounds_nvme_bandwidth_by_littles_law():
    drive = 5.4e9
    assert aio_bandwidth_Bps(2**20, 8, 1, 80e-6, drive) == pytest.approx(8 * 2**20 / (80e-6 + 2**20 / drive))
    assert aio_bandwidth_Bps(2**20, 8, 1, 80e-6, drive) > drive  # DeepSpeed's defaults saturate a drive
    assert aio_bandwidth_Bps(65536, 1, 1, 80e-6, drive) < 0.2 * drive
    inf = {"offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "nvme"}}
    shallow = run(stage=3, aio={"block_size": 65536, "queue_depth": 1}, **inf).metrics.iteration_time_s
    assert shallow > 1.5 * run(stage=3, **inf).metrics.iteration_time_s


def test_param_offload_fetches_each_shard_before_its_all_gather():
    r = run(stage=3, offload_param={"device": "cpu"}, stage3_max_reuse_distance=0)
    tasks = r.program.tasks
    fetched = sum(t.bytes for t in tasks if t.kind == "h2d")
    gathered = sum(t.bytes for t in tasks if t.kind == "all_gather")
    assert fetched == pytest.approx(gathered / 8)  # each rank fetches its 1/8 of every gathered unit
    for t in tasks:
        if t.kind == "all_gather":
            assert any(tasks[d].kind == "h2d" for d in t.deps)


def test_delayed_parameter_update_hides_the_cpu_step_under_the_next_iteration():
    off = run(offload_optimizer={"device": "cpu"})
    dpu = run(offload_optimizer={"device": "cpu", "delayed_param_update": True})
    assert dpu.metrics.iteration_time_s < off.metrics.iteration_time_s
    tl = dpu.timeline
    steps = [t for t in dpu.program.tasks if t.kind == "cpu_optimizer"]
    forwards = [t for t in dpu.program.tasks if t.kind == "forward"]
    # some CPU step runs while the GPU computes a later iteration's forward
    assert any(
        tl.start[f.id] < tl.end[c.id] and tl.end[f.id] > tl.start[c.id] and f.id > c.id
        for c in steps
        for f in forwards
    )


def test_offload_settings_are_checked():
    with pytest.raises(ScenarioError, match="offload_param.device .* needs zero_stage: 3"):
        run(stage=2, offload_param={"device": "cpu"})
    with pytest.raises(ScenarioError, match="no NVMe drives"):
        run(stage=3, cluster={"nvme_drives": 0}, offload_param={"device": "nvme"})


def checkpointing(**training):
    return simulate(
        make(
            model=GPT_1B,
            training={
                "global_batch_size": 8,
                "micro_batch_size": 2,
                "activation_recompute": "full",
                **training,
            },
            parallelism={"tensor_parallel": 4},
        )
    )


def test_partition_activations_splits_checkpoints_over_tensor_parallel_ranks():
    plain, part = checkpointing(), checkpointing(partition_activations=True)
    s, b, h, layers, t = 1024, 2, 2048, 24, 4
    per_layer = 2 * s * b * h  # full recompute keeps the 16-bit layer input (Korthikanti Sec. 5)
    saved = plain.program.ranks[0].memory.activations - part.program.ranks[0].memory.activations
    assert saved == pytest.approx(layers * per_layer * (1 - 1 / t))
    # the recompute first re-gathers the checkpoint over the tensor-parallel group
    gathers = [op for op in part.workload.layer.recompute_full if op.name.startswith("checkpoint all-gather")]
    assert [(op.collective, op.group, op.bytes) for op in gathers] == [("all_gather", "tp", per_layer)]


def test_cpu_checkpointing_moves_checkpoints_to_host_memory_over_pcie():
    part = checkpointing(partition_activations=True)
    cpu = checkpointing(partition_activations=True, cpu_checkpointing=True)
    ckpt = 2 * 1024 * 2 * 2048 / 4
    m0, m1 = part.program.ranks[0].memory, cpu.program.ranks[0].memory
    assert m0.activations - m1.activations == pytest.approx(24 * ckpt)
    assert m1.host == pytest.approx(24 * ckpt * 8)  # every GPU of the node
    copies, gas = cpu.metrics.comm_by_collective, cpu.scenario.gradient_accumulation_steps
    assert gas == 2  # 8 samples / (2 per microbatch x 2 data-parallel ranks)
    assert copies["d2h_pageable:host"]["bytes_pcie_per_gpu"] == pytest.approx(24 * ckpt * gas)
    assert copies["h2d_pageable:host"]["bytes_pcie_per_gpu"] == pytest.approx(24 * ckpt * gas)
    assert cpu.metrics.iteration_time_s > part.metrics.iteration_time_s


def test_cpu_checkpoints_are_synchronous_pageable_copies():
    """DeepSpeed's CheckpointFunction copies the layer input to pageable host memory (``partition.cpu()``) before
    the layer runs and back (``copy_`` into a fresh device buffer) before the recomputation: both staged by the
    driver (three passes over host memory, against one for a pinned copy) and neither hidden under a kernel."""
    part = checkpointing(partition_activations=True)
    cpu = checkpointing(partition_activations=True, cpu_checkpointing=True)
    fwd, recompute = cpu.workload.layer.forward, cpu.workload.layer.recompute_full
    assert (fwd[0].name, fwd[0].collective, fwd[0].overlaps) == ("checkpoint to host", "d2h_pageable", "")
    assert recompute[0].collective == "h2d_pageable"
    assert not any(op.name.startswith("checkpoint") for op in recompute[1:] if op.kind != "collective")
    # pageable whatever the offload buffers are: here ZeRO-Offload's are pinned
    offload = run(offload_optimizer={"device": "cpu", "pin_memory": True})
    host = HostModel(offload.comm, offload.scenario)

    def hostmem(phase):
        return sum(d for c, d in phase.demand_s.items() if "hostmem" in c[1:])

    for kind in ("d2h", "h2d"):
        (pinned,) = host.phases(kind, "host", 1e9)
        (pageable,) = host.phases(f"{kind}_pageable", "host", 1e9)
        assert hostmem(pageable) == pytest.approx(3 * hostmem(pinned))
    # every layer's forward is longer by its copy out, alone on its links
    copy_s = cpu.op_comm_time_s(fwd[0])
    layer = [t for t in cpu.program.tasks if t.kind == "forward" and t.name.startswith("layer")]
    plain = [t for t in part.program.tasks if t.kind == "forward" and t.name.startswith("layer")]
    grown = (cpu.timeline.busy[layer[0].id] - part.timeline.busy[plain[0].id]) / copy_s
    assert grown == pytest.approx(1.0, rel=1e-6)


def test_offload_copies_and_gpudirect_traffic_share_the_pcie_switch():
    """Across nodes NCCL reaches the NIC through the GPU's PCIe switch, as the offload copies do: the two use
    the same link classes, so the engine slows them down when they overlap."""
    r = run(cluster={"num_nodes": 2}, training={"global_batch_size": 16}, offload_optimizer={"device": "cpu"})
    (copy,) = HostModel(r.comm, r.scenario).phases("d2h", "host", 1e9)
    ring = r.comm.phases("reduce_scatter", "dp", 1e9)
    shared = set(copy.demand_s) & {c for p in ring for c in p.demand_s}
    assert any(c[1].startswith("gpu") and c[2].startswith("pcie") for c in shared)


def test_pin_memory_follows_the_buffers_a_copy_uses():
    """ZeRO-2 offload uploads updated weights from the optimizer's buffers, so offload_optimizer.pin_memory
    decides whether that copy is staged (two more passes over host memory); offload_param's does not."""

    def hostmem_demand(**zero):
        r = run(**zero)
        (phase,) = HostModel(r.comm, r.scenario).phases("h2d", "host", 1e9)
        return sum(d for c, d in phase.demand_s.items() if "hostmem" in c[1:])

    pinned = hostmem_demand(offload_optimizer={"device": "cpu", "pin_memory": True})
    staged = hostmem_demand(offload_optimizer={"device": "cpu", "pin_memory": False})
    assert staged == pytest.approx(3 * pinned)
