"""The loss's allocations and frees, as torch's profiler records them, beside the sequences the simulator replays
(simulator/workload/loss.py LOSS_TENSORS).

torchtitan's loss on its output layer's logits, then ``del pred`` and backward (train.py @9dec370): eager
``F.cross_entropy(pred.float(), labels)``, and the same under ``loss_parallel`` (a one-rank gloo mesh: the same
aten ops as on 8 ranks, the collectives of one rank). On the CPU: the ops are a GPU's; the matmul's CPU scratch,
allocated and freed inside the op, is left out. Sizes are printed in bytes per logit, with the running total, and
each sequence is replayed on the caching allocator's best fit (workload/allocator.py).

    python benchmarks/loss_allocations.py      # needs torch (pip install torch==2.13.0)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from allocator_trace import events  # noqa: E402

from simulator.workload.allocator import replay  # noqa: E402
from simulator.workload.loss import LOSS_BYTES  # noqa: E402

TOKENS, VOCAB, HIDDEN = 512, 1000, 8  # the logits dwarf everything else (the weight is 1/32 byte per logit)


def step(parallel: bool) -> None:
    h = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (TOKENS,))
    pred = F.linear(h, w)
    if parallel:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard
        from torch.distributed.tensor.parallel import loss_parallel

        pred = DTensor.from_local(pred, init_device_mesh("cpu", (1,)), [Shard(-1)])
        with loss_parallel():
            loss = F.cross_entropy(pred.float(), labels)
            del pred
            loss.backward()
        return
    loss = F.cross_entropy(pred.float(), labels)
    del pred
    loss.backward()


def traced(parallel: bool) -> list[tuple[str, float]]:
    step(parallel)  # warm-up
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(parallel)
    with tempfile.TemporaryDirectory() as tmp:
        ev = events(prof, Path(tmp) / "trace.json")
    logit = TOKENS * VOCAB
    # the logits' tensors only (the rest is a few hundred bytes per token), in bytes per logit
    sizes = {name[1:]: size for name, size in ev if name[0] == "+"}
    return [(name, round(sizes[name[1:]] / logit, 2)) for name, _ in ev if sizes[name[1:]] >= logit]


def main() -> None:
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    out = {}
    for kind, parallel in (("torch", False), ("torch-parallel", True)):
        seq = traced(parallel)
        total, shown = 0.0, []
        for name, size in seq:
            total += size if name[0] == "+" else -next(s for n, s in seq if n == "+" + name[1:])
            shown.append(f"{name[0]}{size:g} ({total:g})")
        allocated, held = replay([(n, s if n[0] == "+" else 0.0) for n, s in seq])
        out[kind] = {"traced": shown, "replayed": [allocated, held], "simulator": list(LOSS_BYTES[kind])}
        print(f"{kind}: {'  '.join(shown)}")
        print(f"  replayed: {allocated:g} allocated, {held:g} held; LOSS_TENSORS: {LOSS_BYTES[kind]}")
    dist.destroy_process_group()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
