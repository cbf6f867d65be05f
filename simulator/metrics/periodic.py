"""Periodic schedules: simulate three micro-batch counts, extrapolate the iteration's.

Once a pipeline is full, each further micro-batch adds the same work to every stage and the same time to the
iteration: 1F1B's steady state repeats one forward and one backward per stage, so its iteration takes
(m + p - 1) x (t_f + t_b) with uniform stages (Narayanan et al. SC21, Sec. 2.2), and interleaved 1F1B, GPipe,
DeepSpeed's TrainSchedule and gradient accumulation without a pipeline repeat likewise. Every total a run adds
up (``metrics.measure``: seconds, FLOPs, bytes, counts, memory) is then a linear function of the micro-batch
count m, and every rate and fraction a ratio of such totals.

So a run of m micro-batches per pipeline is simulated at m1 < m2 < m3 (the pipeline depth p and one and two
micro-batches more where the schedule repeats every micro-batch; else one, two and three times p), every total is
checked to lie on one line through the three runs (within ``RELATIVE`` of its size), and evaluated at m. A total
that is not on its line (a schedule that is not periodic yet, a memory term that saturates between the samples)
raises :class:`NotPeriodic`; the caller then moves the window on by one pipeline depth (two more tries), and
simulates every micro-batch when none is periodic. The extrapolated numbers equal the full simulation's to float
rounding (tests/test_periodic.py); simulated work then grows with the pipeline depth, not with depth x
micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

RELATIVE = 1e-7  # float rounding of sums over 10^5 tasks is ~1e-13; a transient would show far above this


class NotPeriodic(Exception):
    """A total is not linear in the micro-batch count over the sampled runs."""


# Schedules whose steady state repeats every micro-batch (each stage one forward and one backward, or GPipe's
# forward and backward passes a micro-batch longer): their runs can be sampled one micro-batch apart. Interleaved
# 1F1B cycles through its chunks in groups of p micro-batches and DualPipe pairs micro-batches from both ends:
# theirs are sampled a pipeline depth apart.
EVERY_MICROBATCH = ("1f1b", "gpipe", "deepspeed", "zb-h1")


def sample_windows(
    microbatches: int, pipeline_parallel: int, tries: int = 3, step: int | None = None
) -> list[tuple[int, int, int]]:
    """The micro-batch counts to simulate instead of ``microbatches``: (u, u + step, u + 2 step), u the pipeline
    depth (at least 2) and ``step`` u by default, then the window moved on by u while the first is not periodic
    yet (interleaved 1F1B's warm-up holds 2(p-1) + (v-1)p chunks, more than p micro-batches' worth: Megatron-LM
    ``forward_backward_pipelining_with_interleaving``); only windows under half of ``microbatches``, where
    they save work. ``step=1`` for a schedule whose steady state repeats every micro-batch
    (``EVERY_MICROBATCH``): from the u-th micro-batch on, each adds the same totals, so three runs a
    micro-batch apart find the line, at a third of the micro-batches (64 stages: 64, 65 and 66, not 64, 128 and
    192)."""
    unit = max(pipeline_parallel, 2)
    step = unit if step is None else step
    windows = [(k * unit, k * unit + step, k * unit + 2 * step) for k in range(1, tries + 1)]
    return [w for w in windows if microbatches > 2 * w[-1]]


# What one more replay costs beside the micro-batches it replays (its program built, its metrics measured, the SM
# contention's second pass), in micro-batches replayed: 7-533 on the shipped scenarios, 20-145 where the periodic
# replay is what gains (benchmarks/warm_vs_commit.py replay_overhead: a run's wall time as a + b x m). 40, not
# the 32 it was while runs sat a pipeline depth apart: GPT-3 175B 3D (8 stages, 128 micro-batches) would sample
# 8 + 9 + 10 + 3 x 32 = 123 and run 1.07x its full replay.
REPLAY_COST_MICROBATCHES = 40


def worth_it(microbatches: int, windows: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The leading windows whose runs cost less than replaying every micro-batch: a window is tried only while
    the micro-batches replayed so far, with it, and REPLAY_COST_MICROBATCHES more for each run, are at most
    ``microbatches``. On every shipped scenario that picks the faster of the two replays (it ran periodically
    wherever its largest count was under half the micro-batches, up to 2.2x a full replay's time)."""
    kept, seen = [], set()
    for window in windows:
        runs = seen | set(window)
        if sum(runs) + REPLAY_COST_MICROBATCHES * len(runs) > microbatches:
            break
        kept.append(window)
        seen = runs
    return kept


def extrapolate(samples: Sequence[tuple[int, Any]], m: int, path: str = "") -> Any:
    """The tree of totals at ``m`` micro-batches from the same tree at three counts ``(m_i, tree_i)``: numbers
    on their line, everything else (names, flags, dictionary keys) unchanged across the samples."""
    (m1, a), (m2, b), (m3, c) = samples
    if isinstance(a, bool) or a is None or isinstance(a, str):
        if not a == b == c:
            raise NotPeriodic(f"{path} differs between the sampled runs ({a!r}, {b!r}, {c!r})")
        return a
    if isinstance(a, int | float):
        s1, s2 = (b - a) / (m2 - m1), (c - b) / (m3 - m2)
        scale = max(abs(a), abs(b), abs(c))
        if abs(s2 - s1) * (m3 - m1) > RELATIVE * scale + 1e-12:
            raise NotPeriodic(
                f"{path} is not linear in the micro-batches: {a!r}, {b!r}, {c!r} at {m1}, {m2}, {m3}"
            )
        value = c + s2 * (m - m3)
        return round(value) if isinstance(a, int) else value
    if isinstance(a, dict):
        if not a.keys() == b.keys() == c.keys():
            raise NotPeriodic(f"{path}: different entries between the sampled runs")
        return {k: extrapolate(((m1, a[k]), (m2, b[k]), (m3, c[k])), m, f"{path}.{k}") for k in a}
    if isinstance(a, list | tuple):
        if not len(a) == len(b) == len(c):
            raise NotPeriodic(f"{path}: different lengths between the sampled runs")
        out = [
            extrapolate(((m1, x), (m2, y), (m3, z)), m, f"{path}[{i}]")
            for i, (x, y, z) in enumerate(zip(a, b, c, strict=True))
        ]
        return type(a)(out)
    raise TypeError(f"{path}: cannot extrapolate a {type(a).__name__}")
