"""``clustersim calibrate kernels``: time, on this machine, every kernel shape and collective a scenario's
simulation costs, and write them as a cost table.

What is measured and how: ``simulator/calibration/torch_ops.py``. The table is written every few seconds
(atomically) and once more when interrupted, and a second run with the same ``--out`` keeps every row it finds
and measures only the rest, so an interrupted calibration resumes.
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from simulator.calibration.shapes import CollectiveShape, KernelShape, costed_shapes
from simulator.errors import ScenarioError
from simulator.hardware.topology import cluster_spec
from simulator.scenario.schema import Scenario
from simulator.tables.format import (
    DTYPE_BYTES,
    CollectiveRow,
    CostTable,
    DeviceInfo,
    KernelRow,
    SourceInfo,
    SystemInfo,
    TableMeta,
)
from simulator.tables.io import read_existing, write_table
from simulator.tables.lookup import SHAPED, work

SAVE_EVERY_S = 5.0
DEFAULT_MAX_BYTES = {"cpu": 2**30, "cuda": 8 * 2**30}  # largest memory-bound working set timed whole
MAX_LOCAL_RANKS_CPU = 8

Progress = Callable[[int, int, str], None]  # (done, total, what is being measured)


@dataclass
class Summary:
    table: CostTable
    measured: int = 0  # rows measured by this run
    kept: int = 0  # rows found from an earlier run
    skipped: list[str] = field(default_factory=list)  # shapes not measured here, with the reason
    interrupted: bool = False
    estimate_s: float = 0.0  # what the shapes to time were expected to take (a probe of this device)
    left: int = 0  # shapes not timed when the --budget ran out (a later run goes on from the table)


def require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ScenarioError(
            "calibrate kernels needs PyTorch: pip install 'clustersim[calibrate]' (on a GPU node), or "
            "pip install torch for a CPU-only run"
        ) from None


def _scaled(shape: KernelShape, max_bytes: float) -> KernelShape:
    """A memory-bound kernel too large to time whole is timed on fewer rows (the lookup keeps the largest
    measured size's bandwidth above it, so the row still serves the full size)."""
    if shape.op in SHAPED:
        return shape
    # bytes per row: fp32 parameter, gradient and two Adam states; else a few fp32 tensors of the row
    per_row = shape.n * (16 if shape.op in ("adam_step", "sgd_step") else 4 * 4)
    if shape.m * per_row <= max_bytes:
        return shape
    m = max(1, int(max_bytes // per_row))
    return KernelShape(shape.op, shape.direction, shape.dtype, m, shape.n, shape.k, shape.batch, shape.name)


def _meta(s: Scenario, out: Path, device: str, old: TableMeta | None) -> TableMeta:
    import torch

    spec = cluster_spec(s)
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else ""
        dev = DeviceInfo(
            model=props.name,
            memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda or "",
            pytorch=torch.__version__,
            nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        )
        # collective rows describe this node's fabric, which the scenario's cluster is taken to describe
        system = SystemInfo(topology=spec.name, intra_node=spec.node.intra_node)
        gpu = spec.node.gpu
    else:
        dev = DeviceInfo(model=platform.processor() or platform.machine(), pytorch=torch.__version__)
        system = SystemInfo(topology="cpu (gloo over loopback)", intra_node="cpu")
        gpu = "cpu"
    if old is not None and old.device.model != dev.model:
        raise ScenarioError(
            f"--out {out}: holds a table measured on '{old.device.model}', this machine is '{dev.model}'; "
            "choose another directory"
        )
    return TableMeta(
        name=out.name,
        gpu=gpu,
        description=f"Kernels and collectives of scenario '{s.name}', measured on {platform.node()}.",
        device=dev,
        system=system,
        date=datetime.date.today().isoformat(),
        method=(
            f"clustersim calibrate kernels --device {device}: PyTorch {torch.__version__}, "
            + (
                "CUDA events around 5 calls queued behind a GPU spin (kernel time without launch gaps), 3 "
                "warm-up calls, median of the samples, L2 written over before memory-bound kernels; "
                "collectives: NCCL, slowest rank after a barrier"
                if device == "cuda"
                else "wall time, 3 warm-up calls, median of the timed calls; collectives: gloo over loopback"
            )
        ),
        sources=(
            SourceInfo(rows="all", source=f"measured on {platform.node()}", licence="the measurer's own"),
        ),
        covers="The distinct shapes of the scenario's simulated iteration that could be measured on this machine.",
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _measure_collectives(
    groups: dict[int, list[CollectiveShape]], device, dtype, repeats, on_row, progress, over_budget
) -> None:
    """One set of processes per group size; rows arrive as each size is timed; no new group starts once
    ``over_budget()`` says the time is spent."""
    import torch.multiprocessing as mp

    from simulator.calibration.torch_ops import collective_worker

    ctx = mp.get_context("spawn")
    for n, shapes in groups.items():
        if over_budget():
            raise _BudgetSpent
        queue = ctx.Queue()
        work = [(shape.key, shape.op, shape.bytes) for shape in shapes]
        port = _free_port()
        procs = [
            ctx.Process(target=collective_worker, args=(r, n, port, device, dtype, work, repeats, queue))
            for r in range(n)
        ]
        for p in procs:
            p.start()
        by_key = {shape.key: shape for shape in shapes}
        try:
            for _ in shapes:
                key, us, spread, error = queue.get(timeout=600)
                on_row(by_key[key], us, spread, error)
                progress(by_key[key])
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.terminate()


class _BudgetSpent(Exception):
    pass


# Per timed call beyond the kernel's own time: the launch (GPU) or Python dispatch (CPU), and, for memory-bound
# kernels, the L2 flush of twice the cache before each (torch_ops.time_call); a collective group's processes
# take seconds to spawn and join
CALL_OVERHEAD_S = {"cuda": 15e-6, "cpu": 30e-6}
FLUSH_BYTES = 2 * 50 * 2**20
GROUP_START_S = 5.0


def probe(device: str) -> tuple[float, float]:
    """(FLOP/s of a 1,024-cube matmul, bytes/s of a 64 MiB copy) on ``device``: what the estimate scales by."""
    import torch

    def synchronize(device: str) -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(1024, 1024, dtype=dtype, device=device)
    x = torch.empty(16 * 2**20, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    rates = []
    for fn, amount in ((lambda: a @ a, 2 * 1024**3), (lambda: y.copy_(x), 2 * x.numel() * 4)):
        fn()
        synchronize(device)
        t = time.perf_counter()
        for _ in range(3):
            fn()
        synchronize(device)
        rates.append(3 * amount / max(time.perf_counter() - t, 1e-9))
    return rates[0], rates[1]


def estimate_s(kernels, groups, device: str, repeats: int, rates: tuple[float, float]) -> float:
    """Seconds the shapes should take here: each kernel's work at the probed rate (GEMM-like ops by FLOPs,
    the rest by bytes moved), plus per-call overhead, for the warm-up and timed calls; each collective group's
    start, and each size's bytes at the copy rate."""
    from simulator.calibration.torch_ops import MEMORY_BOUND, WARMUP

    flops, bandwidth = rates
    calls = WARMUP + repeats
    total = 0.0
    for sh in kernels:
        if sh.op in SHAPED:
            seconds = work(sh.op, sh.direction, sh.m, sh.n, sh.k, sh.batch) / flops
        else:
            seconds = 3 * sh.m * sh.n * sh.batch * DTYPE_BYTES.get(sh.dtype, 4) / bandwidth
        flush = FLUSH_BYTES / bandwidth if sh.op in MEMORY_BOUND else 0.0
        total += calls * (seconds + flush + CALL_OVERHEAD_S[device])
    for shapes in groups.values():
        total += GROUP_START_S + sum(calls * (2 * sh.bytes / bandwidth + 50e-6) for sh in shapes)
    return total


def calibrate_kernels(
    s: Scenario,
    out: Path,
    device: str = "cpu",
    repeats: int = 20,
    max_bytes: float | None = None,
    progress: Progress | None = None,
    collectives: bool = True,
    budget_s: float | None = None,
    announce: Callable[[Summary, int], None] | None = None,
) -> Summary:
    """Time the shapes ``s`` costs that ``out`` lacks, saving as it goes. ``announce(summary, shapes)`` is told
    the estimate before the first is timed; past ``budget_s`` seconds no new shape starts (what is timed is
    saved, and a later run goes on from it)."""
    require_torch()
    import torch

    from simulator.calibration.torch_ops import MEMORY_BOUND, Interrupted, kernel_call, time_call

    if device == "cuda" and not torch.cuda.is_available():
        raise ScenarioError("--device cuda: PyTorch sees no CUDA device here (use --device cpu)")
    max_bytes = max_bytes or DEFAULT_MAX_BYTES[device]
    old = read_existing(out)
    meta = _meta(s, out, device, old.meta if old else None)
    kernels = list(old.kernels) if old else []
    colls = list(old.collectives) if old else []
    summary = Summary(CostTable(meta, kernels, colls, out), kept=len(kernels) + len(colls))
    have_k, have_c = {r.key for r in kernels}, {r.key for r in colls}

    k_shapes, c_shapes = costed_shapes(s)
    todo_k = [sh for sh in (_scaled(x, max_bytes) for x in k_shapes) if sh.key not in have_k]
    todo_k = list({sh.key: sh for sh in todo_k}.values())
    capacity = (
        torch.cuda.device_count() if device == "cuda" else min(os.cpu_count() or 1, MAX_LOCAL_RANKS_CPU)
    )
    groups: dict[int, list[CollectiveShape]] = {}
    for sh in c_shapes if collectives else ():
        if sh.key in have_c:
            continue
        if sh.nodes > 1 or sh.ranks > capacity:
            summary.skipped.append(
                f"{sh.op} on {sh.ranks} ranks over {sh.nodes} node(s): this machine runs {capacity} local ranks "
                "(import nccl-tests results for it)"
            )
            continue
        groups.setdefault(sh.ranks, []).append(sh)
    total = len(todo_k) + sum(len(v) for v in groups.values())
    if total:
        summary.estimate_s = estimate_s(todo_k, groups, device, repeats, probe(device))
    if announce:
        announce(summary, total)
    done, last_save = 0, time.monotonic()
    started = time.monotonic()
    tell = progress or (lambda *_: None)

    def over_budget() -> bool:
        return budget_s is not None and time.monotonic() - started > budget_s

    def save(force: bool = False) -> None:
        nonlocal last_save
        if force or time.monotonic() - last_save > SAVE_EVERY_S:
            write_table(out, summary.table)
            last_save = time.monotonic()

    try:
        for sh in todo_k:
            if over_budget():
                raise _BudgetSpent
            tell(done, total, f"{sh.op} {sh.direction} {sh.m}x{sh.n}x{sh.k}")
            stop = None
            try:
                fn = kernel_call(sh.op, sh.direction, sh.dtype, sh.m, sh.n, sh.k, sh.batch, device)
                us, spread, host, samples = time_call(fn, device, repeats, flush=sh.op in MEMORY_BOUND)
            except Interrupted as e:  # Ctrl-C mid-shape: its finished samples make the row, then stop
                (us, spread, host, samples), stop = e.partial, e
            except (RuntimeError, ValueError) as e:  # out of memory, or an op this PyTorch lacks
                summary.skipped.append(f"{sh.op} {sh.m}x{sh.n}x{sh.k}: {str(e).splitlines()[0][:120]}")
                done += 1
                save()
                continue
            row = (sh.op, sh.dtype, sh.m, sh.n, sh.k, sh.batch, us, sh.direction, samples, round(spread, 1))
            kernels.append(KernelRow(*row, host, sh.name))
            summary.measured += 1
            if stop is not None:
                raise KeyboardInterrupt
            done += 1
            save()

        def on_row(sh: CollectiveShape, us: float, spread: float, error: str) -> None:
            if error:
                summary.skipped.append(f"{sh.op} on {sh.ranks} ranks: {error}")
                return
            dtype = s.training.dtype if device == "cuda" else "fp32"
            colls.append(
                CollectiveRow(
                    sh.op,
                    sh.ranks,
                    sh.nodes,
                    sh.ranks_per_node,
                    sh.bytes,
                    us,
                    repeats,
                    round(spread, 1),
                    dtype,
                )
            )
            summary.measured += 1

        def counted(sh: CollectiveShape) -> None:
            nonlocal done
            done += 1
            tell(done, total, f"{sh.op} on {sh.ranks} ranks, {sh.bytes / 2**20:.2f} MiB")
            save()

        if groups:
            _measure_collectives(groups, device, s.training.precision, repeats, on_row, counted, over_budget)
    except KeyboardInterrupt:
        summary.interrupted = True
    except _BudgetSpent:
        summary.left = total - done
    if kernels or colls:
        save(force=True)
    return summary
