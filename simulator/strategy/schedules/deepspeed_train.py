"""DeepSpeed's ``TrainSchedule`` (deepspeed/runtime/pipe/schedule.py, v0.16.4): the instructions one stage runs.

Stages move in lock-step: step t of ``2 (m + p - 1)`` is a forward on stages whose parity matches t's and a
backward on the others. The communication of a step comes before its compute, and an activation is sent one
step after it was computed: a forward step first sends the previous backward's gradient and receives its
input; a backward step first receives its output gradient and then sends the previous forward's activation.
Every send and receive blocks (deepspeed/runtime/pipe/p2p.py), so a transfer starts when both stages reach it.
"""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    kind: str  # F | B | send_act | recv_act | send_grad | recv_grad | load
    microbatch: int


def _step_to_micro_batch(step: int, stage: int, stages: int) -> tuple[int, bool]:
    """TrainSchedule._step_to_micro_batch and its four helpers."""
    even_step, even_stage = step % 2 == 0, stage % 2 == 0
    if even_step and even_stage:
        return step // 2 - stage // 2, True
    if not even_step and not even_stage:
        return (step - 1) // 2 - stage // 2, True
    if even_step and not even_stage:
        return step // 2 - stages + (stage + 1) // 2, False
    return (step - 1) // 2 - stages + 1 + stage // 2, False


def commands(stages: int, micro_batches: int, stage: int) -> list[Command]:
    """The instructions of ``TrainSchedule.steps()`` for one stage, without the final ReduceTiedGrads,
    ReduceGrads and OptimizerStep (every stage ends with them)."""

    def valid(mb: int) -> bool:
        return 0 <= mb < micro_batches

    prev_stage, next_stage = stage - 1, stage + 1
    has_prev, has_next = prev_stage >= 0, next_stage < stages
    out: list[Command] = []
    prev = -1
    for step in range(2 * (micro_batches + stages - 1)):
        mb, forward = _step_to_micro_batch(step, stage, stages)
        if forward:
            if valid(prev) and has_prev:
                out.append(Command("send_grad", prev))
            if valid(mb) and has_prev:
                out.append(Command("recv_act", mb))
        else:
            if valid(mb) and has_next:
                out.append(Command("recv_grad", mb))
            if valid(prev) and has_next:
                out.append(Command("send_act", prev))
        if (stage == 0 or stage == stages - 1) and forward and valid(mb):
            out.append(Command("load", mb))
        if valid(mb):
            out.append(Command("F" if forward else "B", mb))
        prev = mb
    return out


def num_pipe_buffers(stages: int, micro_batches: int, stage: int) -> int:
    """TrainSchedule.num_pipe_buffers: microbatches whose activations a stage keeps at once."""
    return max(2, min(stages - stage, micro_batches))
