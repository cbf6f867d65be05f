"""One rank of torchtitan's Llama 3 FSDP2 training step on one GPU: its peak memory and step time.

The model, the parallelisation and the step are torchtitan's at 9dec370 (December 2024, the commit of its
docs/performance.md tables): torchtitan/models/llama/model.py (separate wq / wk / wv, RoPE through complex
numbers, repeat_kv before SDPA, RMSNorm computed in fp32, SwiGLU), parallelize_llama.py `apply_fsdp` (every
block `fully_shard`ed with bf16 parameters and fp32 reduction, resharded after forward except the last, then
the root) and `_apply_ac_to_transformer_block` (full: `ptd_checkpoint_wrapper` per block), train.py's step
(cross-entropy on `pred.float()`, `clip_grad_norm_`, AdamW with foreach, `zero_grad`). Other ranks are a fake
process group (torch.testing's FakeStore): FSDP2 all-gathers and reduce-scatters into buffers of their real
size without moving data, so memory is one rank's and time is its compute and copies without communication.
Not here: torch.compile and torchao's Float8 (the published rows use both), which change kernels, not the
tensors FSDP and checkpointing keep.

    python benchmarks/torchtitan_step.py --dim 64 --layers 2 --seq 128 --vocab 512    # CPU smoke run
    python benchmarks/torchtitan_step.py --layers 32 4 --out step.json                  # a GPU: Llama 3 8B
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotary(x, freqs_cis):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    freqs = freqs_cis[: x.shape[1]].view(1, x.shape[1], 1, xc.shape[-1])
    return torch.view_as_real(xc * freqs).flatten(3).type_as(x)


def repeat_kv(x, n_rep: int):
    """torchtitan's repeat_kv: K / V repeated to the query heads before SDPA."""
    b, s, kv, hd = x.shape
    return x if n_rep == 1 else x.unsqueeze(3).expand(b, s, kv, n_rep, hd).reshape(b, s, kv * n_rep, hd)


class Attention(nn.Module):
    """torchtitan's Attention: heads inferred from the projections' (possibly tensor-parallel) width."""

    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.n_rep, self.hd = heads // kv_heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x, freqs_cis):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.hd)
        k = self.wk(x).view(b, s, -1, self.hd)
        v = self.wv(x).view(b, s, -1, self.hd)
        q, k = rotary(q, freqs_cis), rotary(k, freqs_cis)
        k, v = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if RING.size > 1:
            o = RingAttention.apply(q, k, v)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).contiguous().view(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, ffn):
        super().__init__()
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, ffn):
        super().__init__()
        self.attention = Attention(dim, heads, kv_heads)
        self.feed_forward = FeedForward(dim, ffn)
        self.attention_norm, self.ffn_norm = RMSNorm(dim), RMSNorm(dim)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


def apply_tp(model, tp_mesh, head: bool = True) -> None:
    """torchtitan 9dec370 parallelize_llama.py apply_tp (bf16, loss parallel): the embedding row-wise with its
    output sequence-sharded, the norms sequence-parallel, the projections column- / row-wise (``head`` false: a
    first pipeline stage, without the final norm and output layer)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    outer = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))}
    if head:
        outer["norm"] = SequenceParallel()
        outer["output"] = ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False
        )
    parallelize_module(model, tp_mesh, outer)
    for block in model.layers.values():
        plan = {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(
                input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
            ),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        }
        parallelize_module(block, tp_mesh, plan)


class RING:
    """Context parallelism as torch 2.6 runs it for one rank (benchmarks/cp_attention.py), when size > 1."""

    size = 1
    rank = 0


class RingAttention(torch.autograd.Function):
    """torch 2.6's ring attention forward and backward for rank RING.rank of RING.size, with the collectives'
    buffers in place of their data (benchmarks/cp_attention.py)."""

    @staticmethod
    def forward(ctx, q, k, v):
        from cp_attention import Flash, gathered_kv, ring_forward

        op = Flash(q.device.type)
        out, lse = ring_forward(op, q, gathered_kv(k, v, RING.size), RING.rank, RING.size)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        from cp_attention import Flash, gathered_kv, ring_backward

        q, k, v, out, lse = ctx.saved_tensors
        op = Flash(q.device.type)
        _, _, rest = op.forward(q[:, :, :128], k[:, :, :128], v[:, :, :128], True)  # the op's RNG state
        dq = ring_backward(
            op, dout.contiguous(), q, gathered_kv(k, v, RING.size), out, lse, RING.rank, RING.size, rest
        )
        return dq, torch.empty_like(k), torch.empty_like(v)  # dK, dV: the last all-to-all's buffer


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok_embeddings = nn.Embedding(a.vocab, a.dim)
        self.layers = nn.ModuleDict(
            {str(i): Block(a.dim, a.heads, a.kv_heads, a.ffn) for i in range(a.layers)}
        )
        self.norm = RMSNorm(a.dim)
        self.output = nn.Linear(a.dim, a.vocab, bias=False)
        hd = a.dim // a.heads
        freqs = 1.0 / (a.rope_theta ** (torch.arange(0, hd, 2)[: hd // 2].float() / hd))
        freqs = torch.outer(torch.arange(a.seq), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(freqs), freqs), persistent=True)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))


def data_moving_fakes() -> None:
    """Make the fake process group's all-gathers and reduce-scatters write their outputs (this rank's shard
    repeated, or its first chunk), so parameters hold the shards' values, not an empty buffer's (zeros make
    tensor cores run faster than real data does), and the HBM traffic of an output written is there. FSDP2
    calls all_gather_into_tensor / reduce_scatter_tensor (torch <= 2.11) or the *_single forms (later)."""

    def tensors(args, kwargs):
        out = kwargs.get("output_tensor", kwargs.get("output", args[0] if args else None))
        inp = kwargs.get("input_tensor", kwargs.get("input", args[1] if len(args) > 1 else None))
        return out, inp

    def wrap(fn, fill):
        def collective(*args, **kwargs):
            work = fn(*args, **kwargs)
            fill(*tensors(args, kwargs))
            return work

        return collective

    def gathered(out, inp):
        n = out.numel() // inp.numel()  # the group's ranks
        out.view(n, -1).copy_(inp.reshape(1, -1).expand(n, -1))

    def scattered(out, inp):
        n = inp.numel() // out.numel()
        out.copy_(inp.reshape(n, -1)[0].view_as(out))

    for name, fill in (
        ("all_gather_into_tensor", gathered),
        ("all_gather_single", gathered),
        ("reduce_scatter_tensor", scattered),
        ("reduce_scatter_single", scattered),
    ):
        if hasattr(dist, name):
            setattr(dist, name, wrap(getattr(dist, name), fill))


def gib(n: float) -> float:
    return round(n / 2**30, 3)


def run(a, layers: int, device: str) -> dict:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    a.layers = layers
    if a.tp > 1:
        mesh2 = init_device_mesh(device, (a.world // a.tp, a.tp), mesh_dim_names=("dp", "tp"))
        mesh = mesh2["dp"]
    else:
        mesh = init_device_mesh(device, (a.world,))
    with torch.device("meta"):
        model = Transformer(a)
    if a.tp > 1:
        apply_tp(model, mesh2["tp"])
    for name, block in list(model.layers.items()):
        if (
            a.ac == "op"
        ):  # torchtitan's per-op selective checkpointing (benchmarks/allocator_trace.py op_policy)
            from allocator_trace import op_policy

            model.layers[name] = checkpoint_wrapper(block, context_fn=op_policy, preserve_rng_state=False)
        else:
            model.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)  # ptd_checkpoint_wrapper
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for name, block in model.layers.items():
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=int(name) < layers - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
        hd = a.dim // a.heads
        freqs = 1.0 / (a.rope_theta ** (torch.arange(0, hd, 2, device=device)[: hd // 2].float() / hd))
        freqs = torch.outer(torch.arange(a.seq, device=device), freqs)
        model.freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, weight_decay=0.1, foreach=True)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq), device=device)
    labels = torch.randint(0, a.vocab, (a.batch, a.seq), device=device)
    if a.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel
    else:
        from contextlib import nullcontext as loss_parallel
    cuda = device == "cuda"
    steps = []
    for step in range(a.steps):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        with loss_parallel():  # torchtitan's train_context: the vocabulary-sharded loss and its backward
            pred = model(tokens)
            loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
            del pred
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad()
        row = {"step": step + 1}
        if cuda:
            torch.cuda.synchronize()
            stats = torch.cuda.memory_stats()
            row["max_allocated_gib"] = gib(stats["allocated_bytes.all.peak"])
            row["max_reserved_gib"] = gib(stats["reserved_bytes.all.peak"])
            row["alloc_retries"] = stats["num_alloc_retries"]
        row["step_s"] = round(time.perf_counter() - t0, 4)
        steps.append(row)
        print(json.dumps({"layers": layers, **row}), flush=True)
    params = sum(p.numel() for p in model.parameters())  # DTensor numel is the global size
    out = {"layers": layers, "parameters": params, "steps": steps}
    del model, opt
    if cuda:
        torch.cuda.empty_cache()
    return out


def traced(a, layers: int, device: str) -> dict:
    """``run`` under torch's profiler, its allocations and frees replayed on the caching allocator's best fit
    (benchmarks/allocator_trace.py events): what the allocator would hold beside what is allocated."""
    import tempfile

    from allocator_trace import events
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from simulator.workload.allocator import replay

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = run(a, layers, device)
    with tempfile.TemporaryDirectory() as tmp:
        ev = events(prof, Path(tmp) / "trace.json")
    if os.environ.get("CLUSTERSIM_EVENTS"):  # for a closer look: the events themselves
        Path(os.environ["CLUSTERSIM_EVENTS"]).write_text(json.dumps(ev))
    allocated, held = replay(ev)
    out.update(replayed_allocated_gib=gib(allocated), replayed_held_gib=gib(held))
    print(json.dumps({k: v for k, v in out.items() if k != "steps"}), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, nargs="+", default=[32], help="one run per number of blocks")
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--seq", type=int, default=32768, help="tokens per rank (local batch 1)")
    p.add_argument("--rope-theta", type=float, default=500000.0)
    p.add_argument("--world", type=int, default=8, help="ranks (FSDP x TP; all but one fake)")
    p.add_argument(
        "--tp", type=int, default=1, help="tensor-parallel ranks (torchtitan's apply_tp, loss parallel)"
    )
    p.add_argument("--batch", type=int, default=1, help="local batch (sequences per rank)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--cp", type=int, default=1, help="context parallel ranks (torch 2.6 ring attention, emulated)"
    )
    p.add_argument(
        "--sdpa",
        choices=["default", "flash"],
        default="flash",
        help="SDPA backend: flash (FlashAttention-2, torch 2.6's first choice) or torch's default order (cuDNN first "
        "on Hopper from torch 2.9)",
    )
    p.add_argument(
        "--ac",
        choices=["full", "op"],
        default="full",
        help="activation checkpointing: full (every block) or op (torchtitan's per-op selective policy)",
    )
    p.add_argument("--out", help="write the measurements here (JSON)")
    p.add_argument(
        "--trace",
        action="store_true",
        help="on the CPU: record every allocation and free of the run with torch's profiler and replay them on the "
        "caching allocator's best fit (simulator/workload/allocator.py): the most allocated and held, per run",
    )
    a = p.parse_args()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    device = "cuda" if torch.cuda.is_available() else "cpu"
    RING.size = a.cp
    data_moving_fakes()
    sys.path.insert(0, str(Path(__file__).parent))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=a.world)
    result = {
        "torch": torch.__version__,
        "config": {k: v for k, v in vars(a).items() if k != "out"},
        "runs": [],
    }
    if device == "cuda":
        result["device"] = torch.cuda.get_device_name()
        result["capacity_gib"] = gib(torch.cuda.get_device_properties(0).total_memory)
    backends = None
    if a.sdpa == "flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = sdpa_kernel([SDPBackend.FLASH_ATTENTION])
        backends.__enter__()
    for layers in a.layers:
        try:
            result["runs"].append(traced(a, layers, device) if a.trace else run(a, layers, device))
        except torch.OutOfMemoryError as e:
            stats = torch.cuda.memory_stats()
            result["runs"].append(
                {
                    "layers": layers,
                    "out_of_memory": str(e).splitlines()[0][:300],
                    "max_allocated_gib": gib(stats["allocated_bytes.all.peak"]),
                    "max_reserved_gib": gib(stats["reserved_bytes.all.peak"]),
                }
            )
            print(json.dumps(result["runs"][-1]), flush=True)
            torch.cuda.empty_cache()
        if a.out:
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
