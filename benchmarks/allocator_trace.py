"""The simulated memory (peak allocation and what the caching allocator holds) against a replay of what
torchtitan's own training step allocates and frees, on the CPU.

benchmarks/torchtitan_step.py runs torchtitan 9dec370's Llama step (FSDP2 over a fake process group, activation
checkpointing, the eager loss, AdamW) for one rank under torch's profiler, which records every allocation and
free of the aten ops (the same ops a GPU runs; the matmuls' CPU scratch, allocated and freed inside one op, is
left out). Those events are replayed on the caching allocator's best fit (simulator/workload/allocator.py): the
most allocated at once, and the most it holds. The model is Llama 3 8B narrowed to width 512 (head dim 128, 4
query heads per key / value head, FFN 3.5 x, vocabulary 31.3 x the width, 32 layers) with the sequence scaled
so that parameters, checkpoints and logits keep 8B's proportions at 32,768 tokens (4,096 here), 8,192 (1,024)
and, per-op checkpointing, 16,384 (2,048). The simulation of the same scenario is printed beside it: what it
allocates, what it holds in one pool (as the CPU's replay does), and what it holds on a GPU, where FSDP's
collective streams keep their own pools (strategy/memory.py).

    python benchmarks/allocator_trace.py [--out docs/measurements/cpu-torchtitan-allocator-replay.json]

Needs torch (a CPU build: pip install torch==2.13.0); about a minute per row.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# torchtitan 9dec370 parallelize_llama.py _save_list (the ops whose outputs per-op checkpointing keeps), with the
# CPU's FlashAttention op beside the GPU's so that attention's output is kept here as it is there
SAVE = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.abs.default,
    torch.ops.aten.max.default,
}


def op_policy():
    """torchtitan's _custom_policy: save the ops on its list but every second matmul."""
    meta = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            meta[f"{mode}_mm_count"] += 1
        save = func in SAVE and not (func == torch.ops.aten.mm.default and meta[f"{mode}_mm_count"] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def events(prof, tmp: Path) -> list[tuple[str, float]]:
    """The trace's allocations and frees in order, as replay's events (bytes), less each matmul's own CPU
    scratch (allocated and freed inside one aten::mm)."""
    prof.export_chrome_trace(str(tmp))
    trace = json.loads(tmp.read_text())["traceEvents"]
    mms = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in trace
        if e.get("ph") == "X" and e.get("name") in ("aten::mm", "aten::addmm")
    )
    mem = sorted((e for e in trace if e.get("name") == "[memory]"), key=lambda e: e["ts"])

    def inside(ts):
        return next((i for i, (a, b) in enumerate(mms) if a <= ts <= b), None)

    born: dict[int, tuple[str, int | None]] = {}
    out, serial = [], 0
    for e in mem:
        addr, size = e["args"]["Addr"], e["args"]["Bytes"]
        if size > 0:
            serial += 1
            born[addr] = (f"t{serial}", inside(e["ts"]))
            out.append(("+" + born[addr][0], float(size)))
        elif addr in born:
            name, op = born.pop(addr)
            if op is not None and op == inside(e["ts"]):
                out = [ev for ev in out if ev[0] != "+" + name]  # scratch: never there
            else:
                out.append(("-" + name, 0.0))
    return out


CONFIGS = (  # (tokens per rank, activation checkpointing)
    (4096, "full"),
    (1024, "full"),
    (2048, "op"),
)
MODEL = {"dim": 512, "heads": 4, "kv_heads": 1, "ffn": 1792, "vocab": 16032, "layers": 32}


def traced(seq: int, ac: str, tmp: Path) -> dict:
    """torchtitan_step.py --trace for one configuration: the replay's allocated and held GiB."""
    out = tmp / f"{seq}-{ac}.json"
    m = MODEL
    cmd = [
        sys.executable, str(Path(__file__).with_name("torchtitan_step.py")), "--dim", str(m["dim"]), "--heads",
        str(m["heads"]), "--kv-heads", str(m["kv_heads"]), "--ffn", str(m["ffn"]), "--vocab", str(m["vocab"]),
        "--layers", str(m["layers"]), "--seq", str(seq), "--steps", "2", "--ac", ac, "--trace", "--out", str(out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    run = json.loads(out.read_text())["runs"][0]
    return {"allocated_gib": run["replayed_allocated_gib"], "held_gib": run["replayed_held_gib"]}


def simulated(seq: int, ac: str) -> dict:
    from simulator import load_scenario, simulate

    m = MODEL
    s = load_scenario(
        {
            "name": f"torchtitan-8b-narrow-{seq}-{ac}",
            "framework": "pytorch-2024",
            "model": {
                "num_layers": m["layers"], "hidden_size": m["dim"], "num_attention_heads": m["heads"],
                "num_query_groups": m["kv_heads"], "ffn_hidden_size": m["ffn"], "seq_length": seq,
                "vocab_size": m["vocab"], "activation": "swiglu", "normalization": "rmsnorm",
                "position_embedding": "rope", "add_bias_linear": False, "attention": "flash",
                "tied_embeddings": False,
            },
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {
                "global_batch_size": 8, "micro_batch_size": 1, "precision": "bf16",
                "activation_recompute": "full" if ac == "full" else "selective-op",
            },
            "parallelism": {"data_parallel": 8, "fsdp": {}},
        }
    )  # fmt: skip
    r = simulate(s)
    g = r.metrics.memory_gib
    # what FSDP frees before the loss (the sharded gradients, the buffers but the last block's parameters): on a
    # GPU its collective streams' pools keep it (strategy/memory.py); the CPU has one pool, so it is left out here
    streams = g["grads"] + g["buffers"] - r.workload.layer.params * 2 / 2**30
    return {
        "allocated_gib": round(g["peak"], 3),
        "held_gib": round(g["reserved"], 3),
        "held_one_pool_gib": round(g["reserved"] - streams, 3),
    }


def main() -> None:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write the table here (JSON)")
    a = ap.parse_args()
    rows = []
    print(
        f"{'tokens':>7s} {'AC':>5s} {'replayed: allocated':>20s} {'held':>7s} {'simulated: allocated':>21s}"
        f" {'held, one pool':>15s} {'held on a GPU':>14s}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for seq, ac in CONFIGS:
            row = {
                "tokens": seq,
                "ac": ac,
                "replayed": traced(seq, ac, Path(tmp)),
                "simulated": simulated(seq, ac),
            }
            r, s = row["replayed"], row["simulated"]
            print(
                f"{seq:7d} {ac:>5s} {r['allocated_gib']:16.3f} GiB {r['held_gib']:7.3f} "
                f"{s['allocated_gib']:17.3f} GiB {s['held_one_pool_gib']:15.3f} {s['held_gib']:14.3f}",
                flush=True,
            )
            rows.append(row)
    if a.out:
        a.out.write_text(
            json.dumps({"torch": torch.__version__, "model": MODEL, "rows": rows}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
