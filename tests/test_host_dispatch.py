"""The host thread: kernels start when the GPU is free and the host has issued them (closed forms), syncs,
CUDA graphs, the per-layer view, and the realistic default profiles."""

import pytest
from conftest import make

from simulator.api import simulate
from simulator.costs.collectives import Phase
from simulator.costs.dispatch import task_cost
from simulator.engine.engine import simulate_program
from simulator.frameworks import HostProfile, Syncs, get_framework
from simulator.metrics.layers import microbatch_view
from simulator.program import Program
from simulator.workload.ops import Op, sync_op


class FixedGpu:
    """A compute model where every kernel takes ``g`` seconds."""

    def __init__(self, g: float):
        self.g = g

    def op_time_s(self, op: Op) -> float:
        return 0.0 if op.kind in ("host", "sync") else self.g


def kernels(n: int, direction: str = "forward") -> tuple[Op, ...]:
    return tuple(Op(f"k{i}", "memory", bytes=1.0, direction=direction) for i in range(n))


def run(tasks, g: float, host: HostProfile, cuda_graphs: bool = False):
    """One rank's compute stream: ``tasks`` = [(ops, sync)]; returns the timeline."""
    p = Program("test")
    for i, (ops, sync) in enumerate(tasks):
        p.add_compute(0, "forward", "forward", f"t{i}", (), ops, -1, sync)
    gpu = FixedGpu(g)
    return simulate_program(
        p, lambda t: task_cost(t.ops, gpu, lambda op: 0.0, host, cuda_graphs), lambda t: ()
    )


def test_host_bound_kernels_end_one_kernel_after_the_host_issued_the_last():
    c, g, n = 20e-6, 5e-6, 10
    tl = run([(kernels(n), False)], g, HostProfile(forward_kernel_s=c))
    assert tl.end[0] == pytest.approx(n * c + g, rel=1e-12)
    assert tl.start[0] == pytest.approx(c, rel=1e-12)
    assert tl.host_idle[0] == pytest.approx(n * c + g - n * g, rel=1e-12)  # GPU idle while the host issued


def test_gpu_bound_kernels_queue_behind_the_first_issue():
    c, g, n = 5e-6, 20e-6, 10
    tl = run([(kernels(n), False)], g, HostProfile(forward_kernel_s=c))
    assert tl.end[0] == pytest.approx(c + n * g, rel=1e-12)


def test_the_host_runs_ahead_across_steps_and_a_sync_makes_it_wait_for_the_gpu():
    """Two GPU-bound steps of n kernels: the second step's kernels were issued while the first ran, so it
    follows without a gap; with a sync before it, the host first waits for the GPU and then issues its first
    kernel while the GPU idles (one issue time lost)."""
    c, g, n = 5e-6, 20e-6, 10
    host = HostProfile(forward_kernel_s=c)
    ahead = run([(kernels(n), False), (kernels(n), False)], g, host)
    assert ahead.end[1] == pytest.approx(c + 2 * n * g, rel=1e-12)
    synced = run([(kernels(n), False), (kernels(n), True)], g, host)
    assert synced.end[1] == pytest.approx(c + n * g + c + n * g, rel=1e-12)


def test_a_sync_inside_a_step_restarts_it_from_an_idle_gpu():
    """[k1..k3, sync, k4..k6] with GPU-bound kernels: the host waits for k3, pays the sync's latency, then
    issues k4 while the GPU idles."""
    c, g, sync_s = 5e-6, 20e-6, 7e-6
    ops = (*kernels(3), sync_op("sync", sync_s), *kernels(3))
    tl = run([(ops, False)], g, HostProfile(forward_kernel_s=c))
    first = c + 3 * g
    assert tl.end[0] == pytest.approx(first + sync_s + c + 3 * g, rel=1e-12)


def test_cuda_graphs_issue_a_whole_step_with_one_launch():
    c, g, n, launch = 20e-6, 5e-6, 10, 15e-6
    host = HostProfile(forward_kernel_s=c, graph_launch_s=launch)
    tl = run([(kernels(n), False)], g, host, cuda_graphs=True)
    assert tl.end[0] == pytest.approx(launch + n * g, rel=1e-12)


def test_backward_kernels_cost_the_backward_issue_time():
    c_f, c_b, g, n = 10e-6, 30e-6, 1e-6, 8
    tl = run([(kernels(n, "backward"), False)], g, HostProfile(forward_kernel_s=c_f, backward_kernel_s=c_b))
    assert tl.end[0] == pytest.approx(n * c_b + g, rel=1e-12)


SMALL = {"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "seq_length": 512, "vocab_size": 8192}


def test_a_small_model_on_an_eager_framework_is_host_bound_and_the_ideal_one_is_not():
    kw = {"model": SMALL, "cluster": {"gpus_per_node": 1}, "training": {"global_batch_size": 4}}
    eager = simulate(make(**kw, framework="megatron-2022"))
    ideal = simulate(make(**kw, framework="ideal"))
    assert eager.metrics.host["gpu_busy_fraction"] < 0.6
    assert eager.metrics.host["host_bound_idle_s"] > 0.3 * eager.metrics.iteration_time_s
    assert ideal.metrics.host["host_bound_idle_s"] == 0.0
    assert eager.metrics.iteration_time_s > 1.5 * ideal.metrics.iteration_time_s


def test_the_per_layer_view_adds_up_each_layers_kernels():
    """Per layer, GPU busy is the sum of the layer's kernel times (forward; recompute and backward), and the
    ideal profile never waits for the host."""
    r = simulate(make(model=SMALL, cluster={"gpus_per_node": 1}, training={"activation_recompute": "full"}))
    rows = {(x.block, x.phase): x for x in microbatch_view(r)}
    layer = r.workload.layer
    fwd = sum(r.compute.op_time_s(op) for op in layer.forward if op.kind != "collective")
    assert rows[("layer", "forward")].gpu_busy_s == pytest.approx(fwd, rel=1e-9)
    assert rows[("layer", "recompute")].gpu_busy_s == pytest.approx(fwd, rel=1e-9)
    assert all(x.host_bound_idle_s == 0.0 for x in rows.values())


def test_full_recompute_counts_as_hardware_flops_only_on_the_pipeline_path_too():
    """MFU counts the model's FLOPs once; HFU adds the recompute forward. On a pipeline with full recompute,
    HFU / MFU = 1 + (layers' forward FLOPs) / (3 x the whole model's forward FLOPs), and the model FLOP/s equal
    those of the same model and tokens without a pipeline."""
    kw = {
        "model": {**SMALL, "num_layers": 8},
        "training": {"activation_recompute": "full", "global_batch_size": 8},
    }
    pipe = simulate(make(**kw, parallelism={"pipeline_parallel": 2, "data_parallel": 4}))
    w = pipe.workload
    fwd_layers = w.num_layers * w.layer.forward_model_flops
    fwd_all = fwd_layers + w.head.forward_model_flops
    m = pipe.metrics
    assert m.hfu / m.mfu == pytest.approx(1 + fwd_layers / (3 * fwd_all), rel=1e-9)
    flat = simulate(make(**kw, parallelism={"data_parallel": 8}))
    per_token = m.model_tflops_per_gpu * m.iteration_time_s
    assert per_token == pytest.approx(
        flat.metrics.model_tflops_per_gpu * flat.metrics.iteration_time_s, rel=1e-9
    )


def test_scenarios_without_a_framework_get_the_realistic_profile_of_their_stack():
    base = {"model": SMALL, "framework": "auto"}
    assert make(**base, cluster={"topology": "dgx-h100"}, parallelism={"tensor_parallel": 8}).framework == (
        "megatron-core-2024"
    )
    assert make(**base, parallelism={"pipeline_parallel": 2}).framework == "megatron-2022"
    assert make(**base).framework == "pytorch-2024"
    assert make(**base, parallelism={"fsdp": {}}).framework == "pytorch-2024"  # FSDP2, as torchtitan runs it
    assert make(model=SMALL).framework == "ideal"  # named explicitly: kept


def test_megatron_deepspeed_layers_synchronise_twice_in_forward():
    """torch.tensor(0.0, device=...) twice in ParallelTransformerLayer.forward (Megatron-DeepSpeed): two sync
    ops between the attention and MLP halves of the forward, none in backward."""
    fw = get_framework("megatron-2022")
    assert fw.host.syncs == Syncs(microbatch=True, p2p=True, optimizer=True, layer_forward=2)
    r = simulate(make(model=SMALL, framework="megatron-2022", cluster={"gpus_per_node": 1}))
    fwd = [op.kind for op in r.workload.layer.forward]
    assert fwd.count("sync") == 2 and [op.kind for op in r.workload.layer.backward].count("sync") == 0
    names = [op.name for op in r.workload.layer.forward]
    assert names.index("post-attention layernorm") < fwd.index("sync") < names.index("mlp up projection")


def hooked_program(issuer_sync: bool, host_wait: bool = False):
    """Two GPU-bound steps of n kernels on rank 0 and a D-second transfer on another stream, issued by the host
    after it has issued step 0 (a framework hook), or in its own right while step 1's host waits for it."""
    p = Program("test")
    t0 = p.add_compute(0, "forward", "forward", "t0", (), kernels(10), -1)
    x = p.add(0, "comm", "all_gather", "forward", "x", (), group="dp", bytes=1.0, issued_after=t0)
    t1 = p.add_compute(0, "forward", "forward", "t1", (), kernels(10), -1, issuer_sync)
    if host_wait:
        p.tasks[t1].host_waits = (x,)
    return p, t0, x, t1


def run_hooked(p, c, g, d, host):
    gpu = FixedGpu(g)
    return simulate_program(
        p, lambda t: task_cost(t.ops, gpu, lambda op: 0.0, host), lambda t: [Phase(d, {})]
    )


def test_a_call_issued_by_a_hook_starts_when_the_host_gets_there():
    """A transfer issued after the host has issued step 0 starts at n c when the host runs ahead of the GPU
    (at 0 without a host model: an infinitely fast host); one issued after a step that synchronises first
    starts only once the GPU has caught up and the host has issued that step."""
    c, g, n, d = 5e-6, 20e-6, 10, 1e-3
    p, t0, x, _ = hooked_program(False)
    tl = run_hooked(p, c, g, d, HostProfile(forward_kernel_s=c))
    assert tl.start[x] == pytest.approx(n * c, rel=1e-12)
    assert tl.end[x] == pytest.approx(n * c + d, rel=1e-12)
    assert tl.blocker[x] == t0
    assert run_hooked(hooked_program(False)[0], c, g, d, HostProfile()).start[x] == 0.0
    # issued after step 1, which synchronises first: the host waits for step 0's GPU end (c + n g), issues step
    # 1 (n c more), and only then reaches the hook
    p = Program("test")
    p.add_compute(0, "forward", "forward", "t0", (), kernels(n), -1)
    t1 = p.add_compute(0, "forward", "forward", "t1", (), kernels(n), -1, True)
    x = p.add(0, "comm", "all_gather", "forward", "x", (), group="dp", bytes=1.0, issued_after=t1)
    tl = run_hooked(p, c, g, d, HostProfile(forward_kernel_s=c))
    assert tl.start[x] == pytest.approx(c + n * g + n * c, rel=1e-12)
    assert tl.blocker[x] == t1


def test_a_host_wait_on_another_stream_stalls_the_steps_after_it():
    """Step 1's host blocks on the transfer (an event synchronised on its stream): it issues step 1's first
    kernel c after the transfer ends, so step 1 ends at n c + D + c + n g, the GPU idle in between."""
    c, g, n, d = 5e-6, 20e-6, 10, 1e-3
    p, t0, x, t1 = hooked_program(False, host_wait=True)
    tl = run_hooked(p, c, g, d, HostProfile(forward_kernel_s=c))
    assert tl.end[t0] == pytest.approx(c + n * g, rel=1e-12)
    assert tl.end[t1] == pytest.approx(n * c + d + c + n * g, rel=1e-12)
    assert tl.host_idle[t1] == pytest.approx(tl.end[t1] - tl.end[t0] - n * g, rel=1e-9)


def test_without_a_host_model_a_host_wait_still_holds_the_step():
    """An infinitely fast host still blocks on the event: step 1 starts when the transfer ends, and a call its
    hook issues goes out then too."""
    g, n, d = 20e-6, 10, 1e-3
    p, t0, x, t1 = hooked_program(False, host_wait=True)
    y = p.add(0, "comm2", "all_gather", "forward", "y", (), group="dp", bytes=1.0, issued_after=t1)
    tl = run_hooked(p, 0.0, g, d, HostProfile())
    assert tl.start[x] == 0.0  # issued after step 0, by a host that is never late
    assert tl.start[t1] == pytest.approx(d, rel=1e-12)
    assert tl.end[t1] == pytest.approx(d + n * g, rel=1e-12)
    assert tl.start[y] == pytest.approx(d, rel=1e-12)
