"""DualPipe and DualPipeV (deepseek-ai/DualPipe 3da1bbe): the order each rank runs, replayed here independently
of the simulator, against the README's bubble; their memory; and DeepSeek-V3 on 2,048 H800 as its report
describes it."""

from pathlib import Path

import pytest
from conftest import ideal_network_cluster, make
from test_pipeline import pipeline

from simulator import load_scenario, simulate
from simulator.errors import ScenarioError
from simulator.strategy.schedules import dualpipe, path_length

ROOT = Path(__file__).parents[1]


def replay(name: str, p: int, m: int, f: float, i: float, w: float, fb: float | None = None) -> float:
    """The makespan of ``dualpipe.tasks`` with fixed step times and free transfers, found by list scheduling:
    each rank runs its tasks in order, a forward once the previous model stage's forward of that micro-batch has
    ended, a backward once the next stage's backward has (written apart from the simulator's engine)."""
    b = i + w
    fb = f + b if fb is None else fb
    tasks = {st: dualpipe.tasks(name, p, m, st) for st in range(p)}
    owner = {dualpipe.position(name, p, st, c): (st, c) for st in range(p) for c in (0, 1)}
    length = path_length(name, p, 2)
    end: dict = {}
    nxt, clock = [0] * p, [0.0] * p

    def ready(st, step):
        path, k = dualpipe.position(name, p, st, step.chunk)
        if step.kind == "W" or (step.kind == "F" and k == 0) or (step.kind != "F" and k == length - 1):
            return 0.0
        src = owner[(path, k - 1 if step.kind == "F" else k + 1)]
        kinds = ("F",) if step.kind == "F" else ("B", "I")
        return next(
            (
                end[(src[0], x, step.microbatch, src[1])]
                for x in kinds
                if (src[0], x, step.microbatch, src[1]) in end
            ),
            None,
        )

    while any(nxt[st] < len(tasks[st]) for st in range(p)):
        moved = False
        for st in range(p):
            while nxt[st] < len(tasks[st]):
                task = tasks[st][nxt[st]]
                times = [ready(st, x) for x in task]
                if None in times:
                    break
                took = fb if len(task) == 2 else {"F": f, "B": b, "I": i, "W": w}[task[0].kind]
                clock[st] = max(clock[st], *times) + took
                for x in task:
                    end[(st, x.kind, x.microbatch, x.chunk)] = clock[st]
                nxt[st] += 1
                moved = True
        assert moved, "the order deadlocks"
    return max(clock)


@pytest.mark.parametrize("name", ["dualpipe", "dualpipev"])
@pytest.mark.parametrize("ranks,m", [(2, 4), (4, 8), (4, 20), (6, 24), (8, 16), (8, 40)])
def test_bubble_is_the_readmes_with_equal_step_times(name, ranks, m):
    """README: DualPipe's bubble (PP/2 - 1)(F&B + B - 3W) on PP ranks; DualPipeV's the same with PP = 2 x ranks
    stages. With F = B_input = W = 1 (B = 2, F&B = 3, no overlap gain) the ranks' work is m (F + B) for DualPipe
    (half the micro-batches through each of its two chunks) and 2 m (F + B) for DualPipeV."""
    if name == "dualpipe" and m % 2:
        pytest.skip("DualPipe splits the batch in two")
    stages = ranks if name == "dualpipe" else 2 * ranks
    bubble = (stages / 2 - 1) * (3 + 2 - 3)
    work = (1 if name == "dualpipe" else 2) * m * 3
    assert replay(name, ranks, m, 1.0, 1.0, 1.0) == pytest.approx(work + bubble, rel=1e-12)


def test_every_rank_runs_each_step_once_and_its_zero_bubble_weights_after_their_input_gradients():
    for name, p, m in (("dualpipe", 8, 20), ("dualpipev", 4, 10)):
        per_chunk = m // 2 if name == "dualpipe" else m
        for st in range(p):
            steps = [x for task in dualpipe.tasks(name, p, m, st) for x in task]
            for c in (0, 1):
                f = [x.microbatch for x in steps if x.kind == "F" and x.chunk == c]
                b = [x.microbatch for x in steps if x.kind in ("B", "I") and x.chunk == c]
                assert f == b == list(range(per_chunk))
            for k, x in enumerate(steps):
                if x.kind == "W":  # WeightGradStore.pop: first in, first out, after its input gradient
                    assert ("I", x.microbatch, x.chunk) in [tuple(y) for y in steps[:k]]
            pairs = [t for t in dualpipe.tasks(name, p, m, st) if len(t) == 2]
            assert all(a.kind == "F" and b.kind == "B" and a.chunk != b.chunk for a, b in pairs)
    # DualPipeV's last rank: its first chunk's forward feeds its own second chunk (no transfer), the loss is on rank 0
    assert dualpipe.position("dualpipev", 4, 3, 0) == (0, 3) and dualpipe.position("dualpipev", 4, 3, 1) == (
        0,
        4,
    )
    assert dualpipe.position("dualpipev", 4, 0, 1) == (0, 7)
    # DualPipe: rank r holds model stage r for one direction and p - 1 - r for the other
    assert dualpipe.position("dualpipe", 8, 2, 1) == (1, 5)


@pytest.mark.parametrize("name,ranks,m", [("dualpipev", 4, 8), ("dualpipev", 2, 8), ("dualpipe", 4, 12)])
def test_the_simulated_timeline_is_the_independent_replay(name, ranks, m):
    """Free transfers, equal stages: the simulator's last step ends where ``replay`` says, with the step times it
    costed (every rank's F, I, W and F&B take the same)."""
    r = pipeline(ranks, m, name, 2)
    tl = r.timeline
    took: dict[str, set] = {}
    last = 0.0
    for t in r.program.tasks:
        if t.stream != "compute" or t.name.startswith("optimizer"):
            continue
        took.setdefault("FB" if "+" in t.name else t.name[0], set()).add(
            round(tl.end[t.id] - tl.start[t.id], 12)
        )
        last = max(last, tl.end[t.id])
    assert all(len(v) == 1 for v in took.values())
    f, i, w, fb = (next(iter(took[k])) for k in ("F", "I", "W", "FB"))
    assert fb == pytest.approx(
        f + i + w, rel=1e-9
    )  # a dense model: a forward beside a backward gains nothing
    assert last == pytest.approx(replay(name, ranks, m, f, i, w, fb), rel=1e-9)


def test_dual_schedules_beat_1f1b_and_the_periodic_replay_is_exact():
    one = pipeline(4, 16, "1f1b").metrics
    v = pipeline(4, 16, "dualpipev", 2).metrics
    assert v.bubble_fraction < one.bubble_fraction / 2
    long = pipeline(4, 96, "dualpipe", 2)
    assert long.metrics.periodic["simulated"] == [8, 16, 24]  # 2 x ranks micro-batches at least
    s = long.scenario
    exact = simulate(s, cluster=ideal_network_cluster(s), workload=long.workload, periodic=False)
    assert exact.metrics.iteration_time_s == pytest.approx(long.metrics.iteration_time_s, rel=1e-9)


def test_memory_per_the_readme_table():
    """Activations per device: 1F1B's first stage p micro-batches of a stage; DualPipe's middle ranks PP + 1 of
    its stages (PP = ranks); DualPipeV's PP + 1 of its half-size chunks (PP = 2 x ranks). Parameters: DualPipe
    holds every stage twice, DualPipeV once."""
    one = [rc.memory for rc in pipeline(4, 16, "1f1b").program.ranks]
    dual = [rc.memory for rc in pipeline(4, 16, "dualpipe", 2).program.ranks]
    v = [rc.memory for rc in pipeline(4, 16, "dualpipev", 2).program.ranks]
    stage = one[0].activations / 4  # one micro-batch of a 4-layer stage
    assert dual[1].activations == pytest.approx(5 * stage, rel=1e-9)
    assert v[1].activations == pytest.approx(9 * stage / 2, rel=1e-9)
    assert dual[1].params == pytest.approx(2 * one[1].params, rel=1e-9)
    assert v[1].params == pytest.approx(one[1].params, rel=1e-9)


def test_dualpipe_sums_the_two_copies_gradients_and_needs_no_tied_embedding_reduction():
    r = pipeline(4, 8, "dualpipe", 2, equal_stages=False)
    mirror = [t for t in r.program.tasks if t.name == "mirror-stage grad all-reduce"]
    assert sorted(t.rank for t in mirror) == [0, 1]  # one per pair of ranks (0, 3) and (1, 2)
    params = [rc.memory.params / 2 for rc in r.program.ranks]  # bf16 weights: 2 bytes each
    grad_bytes = 2  # the test profile reduces 16-bit gradients
    assert {t.rank: t.bytes for t in mirror} == pytest.approx(
        {0: params[0] * grad_bytes, 1: params[1] * grad_bytes}
    )
    assert r.placement.groups("mirror")[0] == (0, 3)
    assert not [t for t in r.program.tasks if t.name == "tied embedding grad all-reduce"]


@pytest.mark.parametrize(
    "layers,par,training,text",
    [
        (16, {"pipeline_parallel": 3, "pipeline_schedule": "dualpipe"}, {}, "even pipeline_parallel"),
        (
            16,
            {"pipeline_parallel": 4, "pipeline_schedule": "dualpipev"},
            {"global_batch_size": 6},
            "at least 2 x",
        ),
        (16, {"pipeline_parallel": 4, "pipeline_schedule": "dualpipe"}, {"global_batch_size": 9}, "and even"),
        (
            16,
            {"pipeline_parallel": 4, "pipeline_schedule": "dualpipe", "virtual_pipeline_stages": 1},
            {},
            "virtual_pipeline_stages must be 2",
        ),
        (
            12,
            {"pipeline_parallel": 4, "pipeline_schedule": "dualpipev"},
            {},
            "12 does not split evenly over 8",
        ),
        (
            16,
            {
                "pipeline_parallel": 4,
                "pipeline_schedule": "dualpipe",
                "fsdp": {"reshard_after_forward": False},
            },
            {},
            "dualpipe with fsdp is not modelled",
        ),
    ],
)
def test_bad_dual_layouts_get_one_line(layers, par, training, text):
    model = {
        "num_layers": layers,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "seq_length": 512,
        "vocab_size": 1000,
    }
    s = make(
        model=model,
        cluster={"gpus_per_node": par["pipeline_parallel"]},
        training={"global_batch_size": 12, "micro_batch_size": 1} | training,
        parallelism=par,
    )
    with pytest.raises(ScenarioError) as e:
        simulate(s)
    assert text in str(e.value) and "\n" not in str(e.value)


def dualpipev_fsdp(fsdp: bool, ideal: bool = True):
    """DualPipeV on 4 ranks x DP 2 (8 A100), 16 layers, 8 micro-batches a replica: FSDP2 as torchtitan pipelines it
    (parameters gathered once per step, gradients reduce-scattered after each chunk's last backward), or ZeRO-1."""
    s = make(
        model={"num_layers": 16, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 32000},
        cluster={"gpus_per_node": 8},
        training={"global_batch_size": 16, "micro_batch_size": 1},
        parallelism={"pipeline_parallel": 4, "pipeline_schedule": "dualpipev", "data_parallel": 2}
        | ({"fsdp": {"reshard_after_forward": False}} if fsdp else {"zero_stage": 1}),
    )  # fmt: skip
    return simulate(s, cluster=ideal_network_cluster(s) if ideal else None, periodic=True)


def test_dualpipev_with_fsdp_gathers_each_chunk_before_its_first_forward_and_reduces_after_its_last_backward():
    """torchtitan pipelines FSDP2 with DualPipeV (ScheduleDualPipeV): each rank's two chunks, each gathered once
    (bf16, 2 bytes a parameter: 2 layers of 12.6 M) before its first forward and reduce-scattered once after its
    last backward or weight-gradient step; with a free network the order and the bubble are ZeRO-1's."""
    r = dualpipev_fsdp(True)
    tasks = r.program.tasks
    layer = 12 * 1024**2 + 13 * 1024  # 12 h^2 weights + 13 h biases and norms (GPT_SMALL-like, ideal profile)
    for rank in range(4):
        gathers = sorted(
            (t for t in tasks if t.rank == rank and "param all-gather" in t.name), key=lambda t: t.name
        )
        reduces = sorted(
            (t for t in tasks if t.rank == rank and "grad reduce-scatter" in t.name), key=lambda t: t.name
        )
        assert [t.name for t in gathers] == ["chunk 0 param all-gather", "chunk 1 param all-gather"]
        assert [t.name for t in reduces] == ["chunk 0 grad reduce-scatter", "chunk 1 grad reduce-scatter"]
        steps = [t for t in tasks if t.rank == rank and t.stream == "compute" and t.phase != "optimizer"]
        for c, g in enumerate(gathers):  # step names: F<micro-batch>.<chunk>, a pair joined by +
            first = min(
                t.id for t in steps if any(x[0] == "F" and x.endswith(f".{c}") for x in t.name.split("+"))
            )
            assert g.id in tasks[first].deps
        # FSDP2 under pipelining reduces a rank's stages once all its backward and weight steps are done
        # (torch/distributed/pipelining: REDUCE_GRAD "scheduled after all microbatches W, B actions")
        assert {red.deps for red in reduces} == {(steps[-1].id,)}
        if (
            rank != 0
        ):  # the embedding and the output layer are on rank 0 (DualPipeV's V turns at the last rank)
            assert [g.bytes for g in gathers] == [2 * 2 * layer] * 2
    zero1 = dualpipev_fsdp(False)
    assert r.metrics.bubble_fraction == pytest.approx(zero1.metrics.bubble_fraction, rel=1e-9)


def test_deepseek_v3_on_2048_h800_fits_and_runs_near_its_reported_throughput():
    """The report's layout (PP 16 DualPipe, EP 64 over 8 nodes, ZeRO-1, no TP; FP8 with BF16 moments, FP8 SwiGLU
    inputs, RMSNorm / MLA up-projection / SwiGLU recompute; FP8 dispatch) fits in 80 GB as it trained; its
    throughput, 180K H800 GPU-hours per trillion tokens (1,543 tokens/s per GPU), is met to the error stated in
    docs/moe.md (simulated 12.7% slower on 2026-12-06)."""
    s = load_scenario(ROOT / "scenarios" / "moe" / "deepseek-v3-dualpipe-2048xh800.yaml")
    m = simulate(s).metrics
    assert not m.oom
    published = 1e12 / (180e3 * 3600)
    assert m.tokens_per_s_per_gpu == pytest.approx(1346.5, rel=0.02)  # the figure docs/moe.md states
    assert abs(m.tokens_per_s_per_gpu / published - 1) < 0.15
    assert m.moe["expert_comm_s"] > 1.0  # DeepEP's traffic is reported


def test_plan_from_a_dualpipe_scenario_sets_its_own_layout_beside_the_pick():
    """plan --scenario simulates the file's own layout too and says where it beats the pick, and what of it the
    search does not lay out (study/own.py)."""
    from simulator.study.own import own_layout

    own = pipeline(4, 16, "dualpipev", 2, equal_stages=False, ideal=False).scenario
    t = simulate(own).metrics.iteration_time_s
    row = own_layout(own, 4, 16, {"top": [{"status": "ok", "iteration_time_s": 2 * t}]})
    assert row["iteration_time_s"] == pytest.approx(t, rel=1e-12) and row["fits"] and row["beats_pick"]
    assert (
        "faster than the plan's pick" in row["note"] and "does not cover" not in row["note"]
    )  # it searches it
    data = own.model_dump(mode="json", exclude_none=True)
    data["parallelism"]["pipeline_layout"] = "Ett|tt|tt|tt|tt|tt|tt|ttL"  # the even split, stated
    stated = load_scenario(data)
    row = own_layout(stated, 4, 16, {"top": [{"status": "ok", "iteration_time_s": 2 * t}]})
    assert "the search does not cover its pipeline_layout" in row["note"]
    slower = own_layout(own, 4, 16, {"top": [{"status": "ok", "iteration_time_s": t / 2}]})
    assert not slower["beats_pick"] and "faster" not in slower["note"]
    assert own_layout(own, 8, 16, {"top": []}) is None  # another job: nothing to compare


def test_the_planner_lays_out_dualpipe_and_dualpipev_where_their_stages_fill():
    """study/layouts.py dual_plans: DualPipe over an even PP with an even count of at least 2 PP micro-batches,
    DualPipeV over 2 PP stages with at least 2 PP; the bubble the README gives at B = 2F = 2W (pipeline_bubble)."""
    from simulator.study.layout import Layout, pipeline_bubble
    from simulator.study.layouts import candidates, dual_plans

    assert dual_plans(16, 4, 8, {}) == [(2, "dualpipe", (0, 0)), (2, "dualpipev", (0, 0))]
    assert dual_plans(16, 4, 6, {}) == []  # fewer than 2 PP micro-batches
    assert dual_plans(12, 3, 6, {}) == [(2, "dualpipev", (0, 0))]  # DualPipe needs an even PP
    assert dual_plans(61, 8, 32, {}) == [
        (2, "dualpipe", (7, 6)),
        (2, "dualpipev", (3, 2)),
    ]  # DeepSeek-V3's 61
    step = 6.0  # a rank's F + B per micro-batch: 2 chunks of F = 1, B = 2 (DualPipeV); 2 stages (DualPipe)
    v = Layout(1, 8, 1, 1, 2, 1, "zero1", "none", schedule="dualpipev")
    d = Layout(1, 8, 1, 1, 2, 1, "zero1", "none", schedule="dualpipe")
    assert pipeline_bubble(v, step) == (8 - 1) * (3 + 2 - 3) * 1.0  # (PP - 1)(F&B + B - 3W) a chunk
    assert pipeline_bubble(d, step) == (8 / 2 - 1) * (3 + 2 - 3) * 1.0  # its stages are half a rank's step
    assert pipeline_bubble(Layout(1, 8, 1, 1, 1, 1, "zero1", "none"), step) == 7 * step  # 1F1B
    assert v.label() == "TP1 PP8 DualPipeV DP1 mbs1 zero1 rc:none"
    assert v.parallelism()["pipeline_schedule"] == "dualpipev"
    s = pipeline(4, 16, "1f1b").scenario
    lays = [x for x in candidates(s, 4, 4, {"tp": [1], "mbs": [1], "shardings": ["ddp"]}) if x.schedule]
    assert {(x.pp, x.schedule) for x in lays} == {
        (2, "dualpipe"),
        (2, "dualpipev"),
        (4, "dualpipe"),
        (4, "dualpipev"),
    }


def test_dual_layouts_emit_as_their_stacks_can_run_them():
    from simulator.study.emit import emit_text

    row = {
        "tp": 1, "pp": 8, "cp": 1, "dp": 16, "v": 2, "mbs": 1, "sharding": "zero1", "recompute": "none",
        "ep": 1, "etp": 1, "first": 0, "last": 0, "schedule": "dualpipev",
        "scenario": {"model": {"num_layers": 32, "seq_length": 4096}, "training": {"global_batch_size": 256}},
    }  # fmt: skip
    megatron = emit_text(row, "megatron")
    assert "has no switch for it" in megatron and "virtual" not in megatron.split("\n", 1)[1]
    assert 'pipeline_parallel_schedule = "DualPipeV"' in emit_text(row, "torchtitan")
