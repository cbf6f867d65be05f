"""DualPipe and DualPipeV (DeepSeek-V3 technical report, arXiv 2412.19437 Sec. 3.2.1; the code is the
specification: deepseek-ai/DualPipe at 3da1bbe, ``dualpipe/dualpipe.py`` and ``dualpipe/dualpipev.py``,
``step``): the order of one rank's compute, transcribed from the eight loops of ``step``.

Each rank holds two model chunks, ``phase`` 0 and 1:
- **DualPipe** (bidirectional): the model is split into ``p`` stages; rank r holds stage r for the micro-batches
  that enter at rank 0 (phase 0) and stage p - 1 - r for those that enter at rank p - 1 (phase 1), half of the
  batch each way. Every stage's parameters are held twice (ranks r and p - 1 - r), and the two copies' gradients
  are summed after the flush (``examples/example_dualpipe.py`` checks ``p0.grad + p1all[pp_size - 1 - rank]``).
- **DualPipeV** ("cut-in-half", Sea AI Lab): the model is split into 2p stages in a V: rank r holds stage r
  (phase 0) and stage 2p - 1 - r (phase 1); the last rank hands its phase-0 output to its own phase 1
  (``input_chunks[1].append(output.detach())``) and rank 0 computes the loss.

What a rank runs (``Step`` kinds): ``F`` a forward chunk; ``B`` a whole backward (input and weight gradients);
``I`` a backward with ``enable_zb``, whose weight gradients go to ``WeightGradStore`` and run at a later ``W``
(first in, first out: ``WeightGradStore.pop``). ``_forward_backward_chunk`` runs one chunk's forward beside another
micro-batch's whole backward (``overlapped_forward_backward``): one task of two steps. Step ids count each phase's
micro-batches from 0 (``current_f_chunk_id[phase]``): DualPipe has m / 2 a direction, DualPipeV m through both.
"""

from __future__ import annotations

from functools import cache

from simulator.strategy.schedules.step import Step


def position(name: str, p: int, stage: int, chunk: int) -> tuple[int, int]:
    """(chain, position) of a rank's chunk: the micro-batch's path through the model, and how far along it."""
    if name == "dualpipev":
        return 0, stage if chunk == 0 else 2 * p - 1 - stage
    return chunk, stage if chunk == 0 else p - 1 - stage


def schedule_of(name: str):
    def schedule(p: int, m: int, v: int, stage: int) -> list[Step]:
        return [step for task in tasks(name, p, m, stage) for step in task]

    return schedule


@cache
def tasks(name: str, p: int, m: int, stage: int) -> tuple[tuple[Step, ...], ...]:
    """The rank's tasks in ``step``'s order: one step each, or a forward and a backward run as one."""
    v_shape = name == "dualpipev"
    rank = stage
    if v_shape:
        half_rank, half_ranks, chunks = rank, p, m
        middle = rank == p - 1  # the last rank: its two chunks meet (is_last_rank in dualpipev.py)
        flip = 0
    else:
        half_ranks, chunks = p // 2, m // 2
        half_rank = min(rank, p - 1 - rank)
        middle = rank in (p // 2 - 1, p // 2)
        flip = int(rank >= p // 2)  # is_in_second_half: the code's phase 0 is the reverse direction there
    f_id, b_id = [0, 0], [0, 0]
    weights: list[Step] = []  # WeightGradStore, first in first out
    out: list[tuple[Step, ...]] = []

    def fwd(phase: int) -> Step:
        ph = phase ^ flip
        f_id[ph] += 1
        return Step("F", f_id[ph] - 1, ph)

    def bwd(phase: int, zb: bool = False) -> Step:
        ph = phase ^ flip
        b_id[ph] += 1
        if zb:
            weights.append(Step("W", b_id[ph] - 1, ph))
            return Step("I", b_id[ph] - 1, ph)
        return Step("B", b_id[ph] - 1, ph)

    def weight() -> None:
        out.append((weights.pop(0),))

    for _ in range((half_ranks - half_rank - 1) * 2):  # step 1: nF0
        out.append((fwd(0),))
    for _ in range(half_rank + 1):  # step 2: nF0F1
        out.append((fwd(0),))
        out.append((fwd(1),))
    for _ in range(half_ranks - half_rank - 1):  # step 3: nB1W1F1 (zero bubble)
        out.append((bwd(1, zb=True),))
        weight()
        out.append((fwd(1),))
    for i in range(chunks - 2 * half_ranks + half_rank + 1):
        # step 4 (main): nF0B1F1B0; the middle rank's first forward and backward run apart
        if i == 0 and middle:
            out.append((fwd(0),))
            out.append((bwd(1),))
        else:
            out.append((fwd(0), bwd(1)))
        out.append((fwd(1), bwd(0)))
    for _ in range(half_ranks - half_rank - 1):  # step 5: nB1F1B0
        out.append((bwd(1),))
        out.append((fwd(1), bwd(0)))
    zb = False
    for i in range(half_rank + 1):  # step 6: nB1B0, the second half zero-bubble
        if i == (half_rank + 1) // 2 and half_rank % 2 == 1:
            zb = True
        out.append((bwd(1, zb),))
        if i == (half_rank + 1) // 2 and half_rank % 2 == 0:
            zb = True
        out.append((bwd(0, zb),))
    for _ in range(half_ranks - half_rank - 1):  # step 7: nWB0 (zero bubble)
        weight()
        out.append((bwd(0, zb=True),))
    for _ in range(half_rank + 1):  # step 8: nW
        weight()
    if weights:
        raise AssertionError("WeightGradStore not empty")  # the code's own assert
    return tuple(out)
