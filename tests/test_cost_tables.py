"""Cost tables: the format, the lookup order (exact row -> interpolation -> model) with closed-form checks, the
cost sources a run reports, and the shipped A100 / H100 tables."""

import json
from collections import defaultdict
from functools import partial
from math import sqrt
from statistics import median

import numpy as np
import pytest
from conftest import GPT_SMALL, make
from typer.testing import CliRunner

from simulator.api import simulate
from simulator.cli import app
from simulator.costs.compute import ComputeModel, shape_roofline_s
from simulator.errors import ScenarioError
from simulator.hardware.gpus import get_gpu
from simulator.tables.format import CollectiveRow, CostTable, KernelRow, SystemInfo, TableMeta
from simulator.tables.io import read_table, write_table
from simulator.tables.lookup import CollectiveLookup, KernelLookup, curve_cost
from simulator.workload.ops import gemm, memory_op

A100 = get_gpu("a100-sxm4-80gb")
runner = CliRunner()


def table(tmp_path, kernels=(), collectives=(), system=None, gpu="a100-sxm4-80gb", name="t"):
    meta = TableMeta(name=name, gpu=gpu, system=system or SystemInfo())
    return write_table(tmp_path / name, CostTable(meta, list(kernels), list(collectives)))


# -- format -------------------------------------------------------------------------------------------------------
def test_a_table_round_trips_through_its_directory_format(tmp_path):
    k = KernelRow("gemm", "bf16", 2048, 4608, 12288, 1, 812.5, "forward", 20, 3.1, 9.5, "qkv")
    c = CollectiveRow("all_reduce", 8, 1, 8, 2**21, 70.0, 20, 4.0, "bf16", "ring", "LL128")
    path = table(tmp_path, [k], [c], SystemInfo(topology="dgx-a100", intra_node="nvswitch"))
    back = read_table(path)
    assert back.kernels == [k] and back.collectives == [c]
    assert back.meta.system.topology == "dgx-a100" and back.meta.gpu == "a100-sxm4-80gb"


def test_a_bad_cell_is_one_error_naming_file_line_and_column(tmp_path):
    path = table(tmp_path, [KernelRow("gemm", "bf16", 64, 64, 64, 1, 5.0)])
    (path / "kernels.csv").write_text(
        "op,dtype,m,n,k,median_us\ngemm,bf16,64,64,64,5\ngemm,bf16,128,64,64,six\n"
    )
    with pytest.raises(
        ScenarioError, match=r"kernels.csv line 3: column 'median_us': expected a number \(got 'six'\)"
    ):
        read_table(path)
    s = tmp_path / "s.yaml"
    s.write_text(
        "model: {num_layers: 2, hidden_size: 256, num_attention_heads: 4, seq_length: 128, vocab_size: 1000}\n"
        "cluster: {topology: dgx-a100, gpus_per_node: 1}\ntraining: {global_batch_size: 2}\n"
    )
    r = runner.invoke(app, ["run", str(s), "--kernels", str(path)])
    assert r.exit_code == 2 and "line 3: column 'median_us'" in r.output and "Traceback" not in r.output


def test_unknown_kernels_choice_and_unknown_op_are_clear_errors(tmp_path):
    from simulator.scenario.loader import load_scenario

    with pytest.raises(
        ScenarioError, match="kernels: 'nowhere' is neither a table directory nor a shipped table"
    ):
        load_scenario({**_small(), "kernels": "nowhere"})
    path = table(tmp_path, [KernelRow("gemm", "bf16", 64, 64, 64, 1, 5.0)])
    (path / "kernels.csv").write_text("op,dtype,m,median_us\nwarp_drive,bf16,4,1.0\n")
    with pytest.raises(ScenarioError, match="line 2: column 'op': unknown kernel 'warp_drive'"):
        read_table(path)


def _small() -> dict:
    return {
        "model": dict(GPT_SMALL),
        "cluster": {"topology": "dgx-a100", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"global_batch_size": 2, "micro_batch_size": 2, "precision": "bf16"},
    }


# -- lookup: closed forms -----------------------------------------------------------------------------------------
def lookup_of(rows):
    return KernelLookup(rows, partial(shape_roofline_s, A100))


def test_an_exact_row_is_measured_and_costs_its_median_plus_the_launch_gap():
    op = gemm("qkv", 2048, 4608, 12288)
    cm = ComputeModel(
        A100, "bf16", kernels=lookup_of([KernelRow("gemm", "bf16", 2048, 4608, 12288, 1, 1012.5)])
    )
    seconds, source = cm.op_cost(op)
    assert source == "measured"
    assert seconds == pytest.approx(1012.5e-6 + A100.kernel_launch_s, rel=1e-12)


def test_no_gemm_runs_faster_than_the_best_measured_matmul_of_the_gpu():
    # 232 GFLOP in 700 us would be 331 TFLOP/s, above the A100's 312 peak: the row is clamped to MAMF (0.869)
    op = gemm("qkv", 2048, 4608, 12288)
    cm = ComputeModel(A100, "bf16", kernels=lookup_of([KernelRow("gemm", "bf16", 2048, 4608, 12288, 1, 700)]))
    seconds, _ = cm.op_cost(op)
    assert seconds == pytest.approx(op.flops / (312e12 * 0.869) + A100.kernel_launch_s, rel=1e-12)


def test_a_gemm_between_measured_shapes_is_interpolated_relative_to_the_roofline():
    # rows measured at exactly 1.25x the roofline: any shape inside them costs exactly 1.25x its roofline
    shapes = [(m, n, k) for m in (1024, 4096) for n in (1024, 4096) for k in (1024, 4096)]
    rows = [
        KernelRow(
            "gemm",
            "bf16",
            m,
            n,
            k,
            1,
            1.25 * shape_roofline_s(A100, "gemm", "forward", "bf16", m, n, k, 1) * 1e6,
        )
        for m, n, k in shapes
    ]
    look = lookup_of(rows)
    roof = shape_roofline_s(A100, "gemm", "forward", "bf16", 2048, 3072, 1536, 1)
    seconds, source = look.cost("gemm", "forward", "bf16", 2048, 3072, 1536, 1, roof)
    assert source == "interpolated" and seconds == pytest.approx(1.25 * roof, rel=1e-9)
    # the transpose of a measured GEMM is the same problem (the A100's tile shapes come in both orientations)
    one = lookup_of([KernelRow("gemm", "bf16", 1024, 4096, 2048, 1, 90.0)])
    roof_t = shape_roofline_s(A100, "gemm", "backward", "bf16", 4096, 1024, 2048, 1)
    assert one.cost("gemm", "backward", "bf16", 4096, 1024, 2048, 1, roof_t) == pytest.approx(
        (90e-6, "interpolated")
    )
    # outside the measured range, or farther than a factor 2 from every row: the model decides
    assert look.cost("gemm", "forward", "bf16", 2048, 3072, 16384, 1, roof) is None
    assert look.cost("gemm", "forward", "bf16", 512, 512, 512, 1, roof) is None


def test_memory_kernels_interpolate_log_log_and_never_exceed_the_largest_measured_bandwidth():
    rows = [
        KernelRow("layernorm", "bf16", 1000, 1000, median_us=10.0),
        KernelRow("layernorm", "bf16", 4000, 1000, median_us=20.0),
    ]
    look = lookup_of(rows)
    assert look.cost("layernorm", "forward", "bf16", 2000, 1000, 0, 1, 0) == pytest.approx(
        (sqrt(10 * 20) * 1e-6, "interpolated")
    )
    assert look.cost("layernorm", "forward", "bf16", 8000, 1000, 0, 1, 0)[0] == pytest.approx(
        40e-6
    )  # 4e6 el / 20 us held
    assert look.cost("layernorm", "forward", "bf16", 100, 1000, 0, 1, 0)[0] == pytest.approx(
        10e-6
    )  # the smallest: a floor
    assert (
        look.cost("layernorm", "backward", "bf16", 2000, 1000, 0, 1, 0) is None
    )  # no backward rows: modelled
    assert curve_cost([1.0, 4.0], [1.0, 2.0], 2.0) == pytest.approx(sqrt(2))


def test_bf16_runs_use_fp16_rows_and_count_them_as_interpolated():
    look = lookup_of([KernelRow("gemm", "fp16", 2048, 2048, 2048, 1, 100.0)])
    assert look.cost("gemm", "forward", "fp16", 2048, 2048, 2048, 1, 1.0) == pytest.approx(
        (100e-6, "measured")
    )
    assert look.cost("gemm", "forward", "bf16", 2048, 2048, 2048, 1, 1.0) == pytest.approx(
        (100e-6, "interpolated")
    )
    assert look.cost("gemm", "forward", "fp32", 2048, 2048, 2048, 1, 1.0) is None


def test_framework_factors_apply_to_measured_kernels_too():
    from simulator.frameworks import Framework

    look = lookup_of(
        [
            KernelRow("gemm", "bf16", 2048, 2048, 2048, 1, 100.0),
            KernelRow("gelu", "bf16", 2048, 8192, median_us=50.0),
        ]
    )
    f = Framework(name="half", gemm_efficiency=0.5, memory_efficiency=0.25, kernel_overhead_s=1e-6)
    cm = ComputeModel(A100, "bf16", f, look)
    extra = A100.kernel_launch_s + 1e-6
    assert cm.op_time_s(gemm("g", 2048, 2048, 2048)) == pytest.approx(200e-6 + extra)
    assert cm.op_time_s(memory_op("gelu", 1.0, "gelu", 2048, 8192)) == pytest.approx(200e-6 + extra)


def tp8_with_measured_all_reduce(algorithm: str = "auto"):
    """TP 8 on one node simulated on the pure model, and a collective model over three measured all-reduce rows
    (1 MiB 40 us, 16 MiB 110 us, 128 MiB 700 us): (scenario, result, measured model)."""
    from simulator.costs.collectives import CollectiveModel

    rows = [
        CollectiveRow("all_reduce", 8, 1, 8, s, us)
        for s, us in ((2**20, 40.0), (2**24, 110.0), (2**27, 700.0))
    ]
    s = make(parallelism={"tensor_parallel": 8}, training={"global_batch_size": 8})
    r = simulate(s.model_copy(update={"kernels": "none"}))
    return s, r, CollectiveModel(r.cluster, r.placement, algorithm, CollectiveLookup(rows))


def test_a_measured_collective_sets_the_time_of_one_group_and_keeps_the_models_links():
    _, r, measured = tp8_with_measured_all_reduce()
    assert measured.standalone_time_s("all_reduce", "tp", 2**24) == pytest.approx(110e-6, rel=1e-12)
    assert measured.source("all_reduce", "tp", 2**24) == "measured"
    assert measured.standalone_time_s("all_reduce", "tp", 2**22) == pytest.approx(
        40e-6 * (110 / 40) ** 0.5, rel=1e-9
    )
    assert measured.source("all_reduce", "tp", 2**22) == "interpolated"
    assert measured.source("all_gather", "tp", 2**22) == "modelled"  # no all-gather rows
    # the links the phases load are the model's: same link classes, demand scaled
    model_phase = r.comm.phases("all_reduce", "tp", 2**24)[0]
    calibrated = measured.phases("all_reduce", "tp", 2**24)[0]
    assert calibrated.demand_s.keys() == model_phase.demand_s.keys()
    forced = tp8_with_measured_all_reduce("ring")[2]
    assert forced.source("all_reduce", "tp", 2**24) == "modelled"  # a forced algorithm is a what-if


def test_a_collective_above_the_tables_range_adds_the_models_time_for_the_bytes_beyond():
    """Above its largest row a table keeps that row's time and the model prices the rest: t(S) = t_row(top) +
    model(S) - model(top). With the shipped A100 table (Vidur's rows up to 64 MB) an 8-GPU all-reduce of 1 GiB
    lands within 3% of the three public nccl-tests curves of docs/collectives.md (8,140-8,193 us at 1 GiB); the
    top row's bandwidth carried on gave 11.0 ms."""
    s, r, measured = tp8_with_measured_all_reduce()
    model = r.comm.standalone_time_s
    for size in (2**28, 2**30):
        expected = 700e-6 + model("all_reduce", "tp", size) - model("all_reduce", "tp", 2**27)
        assert measured.standalone_time_s("all_reduce", "tp", size) == pytest.approx(expected, rel=1e-9)
        assert measured.source("all_reduce", "tp", size) == "interpolated"
    assert measured.standalone_time_s("all_reduce", "tp", 2**27) == pytest.approx(700e-6, rel=1e-12)

    shipped = simulate(s)  # kernels: auto, the shipped A100 table
    assert shipped.comm.source("all_reduce", "tp", 2**30) == "interpolated"
    assert shipped.comm.standalone_time_s("all_reduce", "tp", 2**30) == pytest.approx(8.19e-3, rel=0.03)


def test_collective_rows_apply_only_to_the_fabric_they_were_measured_on(tmp_path):
    rows = [
        CollectiveRow("all_reduce", 16, 2, 8, 2**24, 300.0),
        CollectiveRow("all_reduce", 8, 1, 8, 2**24, 100.0),
    ]
    system = SystemInfo(topology="dgx-a100", intra_node="nvswitch", nic_bandwidth_gbps=200, nics_per_node=8)
    path = table(tmp_path, collectives=rows, system=system)
    same = simulate(
        make(cluster={"num_nodes": 2}, training={"global_batch_size": 16}).model_copy(
            update={"kernels": str(path), "kernels_only": True}
        )
    )
    assert same.metrics.cost_tables["collective_rows"] == 2 and not same.metrics.cost_tables["notes"]
    faster = make(cluster={"num_nodes": 2, "nic_bandwidth_gbps": 400}, training={"global_batch_size": 16})
    what_if = simulate(faster.model_copy(update={"kernels": str(path), "kernels_only": True}))
    assert what_if.metrics.cost_tables["collective_rows"] == 1  # only the row inside one node
    assert "nic_bandwidth_gbps 200.0 (cluster: 400.0)" in what_if.metrics.cost_tables["notes"][0]


# -- runs ---------------------------------------------------------------------------------------------------------
def test_kernels_none_is_the_pure_model_and_auto_picks_the_gpus_shipped_table():
    s = make(training={"global_batch_size": 8, "micro_batch_size": 1})
    pure = simulate(s.model_copy(update={"kernels": "none"})).metrics
    assert pure.cost_sources["compute"]["modelled"] == pytest.approx(1.0)
    assert pure.cost_tables == {"table": None}
    auto = simulate(s).metrics
    assert auto.cost_tables["table"] == "a100-sxm4-80gb"
    assert auto.iteration_time_s != pure.iteration_time_s
    shares = auto.cost_sources["compute"]
    assert sum(shares.values()) == pytest.approx(1.0)
    v100 = simulate(make(cluster={"gpu": "v100-sxm-32gb"}, training={"precision": "fp16"})).metrics
    assert v100.cost_tables == {"table": None}  # no shipped V100 table: the model


@pytest.mark.parametrize(
    "scenario",
    ["quickstart-gpt3-1.3b-ddp-8xa100", "published/nar21-t1-18b", "published/kor22-175b-sp-selective"],
)
def test_a_dgx_a100_run_takes_at_least_half_its_compute_time_from_the_shipped_tables(scenario):
    from pathlib import Path

    path = Path(__file__).parents[1] / "scenarios" / f"{scenario}.yaml"
    m = simulate(str(path)).metrics
    shares = m.cost_sources["compute"]
    assert shares["measured"] + shares["interpolated"] >= 0.5, shares


def test_run_json_reports_cost_sources_and_the_largest_modelled_ops(tmp_path):
    s = tmp_path / "s.yaml"
    s.write_text(
        "model: {num_layers: 4, hidden_size: 2048, num_attention_heads: 16, seq_length: 2048, vocab_size: 51200}\n"
        "cluster: {topology: dgx-a100}\ntraining: {global_batch_size: 16, micro_batch_size: 2}\n"
        "parallelism: {tensor_parallel: 8}\n"
    )
    r = runner.invoke(app, ["run", str(s), "--json"])
    d = json.loads(r.output)
    for kind in ("compute", "communication"):
        assert set(d["cost_sources"][kind]) == {"measured", "interpolated", "modelled"}
        assert sum(d["cost_sources"][kind].values()) == pytest.approx(1.0)
    # tensor-parallel all-reduces inside a DGX A100 node come from the shipped 8-GPU rows
    assert (
        d["cost_sources"]["communication"]["interpolated"] + d["cost_sources"]["communication"]["measured"]
        > 0.9
    )
    assert d["largest_modelled"] and {"kind", "op", "time_per_gpu_s"} <= set(d["largest_modelled"][0])
    text = runner.invoke(app, ["run", str(s)]).output
    assert "Largest modelled costs" in text and "Compute time: measured / interp. / modelled" in text


def test_shipped_tables_say_where_their_numbers_come_from():
    for name in ("a100-sxm4-80gb", "h100-sxm5-80gb"):
        from simulator.tables.select import shipped_tables

        t = read_table(shipped_tables()[name])
        assert t.meta.gpu == name and t.meta.sources and "MIT" in t.meta.sources[0].licence
        assert (shipped_tables()[name] / "LICENSE.vidur").is_file()
        assert len(t.kernels) > 1000 and len(t.collectives) > 100
        assert {r.ranks for r in t.collectives if r.op == "all_reduce"} == {2, 4, 8}
        assert all(
            r.nodes == 1 for r in t.collectives
        )  # rows across nodes were measured on an unnamed network


def test_a_users_table_is_layered_over_the_shipped_one(tmp_path):
    """--kernels DIR: the user's rows first, the shipped table of the GPU where they have none, then the model
    (issue 32 item 6); --kernels-only DIR: the user's rows alone; both at once is one message."""
    from typer.testing import CliRunner

    from simulator.cli import app

    shape = KernelRow("gemm", "bf16", 8192, 2048, 8192, 1, 999.0, "forward", 5)
    path = table(tmp_path, kernels=[shape])
    runner = CliRunner()

    def run(*args):
        r = runner.invoke(app, ["run", "quickstart", "--json", *args])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    shipped, layered, alone = run(), run("--kernels", str(path)), run("--kernels-only", str(path))
    assert layered["cost_tables"]["table"] == f"{path} over a100-sxm4-80gb"
    assert alone["cost_tables"]["table"] == str(path)
    assert layered["cost_tables"]["kernel_rows"] == shipped["cost_tables"]["kernel_rows"] + 1
    # the user's row is measured; the shipped rows still cover the rest, which alone the model prices
    assert (
        layered["cost_sources"]["compute"]["measured"] > 0 == shipped["cost_sources"]["compute"]["measured"]
    )
    assert layered["cost_sources"]["compute"]["modelled"] == pytest.approx(
        shipped["cost_sources"]["compute"]["modelled"], abs=0.02
    )
    assert alone["cost_sources"]["compute"]["modelled"] > 0.5
    assert alone["cost_sources"]["communication"]["modelled"] == 1.0
    r = runner.invoke(app, ["run", "quickstart", "--kernels", str(path), "--kernels-only", str(path)])
    assert r.exit_code == 2 and r.stderr.strip() == "error: --kernels and --kernels-only: give one of them"


def test_a_shipped_table_is_parsed_once_and_read_back_from_the_cache(tmp_path, monkeypatch):
    """Issue 33 item 1: the shipped table's CSVs (~0.1 s to parse, every process) are pickled under
    $CLUSTERSIM_CACHE keyed by the files' sizes and times; a later read gives the same rows, and a cache file
    that cannot be read is parsed again and rewritten, never an error."""
    from simulator.tables import select
    from simulator.tables.io import read_table

    monkeypatch.setenv("CLUSTERSIM_CACHE", str(tmp_path))
    path = select.shipped_tables()["a100-sxm4-80gb"]
    stamp = select._stamp(path)
    first = select._cached_shipped(path, stamp)
    (cached,) = (tmp_path / "tables").glob("a100-sxm4-80gb-*.pickle")
    again = select._cached_shipped(path, stamp)
    parsed = read_table(path)
    assert again.kernels == first.kernels == parsed.kernels and again.collectives == parsed.collectives
    assert again.meta == parsed.meta and again.path == path
    cached.write_bytes(b"not a pickle")
    assert select._cached_shipped(path, stamp).kernels == parsed.kernels
    assert cached.read_bytes() != b"not a pickle"


def test_a_cached_table_keeps_its_kernel_rows_as_columns_and_its_lookup_is_the_rows_lookup(
    tmp_path, monkeypatch
):
    """The parsed-table cache keeps kernel rows as columns (unpickling ~3,000 row objects took 5-8 ms of a run's
    start): a run builds its lookup from the columns without making the rows, and that lookup is the one the
    rows give, number for number; the rows are made where asked for, equal to the parsed ones."""
    from functools import partial

    from simulator.costs.compute import shape_roofline_s
    from simulator.hardware.gpus import get_gpu
    from simulator.tables import select
    from simulator.tables.format import KernelColumns
    from simulator.tables.io import read_table
    from simulator.tables.lookup import KernelLookup

    monkeypatch.setenv("CLUSTERSIM_CACHE", str(tmp_path))
    path = select.shipped_tables()["a100-sxm4-80gb"]
    select._cached_shipped(path, select._stamp(path))  # parsed and kept
    table = select._cached_shipped(path, select._stamp(path))  # read back
    assert isinstance(table.kernels, KernelColumns) and len(table.kernels) == 3024
    roofline = partial(shape_roofline_s, get_gpu("a100-sxm4-80gb"))
    by_columns = KernelLookup(table.kernels, roofline)
    assert table.kernels._rows is None  # the lookup read the columns only
    rows = read_table(path).kernels
    by_rows = KernelLookup(rows, roofline)
    assert by_columns.exact == by_rows.exact and by_columns.curves == by_rows.curves
    times = defaultdict(list)  # every row's time by its shape, the median where a shape recurs, made here
    for r in rows:
        pass_ = "forward" if r.op in ("gemm", "batched_gemm", "grouped_gemm") else r.direction
        k = r.k if r.op in ("gemm", "batched_gemm", "grouped_gemm", "flash_attention", "embedding") else 0
        times[(r.op, pass_, r.dtype, r.m, r.n, k, r.batch)].append(r.seconds)
    assert by_columns.exact == {key: median(v) for key, v in times.items()}
    assert by_columns.shaped.keys() == by_rows.shaped.keys()
    for key, shaped in by_columns.shaped.items():
        other = by_rows.shaped[key]
        for attribute in ("x", "log_ratio", "rate"):
            assert np.array_equal(getattr(shaped, attribute), getattr(other, attribute))
    assert list(table.kernels) == read_table(path).kernels
    assert table.kernels[5] == read_table(path).kernels[5]


def test_a_tables_cache_keeps_its_last_used_files_and_leaves_other_tables_alone(tmp_path, monkeypatch):
    """Each checkout or version of a shipped table is a cache file of its own (keyed by the files' times):
    writing one keeps the KEEP_PER_NAME last used of the table (reading one marks it used) and removes the
    rest, and leaves other tables' files alone, a table whose name begins with this one's included."""
    import os

    from simulator import paths
    from simulator.tables import select

    monkeypatch.setenv("CLUSTERSIM_CACHE", str(tmp_path))
    path = select.shipped_tables()["h100-sxm5-80gb"]
    cache = tmp_path / "tables"
    cache.mkdir()
    olds = [cache / f"h100-sxm5-80gb-{i:024x}.pickle" for i in range(6)]
    other = cache / "h100-sxm5-80gb-pt211-0123456789abcdef01234567.pickle"
    unrelated = cache / "h100-sxm5-80gb-notes.txt"
    for f in (*olds, other, unrelated):
        f.write_bytes(b"x")
    for age, f in enumerate(reversed(olds)):  # olds[5] the oldest
        os.utime(f, (1e9 + age, 1e9 + age))
    os.utime(olds[4], (2e9, 2e9))  # used last of them
    select._cached_shipped(path, select._stamp(path))
    (written,) = set(cache.glob("h100-sxm5-80gb-*.pickle")) - {*olds, other}
    kept = {olds[4], olds[0], olds[1]}  # the last used, then the newest: KEEP_PER_NAME with the new one
    assert set(cache.iterdir()) == {written, *kept, other, unrelated} and paths.KEEP_PER_NAME == 4
    os.utime(written, (1e9, 1e9))
    select._cached_shipped(path, select._stamp(path))  # read back: marked used
    assert written.stat().st_mtime > 1.5e9


def test_a_tables_rooflines_made_all_at_once_are_the_ones_made_one_row_at_a_time():
    """A table's rows are interpolated relative to their rooflines, made for all the rows of a kernel in one
    numpy call (tables/lookup.py): bit for bit the roofline of each row alone, on every shipped table and GPU,
    GEMMs and FlashAttention both; one shape alone still gives a Python float."""
    from collections import defaultdict

    import numpy as np

    from simulator.hardware.gpus import gpu_catalogue
    from simulator.tables.lookup import SHAPED
    from simulator.tables.select import shipped_tables

    checked = set()
    for path in shipped_tables().values():
        kinds = defaultdict(list)
        for r in read_table(path).kernels:
            if r.op in SHAPED:
                kinds[(r.op, r.direction if r.op == "flash_attention" else "", r.dtype)].append(r)
        for gpu in gpu_catalogue().values():
            for (op, _, dtype), rows in kinds.items():
                if op == "flash_attention" and gpu.flash_attention_efficiency is None:
                    continue
                shapes = [np.array([getattr(r, f) for r in rows]) for f in ("m", "n", "k", "batch")]
                at_once = shape_roofline_s(gpu, op, rows[0].direction, dtype, *shapes)
                alone = [shape_roofline_s(gpu, op, r.direction, dtype, r.m, r.n, r.k, r.batch) for r in rows]
                assert at_once.tolist() == alone
                assert all(type(x) is float for x in alone)
                checked.add(op)
    assert checked >= {"gemm", "flash_attention"}
