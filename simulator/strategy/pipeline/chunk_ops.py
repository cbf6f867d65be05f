"""The ops of one model chunk's forward, backward and weight-gradient steps, with the transfers to the
neighbouring stages (Narayanan et al. SC21 Sec. 4.1: with tensor parallelism each rank sends 1/t of the
activation and the receiver all-gathers it)."""

from __future__ import annotations

from simulator.scenario.schema import Scenario
from simulator.strategy.units import Unit
from simulator.workload.ops import Op, collective_op
from simulator.workload.recompute import chunk_policies
from simulator.workload.transformer import Workload


def ops_of(
    pieces: tuple[list[Piece], list[Piece]], split: bool
) -> tuple[tuple[Op, ...], tuple[Op, ...], tuple[Op, ...]]:
    """(forward, backward, weight-gradient) ops of a chunk's pieces (``chunk_pieces``); ``split``: weight
    gradients as steps of their own."""
    f, b = pieces
    fwd = [op for part in f for op in part[1]]
    bwd: list[Op] = []
    wgt: list[Op] = []
    for _, ops in b:
        for op in ops:
            (wgt if split and op.name.endswith(" wgrad") else bwd).append(op)
    return tuple(fwd), tuple(bwd), tuple(wgt)


Piece = tuple[bool, tuple[Op, ...]]  # (a transformer layer's ops?, the ops)


def chunk_pieces(
    s: Scenario,
    w: Workload,
    us: list[Unit],
    key: tuple[int, int],
    pp: int,
    v: int,
    sends: bool = True,
    ends: tuple[bool, bool] | None = None,
) -> tuple[list[Piece], list[Piece]]:
    """A chunk's forward and backward ops in the order they run, in pieces: what comes before the layers (the
    micro-batch's setup, the pipeline regather), each unit (embedding, layers, output layer; backward: its
    recomputation and backward), and the send. ``ends``: (receives its input from another rank, sends its output
    to another rank), as ``pipeline/route.py`` says; by default every chunk but the model's first and last."""
    st, c = key
    par, mdl = s.parallelism, s.model
    t = par.tensor_parallel
    e = 4 if s.training.precision == "fp32" else 2
    act = s.training.micro_batch_size * (mdl.seq_length // par.context_parallel) * mdl.hidden_size * e
    scatter_gather = t > 1 and not par.sequence_parallel  # Narayanan Sec. 4.1: send 1/t, all-gather after
    send = collective_op("pipeline send", "send_recv", "pp", send_bytes(s)) if sends else None
    regather = (
        collective_op("tp all-gather (pipeline scatter/gather)", "all_gather", "tp", act)
        if scatter_gather
        else None
    )
    first, last = st == 0 and c == 0, st == pp - 1 and c == v - 1
    if ends is not None:
        first, last = not ends[0], not ends[1]

    # every forward step calls get_batch (pretrain_gpt.py)
    head = (*w.microbatch_setup, *((regather,) if not first and regather is not None else ()))
    fwd: list[Piece] = [(False, head)]
    fwd += [(u.is_layer, tuple(u.block.forward)) for u in us]
    if not last and send is not None:
        fwd.append((False, (send,)))
    bwd: list[Piece] = [(False, () if last or regather is None else (regather,))]
    layers = [u for u in us if u.is_layer]
    policy = dict(zip((id(u) for u in layers), chunk_policies(s, len(layers)), strict=True))
    for u in reversed(us):
        again = u.block.recompute_ops(policy[id(u)]) if u.is_layer else ()
        bwd.append((u.is_layer, (*again, *u.block.backward)))
    if not first and send is not None:
        bwd.append((False, (send,)))
    return fwd, bwd


def send_bytes(s: Scenario) -> float:
    """Bytes one rank sends to the next stage per micro-batch: the activation (or its gradient), 1/t of it with
    tensor parallelism (sequence-parallel shards, or Narayanan's scatter / gather)."""
    par, mdl = s.parallelism, s.model
    e = 4 if s.training.precision == "fp32" else 2
    act = s.training.micro_batch_size * (mdl.seq_length // par.context_parallel) * mdl.hidden_size * e
    return act / par.tensor_parallel
