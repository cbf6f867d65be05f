"""One rank's training step read from a PyTorch profiler (Kineto) Chrome trace: ``clustersim calibrate step
--trace``.

The step is what ``torch.profiler.profile.step()`` marks: each call closes a ``ProfilerStep#N`` span on the host
(torch/profiler/profiler.py, ``_KinetoProfile`` / ``profile.step``: ``record_function("ProfilerStep#" +
str(step_num))``, category ``user_annotation``, ``cpu_op`` in PyTorch before 2.0). The host span of a step is the
wall time between two ``step()`` calls: what throughput counts when the loop synchronises once a step (the loss's
``.item()``, the optimizer's grad-norm check). With three or more steps the first is left out (warm-up: the
allocator, NCCL communicators and cuDNN autotuning run in it). The step time is the median of the rest.

A trace with no ``ProfilerStep`` spans (a profiler used without ``step()``) counts one step from its first GPU
kernel's start to its last one's end: a lower bound, as it leaves out the host time before the first kernel.

Within the steps it counts, the GPU computes where any kernel other than NCCL's, a copy or a memset runs (the
union over streams); where only NCCL's kernels run, communication is exposed (they occupy the GPU while they wait
for their peers); where nothing runs, the GPU is idle (the host still issuing kernels, a wait on the data loader).
The simulation reports the same three: its compute stream's busy time, its exposed communication, the rest.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from simulator.calibration.importers.kineto import load_trace
from simulator.errors import ScenarioError

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
NCCL_PREFIXES = ("ncclKernel", "ncclDevKernel")


@dataclass(frozen=True)
class TracedStep:
    step_s: float  # the step time (median of the steps counted)
    steps: int  # how many steps it is the median of
    how: str  # where it came from, said in the profile's provenance
    compute_s: float  # per step: a kernel other than NCCL's, a copy or a memset running
    nccl_only_s: float  # per step: only NCCL kernels running (communication not hidden under compute)

    @property
    def idle_s(self) -> float:
        """Per step: nothing running on the GPU (the host still issuing, or waiting on data)."""
        return max(self.step_s - self.compute_s - self.nccl_only_s, 0.0)


def _union_s(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds covered by the (start, end) intervals in microseconds, clipped to [lo, hi]."""
    covered, reach = 0.0, lo
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            covered += end - start
            reach = end
    return covered / 1e6


def _span(e: dict) -> tuple[float, float] | None:
    ts, dur = e.get("ts"), e.get("dur")
    if any(isinstance(x, bool) or not isinstance(x, int | float) for x in (ts, dur)):
        return None
    if not (0 <= dur < 1e15 and -1e18 < ts < 1e18):  # finite, as a profiler writes them (microseconds)
        return None
    return float(ts), float(ts) + float(dur)


def read_step(path: Path) -> TracedStep:
    """The traced step's time and GPU activity; one clear error for a trace that has neither steps nor kernels."""
    events, _ = load_trace(path)
    steps, gpu, nccl = [], [], []
    for e in events:
        name, cat, span = e.get("name"), e.get("cat"), _span(e)
        if span is None or not isinstance(name, str) or e.get("ph") != "X":
            continue
        if name.startswith("ProfilerStep#") and cat != "gpu_user_annotation":
            steps.append(span)
        elif cat in GPU_CATEGORIES:
            (nccl if name.startswith(NCCL_PREFIXES) else gpu).append(span)
    if not gpu and not nccl:
        raise ScenarioError(f"{path}: no GPU kernels in the trace (a CPU-only trace cannot time a GPU step)")
    steps.sort()
    if len(steps) >= 3:
        counted, how = (
            steps[1:],
            f"median of {len(steps) - 1} ProfilerStep spans, the first of {len(steps)} left out",
        )
    elif steps:
        counted, how = steps, f"median of {len(steps)} ProfilerStep span{'s' if len(steps) > 1 else ''}"
    else:
        every = gpu + nccl
        counted = [(min(s for s, _ in every), max(e for _, e in every))]
        how = "first GPU kernel to last (no ProfilerStep spans: a lower bound, the host's lead-in left out)"
    step_s = statistics.median(end - start for start, end in counted) / 1e6
    if not step_s > 0:
        raise ScenarioError(f"{path}: the traced step lasts 0 s")
    lo, hi = counted[0][0], counted[-1][1]
    busy = _union_s(gpu + nccl, lo, hi) / len(counted)
    compute = _union_s(gpu, lo, hi) / len(counted)
    return TracedStep(step_s, len(counted), how, compute, max(busy - compute, 0.0))
