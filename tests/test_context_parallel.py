"""Context parallelism: ring attention splits the sequence, exchanges K/V around the CP group, hides the
exchange behind attention, and the CP ranks join the gradient reduction."""

import pytest
from conftest import make

from simulator import simulate
from simulator.costs.collectives import ring_bytes_per_rank
from simulator.errors import ScenarioError

MODEL = {
    "num_layers": 2,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_query_groups": 8,
    "seq_length": 32768,
    "vocab_size": 32000,
    "attention": "flash",
}


def run(cp: int, **cluster):
    return simulate(
        make(
            model=MODEL,
            cluster={"gpus_per_node": cp, **cluster},
            training={"global_batch_size": 1, "micro_batch_size": 1},
            parallelism={"context_parallel": cp, "data_parallel": 1},
        )
    )


def attention(r, name="flash attention"):
    return next(op for op in r.workload.layer.forward if op.name == name)


def test_each_cp_rank_does_one_cp_th_of_the_attention_and_of_the_gemms():
    one, four = run(1), run(4)
    assert attention(four).flops == pytest.approx(attention(one).flops / 4)
    qkv = {op.name: op for op in four.workload.layer.forward}["qkv projection"]
    assert qkv.m == 32768 // 4


def test_kv_exchange_moves_cp_minus_1_blocks_of_k_and_v_per_rank():
    r = run(4)
    kv = next(op for op in r.workload.layer.forward if op.group == "cp")
    block = 2 * 1 * (32768 // 4) * 8 * 128 * 2  # K and V of one rank's tokens: 2 x b x s/cp x g x d x 2 bytes
    assert ring_bytes_per_rank(kv.collective, 4, kv.bytes) == pytest.approx(3 * block)


def test_kv_exchange_hides_behind_attention_on_nvlink_and_shows_on_a_slow_network():
    fast = run(2).metrics.comm_by_collective["all_gather:cp"]
    assert fast["exposed_s"] == pytest.approx(0.0, abs=1e-12) and fast["time_s"] > 0
    slow = simulate(
        make(
            model=MODEL,
            cluster={"topology": "ethernet-2node", "num_nodes": 2, "nic_bandwidth_gbps": 1},
            training={"global_batch_size": 1, "micro_batch_size": 1},
            parallelism={"context_parallel": 2, "data_parallel": 1},
        )
    ).metrics
    assert (
        slow.comm_by_collective["all_gather:cp"]["exposed_s"]
        > 0.5 * slow.comm_by_collective["all_gather:cp"]["time_s"]
    )


def test_cp_ranks_join_the_gradient_reduction():
    r = simulate(
        make(
            model=MODEL,
            cluster={"gpus_per_node": 8},
            training={"global_batch_size": 4, "micro_batch_size": 1},
            parallelism={"context_parallel": 2, "data_parallel": 4},
        )
    )
    assert "all_reduce:dp+cp" in r.metrics.comm_by_collective
    assert r.placement.group_size("dp+cp") == 8


@pytest.mark.parametrize(
    "model,message",
    [
        ({**MODEL, "attention": "standard"}, "context_parallel (2) needs model.attention: flash"),
        (
            {**MODEL, "seq_length": 30},
            "model.seq_length (30) is not divisible by 2 x context_parallel (2) = 4",
        ),
    ],
)
def test_invalid_context_parallel_inputs(model, message):
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make(
            model=model,
            cluster={"gpus_per_node": 2},
            training={"global_batch_size": 1},
            parallelism={"context_parallel": 2, "data_parallel": 1},
        )


@pytest.mark.parametrize(
    "par",
    [
        {"context_parallel": 2, "data_parallel": 4},
        {"context_parallel": 2, "data_parallel": 4, "fsdp": {}},
        {"context_parallel": 2, "data_parallel": 4, "zero_stage": 3},
        {"context_parallel": 2, "pipeline_parallel": 2, "data_parallel": 2},
    ],
)
def test_simulated_ranks_stand_for_exactly_the_gpus_of_the_job(par):
    """Each simulated rank stands for every TP x CP x DP rank of its stage: counts add up to the GPUs, and the
    model FLOPs reported per GPU add up to the job's (they doubled with CP before)."""
    r = simulate(
        make(
            model={**MODEL, "num_layers": 4},
            cluster={"gpus_per_node": 8},
            training={"global_batch_size": 8, "micro_batch_size": 1},
            parallelism=par,
        )
    )
    assert sum(rc.count for rc in r.program.ranks) == r.placement.world_size == 8
    m = r.metrics
    job = r.workload.model_flops_per_microbatch * 2 * 8  # per CP rank x 2 CP ranks x 8 microbatches in all
    assert m.model_tflops_per_gpu * 1e12 * m.iteration_time_s * 8 == pytest.approx(job, rel=1e-9)


def run_torch(cp: int):
    """MODEL under the pytorch-2024 profile, whose ring attention is torch 2.6's (context_parallel: torch)."""
    return simulate(
        make(
            framework="pytorch-2024",
            model=MODEL,
            cluster={"gpus_per_node": cp},
            training={"global_batch_size": 1, "micro_batch_size": 1},
            parallelism={"context_parallel": cp, "data_parallel": 1},
        )
    )


def test_torchs_ring_adds_its_fp32_merges_and_moves_k_v_repeated_to_the_query_heads():
    """torch 2.6's ring merges each step's output in fp32 and sums gradients in fp32 as eager ops beside the flash
    kernels (cp_merge_bytes); Megatron-Core's (Transformer Engine) folds them into its kernels. torchtitan repeats
    K / V to the query heads before SDPA, so the ring moves 32 heads' K / V, not the 8 groups'."""
    from simulator.workload.attention import cp_merge_bytes

    torch_ring, fused = run_torch(4), run(4)
    fwd = {op.name: op for op in torch_ring.workload.layer.forward}
    bwd = {op.name: op for op in torch_ring.workload.layer.backward}
    out = 1 * (32768 // 4) * 32 * 128  # this rank's output (= its queries) elements
    f, b = cp_merge_bytes(4, out, out, 2 * out, 2)
    assert fwd["cp ring merges (fp32, eager)"].bytes == pytest.approx(f)
    assert bwd["cp ring gradient sums (fp32, eager)"].bytes == pytest.approx(b)
    assert not any("merges" in op.name for op in fused.workload.layer.forward)
    kv = {op.name: op for op in fused.workload.layer.forward}["cp ring K/V exchange"]
    assert fwd["cp K/V all-gather (ring step 0)"].bytes == pytest.approx(4 * kv.bytes)  # 32 heads / 8 groups
    assert torch_ring.metrics.iteration_time_s > run_torch(1).metrics.iteration_time_s / 4


def test_cp_merge_bytes_equal_what_torchs_ring_code_moves():
    """Every byte the eager ops of torch 2.6's ring attention read and write (counted by a dispatch mode on
    benchmarks/cp_attention.py's replay of _templated_ring_attention and its backward, averaged over ranks; the
    flash kernels and NCCL's buffers left out) equals cp_merge_bytes within the small lse terms it leaves out."""
    torch = pytest.importorskip("torch")
    import sys
    from pathlib import Path

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from simulator.workload.attention import cp_merge_bytes

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    if not (bench / "cp_attention.py").exists():
        pytest.skip("benchmarks/ not in this checkout")
    sys.path.insert(0, str(bench))
    import cp_attention

    aten = torch.ops.aten
    kernels = {
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    }
    unwritten = {aten.empty_like.default, aten.empty.memory_format, aten.empty_strided.default}

    class Bytes(TorchDispatchMode):
        moved = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in kernels or func in unwritten:
                return out
            outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if func is aten.zeros_like.default:
                ins = []
            storages = {i.untyped_storage().data_ptr() for i in ins}
            if not func._schema.is_mutable and all(o.untyped_storage().data_ptr() in storages for o in outs):
                return out  # a view of an input: nothing moves
            self.moved += sum(t.numel() * t.element_size() for t in ins + outs)
            return out

    b, h, t, d = 1, 2, 64, 128
    op = cp_attention.Flash("cpu")
    for n in (2, 4, 8):
        fwd = bwd = 0
        for rank in range(n):
            q, k, v = (torch.randn(b, h, t, d, dtype=torch.bfloat16) for _ in range(3))
            with Bytes() as count:
                out, lse = cp_attention.ring_forward(
                    op, q, cp_attention.gathered_kv(k, v, n, fill=False), rank, n
                )
            fwd += count.moved
            dout = torch.randn_like(out)
            with Bytes() as count:
                kv_at = cp_attention.gathered_kv(k, v, n, fill=False)
                cp_attention.ring_backward(op, dout, q, kv_at, out, lse, rank, n)
            bwd += count.moved
        elems = b * h * t * d
        f, bw = cp_merge_bytes(n, elems, elems, 2 * elems, 2)
        assert fwd / n == pytest.approx(f, rel=0.02)
        assert bwd / n == pytest.approx(bw, rel=0.02)


def test_ring_replay_equals_causal_attention():
    """benchmarks/cp_attention.py's replay of torch's load-balanced ring (what the merges above are counted on)
    computes causal attention: every rank's merged output and dQ equal full attention's on its tokens."""
    pytest.importorskip("torch")
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    if not (bench / "cp_attention.py").exists():
        pytest.skip("benchmarks/ not in this checkout")
    sys.path.insert(0, str(bench))
    import cp_attention

    cp_attention.check()


def test_torchs_all_gather_rotater_hides_behind_step_0_only_and_its_last_fp32_gradient_exchange_is_exposed():
    """torch's ring (v2.6.0+, _AllGatherRotater by default): the K/V all-gather issued at step 0 is waited for at
    step 1, so it hides behind one step's kernel (1/n of the work under load balancing), not the whole ring; the
    backward's dK / dV go round in fp32 after each step, hidden behind the next step's kernel, the last one not.
    Priced here at 1 s per TFLOP and 1 s per GB, every exposure is a hand count."""
    from types import SimpleNamespace

    from simulator.costs.dispatch import gpu_times
    from simulator.workload.attention import attention_ops
    from simulator.workload.shape import layer_shape

    n = 4
    s = make(
        framework="pytorch-2024",
        model=MODEL,
        cluster={"gpus_per_node": n},
        training={"global_batch_size": 1, "micro_batch_size": 1},
        parallelism={"context_parallel": n, "data_parallel": 1},
    )
    fwd, bwd = attention_ops(s, layer_shape(s), "torch")
    flash_f = [op for op in fwd if op.kind == "flash_attention"]
    assert [op.flops / sum(o.flops for o in flash_f) for op in flash_f] == pytest.approx([1 / n, 1 - 1 / n])
    kv = 2 * 32768 * 32 * (128 + 128)  # every rank's K and V, bf16, K / V repeated to the 32 query heads
    gather = next(op for op in fwd if op.kind == "collective")
    assert gather.collective == "all_gather" and gather.bytes == kv
    exchanges = [op for op in bwd if op.collective == "send_recv"]
    step = kv / n * 4 / 2  # this rank's dK, dV in fp32
    assert [op.bytes for op in exchanges] == pytest.approx([(n - 1) * step, step])

    compute = SimpleNamespace(op_time_s=lambda op: op.flops / 1e12 if op.kind != "memory" else 0.0)
    seconds, _ = gpu_times(fwd, compute, lambda op: op.bytes / 1e9)
    t_step0 = flash_f[0].flops / 1e12
    exposed = [g for g, op in zip(seconds, fwd, strict=True) if op.kind == "collective"][0]
    assert exposed == pytest.approx(max(0.0, kv / 1e9 - t_step0))
    seconds, _ = gpu_times(bwd, compute, lambda op: op.bytes / 1e9)
    flash_b = [op for op in bwd if op.kind == "flash_attention"]
    rest = flash_b[1].flops / 1e12
    by_name = {op.name: g for g, op in zip(seconds, bwd, strict=True) if op.kind == "collective"}
    assert by_name["cp ring dK/dV exchanges"] == pytest.approx(max(0.0, (n - 1) * step / 1e9 - rest))
    assert by_name["cp ring dK/dV exchange (last)"] == pytest.approx(step / 1e9)
