"""What the first stage of torchtitan's pipelined Llama step allocates and holds, replayed from torch's profiler on
the CPU (benchmarks/allocator_trace.py events, simulator/workload/allocator.py), beside the simulation.

Stage 0 of torchtitan 9dec370's 3D layout as its parallelize_llama.py and pipeline_llama.py build it: the
embedding and the first blocks, tensor parallel with sequence parallelism (apply_tp), each block fully
recomputed (checkpoint_wrapper) and fully_shard-ed without resharding after forward (pipelining), bf16
parameters and fp32 reduction, run by torch.distributed.pipelining's Schedule1F1B over a fake process group (the
other stages' sends and receives move no data). Llama 3.1 405B narrowed with its proportions per rank kept:
width 2048, 16 heads of 128 with 8 key / value heads, FFN 3.25 x, vocabulary 7.83 x, 15 blocks, TP 8 x PP 8 x
DP 8, 8 micro-batches of 4,096 tokens (405B: 32,768).

    python benchmarks/pipeline_stage_trace.py          # needs torch (pip install torch==2.13.0); a few minutes
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from allocator_trace import events  # noqa: E402
from torchtitan_step import Transformer, apply_tp, data_moving_fakes, gib  # noqa: E402

from simulator.workload.allocator import replay  # noqa: E402


class FirstStage(Transformer):
    """torchtitan's model split for stage 0: the embedding and the first blocks, no final norm or output."""

    def __init__(self, a):
        super().__init__(a)
        self.norm, self.output = None, None

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        return h


def run(a) -> dict:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.profiler import ProfilerActivity, profile

    mesh = init_device_mesh("cpu", (a.pp, a.dp, a.tp), mesh_dim_names=("pp", "dp", "tp"))
    with torch.device("meta"):
        model = FirstStage(a)
    apply_tp(model, mesh["tp"], head=False)
    for name, block in list(model.layers.items()):
        model.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers.values():  # torchtitan: no resharding after forward under pipelining
        fully_shard(block, mesh=mesh["dp"], mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mesh=mesh["dp"], mp_policy=mp, reshard_after_forward=False)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, weight_decay=0.1, foreach=True)
    # static metadata (the fake group carries no shapes): tokens in, the sequence-sharded activation out, and its
    # gradient back from stage 1
    act = torch.empty(a.batch, a.seq // a.tp, a.dim, dtype=torch.bfloat16)
    stage = PipelineStage(
        model,
        0,
        a.pp,
        torch.device("cpu"),
        input_args=torch.empty(a.batch, a.seq, dtype=torch.long),
        output_args=act,
        output_grads=act,
        group=mesh["pp"].get_group(),
    )
    # and the gradient's metadata that stage 1 would send (a private hook of torch 2.13's stage.py: the fake group
    # cannot carry the object)
    from torch.distributed.pipelining.stage import _StageBackwardMeta, _TensorMeta

    meta = _TensorMeta(shape=act.shape, stride=act.stride(), dtype=act.dtype, requires_grad=False)
    stage._recv_meta = lambda src: _StageBackwardMeta(backward_metas=(meta,))
    # every stage's schedule gets the loss function (torchtitan passes it to all; without one the schedule runs
    # forward only); the first stage never calls it
    schedule = Schedule1F1B(
        stage, n_microbatches=a.microbatches, loss_fn=lambda out, target: out.float().mean()
    )
    tokens = torch.randint(0, a.vocab, (a.microbatches * a.batch, a.seq))
    rows = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(a.steps):
            schedule.step(tokens)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            opt.zero_grad()
    with tempfile.TemporaryDirectory() as tmp:
        ev = events(prof, Path(tmp) / "trace.json")
    if a.events:
        Path(a.events).write_text(json.dumps(ev))
    allocated, held = replay(ev)
    rows.append({"replayed_allocated_gib": gib(allocated), "replayed_held_gib": gib(held)})
    return {"config": vars(a), "runs": rows}


def simulated(a) -> float:
    """The simulation's peak allocation on the first stage of the same layout (126 layers split 15, 16 x 6, 15 as
    torchtitan splits the 405B), GiB."""
    from simulator import load_scenario, simulate

    s = load_scenario(
        {
            "name": "llama3-405b-narrow-3d",
            "framework": "pytorch-2024",
            "model": {
                "num_layers": 126, "hidden_size": a.dim, "num_attention_heads": a.heads,
                "num_query_groups": a.kv_heads, "ffn_hidden_size": a.ffn, "seq_length": a.seq,
                "vocab_size": a.vocab, "activation": "swiglu", "normalization": "rmsnorm",
                "position_embedding": "rope", "add_bias_linear": False, "attention": "flash",
                "tied_embeddings": False,
            },
            "cluster": {"topology": "dgx-h100", "num_nodes": a.pp * a.dp * a.tp // 8},
            "training": {
                "global_batch_size": a.microbatches * a.batch * a.dp, "micro_batch_size": a.batch,
                "precision": "bf16", "activation_recompute": "full",
            },
            "parallelism": {
                "tensor_parallel": a.tp, "sequence_parallel": True, "pipeline_parallel": a.pp,
                "data_parallel": a.dp, "pipeline_schedule": "1f1b", "first_pipeline_stage_layers": a.layers,
                "last_pipeline_stage_layers": a.layers, "fsdp": {"reshard_after_forward": False},
            },
        }
    )  # fmt: skip
    return round(simulate(s).metrics.stages[0]["memory_peak_gib"], 3)


def main() -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--events", help="write the replayed events here (JSON), for a closer look")
    args = ap.parse_args()
    a = SimpleNamespace(
        dim=2048, heads=16, kv_heads=8, ffn=6656, vocab=16032, layers=15, seq=1024, batch=4, rope_theta=500000.0,
        pp=8, dp=8, tp=8, microbatches=8, steps=args.steps, events=args.events,
    )  # fmt: skip
    data_moving_fakes()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=a.pp * a.dp * a.tp)
    out = run(a)
    out["simulated_first_stage_allocated_gib"] = simulated(a)
    print(
        json.dumps({**out["runs"][-1], "simulated_allocated_gib": out["simulated_first_stage_allocated_gib"]})
    )
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
