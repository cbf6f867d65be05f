"""What one rank of torch's context parallelism computes, timed on one GPU.

torchtitan's December 2024 context-parallel runs (torch 1963fc8, a 2.6 nightly) go through
torch/distributed/tensor/experimental/_attention.py at v2.6.0: `_templated_ring_attention` and
`_templated_ring_attention_backward` with the round-robin load balancer, K/V rotated by an all-gather
(`_AllGatherRotater`, the default `rotate_method`), dK/dV rotated by an all-to-all (`_AllToAllRotater`), outputs
merged in fp32 (`_SDPAMerger`, `convert_to_f32` True), gradients accumulated in fp32. This script replays that
loop for one rank, with the collectives replaced by buffers of their size (their data is not what is timed: on
a real run NCCL moves it beside the kernels), so the time is the rank's kernels and copies as torch issues them.
It also times the flash kernels alone at the same shapes and the plain causal attention of the rank's tokens.

    python benchmarks/cp_attention.py --check              # CPU: the replay equals full causal attention
    python benchmarks/cp_attention.py --out cp.json        # a GPU: Llama 3 8B heads, 32,768 tokens per rank
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

aten = torch.ops.aten


class Flash:
    """The SDPA flash op and its backward as torch's ring attention calls them (CUDA) or their CPU
    equivalents (for --check)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def forward(self, q, k, v, causal):
        if self.cuda:
            out, lse, *rest = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
            return out, lse, rest
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
        return out, lse, None

    def backward(self, dout, q, k, v, out, lse, causal, rest):
        if self.cuda:
            cq, ck, _, _, seed, offset, _ = rest
            return aten._scaled_dot_product_flash_attention_backward(
                dout, q, k, v, out, lse, cq, ck, q.size(2), k.size(2), 0.0, causal, seed, offset
            )
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal)


def partial_update(original, new, idx, add):
    """torch 2.6 _attention.py `_partial_update` (seq dim 2, two chunks)."""
    chunks = list(original.chunk(2, dim=2))
    if add:
        chunks[idx] += new
    else:
        chunks[idx] = new
    return torch.cat(chunks, dim=2)


def _steps(rank, size, q, kv_at):
    """The (q, k, v, partial, causal) of each ring step of torch 2.6 `_templated_ring_attention` with the
    round-robin load balancer: rank r holds chunks r and 2 size - 1 - r; at step i it has rank r - i's keys."""
    for i in range(size):
        k, v = kv_at(i)
        if i == 0:
            yield q, k, v, False, True
        elif i <= rank:
            yield q, k.chunk(2, dim=2)[0], v.chunk(2, dim=2)[0], False, False
        else:
            yield q.chunk(2, dim=2)[1], k, v, True, False


def gathered_kv(k, v, size, fill=True):
    """`_AllGatherRotater`: the local K, V concatenated, all-gathered (a buffer of size times theirs, written
    here as NCCL would with ``fill``, left unwritten without), each step's K, V a slice of it (next_buffer), and
    the torch.cat torch issues before each exchange_buffers."""
    k, v = k.contiguous(), v.contiguous()
    local = torch.cat([k.flatten(), v.flatten()])
    gathered = torch.empty(size * local.numel(), dtype=local.dtype, device=local.device)
    if fill:  # what NCCL writes (real data: uninitialised memory ran the kernels up to 5% faster)
        gathered.view(size, -1).copy_(local.view(1, -1).expand(size, -1))

    def kv_at(i):
        if i == 0:
            return k, v
        nxt = gathered.chunk(size)[i]
        kk, vv = nxt[: k.numel()].reshape(k.shape), nxt[k.numel() :].reshape(v.shape)
        if i < size - 1:
            torch.cat([kk.flatten(), vv.flatten()])
        return kk, vv

    return kv_at


def ring_forward(op, q, kv_at, rank, size):
    """torch 2.6 `_templated_ring_attention` for one rank, causal, load-balanced, merged by `_SDPAMerger` in
    fp32 (convert_to_f32). Returns (out, lse)."""
    acc_out = acc_lse = None
    for qq, kk, vv, partial, causal in _steps(rank, size, q, kv_at):
        out, lse, _ = op.forward(qq, kk, vv, causal)
        out, lse = out.float(), lse.float().unsqueeze(-1)
        if acc_out is None:
            acc_out, acc_lse = out, lse
            continue
        o = acc_out.chunk(2, dim=2)[1] if partial else acc_out
        s = acc_lse.chunk(2, dim=2)[1] if partial else acc_lse
        # github.com/zhuzilin/ring-flash-attention/pull/34, as torch's _merge_one
        o = o - torch.sigmoid(lse - s) * (o - out)
        s = s - F.logsigmoid(s - lse)
        if partial:
            acc_lse, acc_out = partial_update(acc_lse, s, 1, False), partial_update(acc_out, o, 1, False)
        else:
            acc_out, acc_lse = o, s
    return acc_out.to(q.dtype), acc_lse.squeeze(-1)


def ring_backward(op, dout, q, kv_at, out, lse, rank, size, rest=None):
    """torch 2.6 `_templated_ring_attention_backward` for one rank: gradients accumulated in fp32, dK/dV sent
    on round the ring by an all-to-all (`_AllToAllRotater`: a fresh buffer each step, NCCL's data). Returns dQ
    (dK and dV end on other ranks)."""
    gq = torch.zeros_like(q, dtype=torch.float32)
    k, v = kv_at(0)
    gk = torch.zeros_like(k, dtype=torch.float32)
    gv = torch.zeros_like(v, dtype=torch.float32)
    for i, (qq, kk, vv, partial, causal) in enumerate(_steps(rank, size, q, kv_at)):
        if partial:
            oo, dd, ll = out.chunk(2, dim=2)[1], dout.chunk(2, dim=2)[1], lse.chunk(2, dim=2)[1].contiguous()
        else:
            oo, dd, ll = out, dout, lse
        dq_, dk_, dv_ = op.backward(dd, qq, kk, vv, oo, ll, causal, rest)
        if i == 0:
            gk += dk_
            gv += dv_
        else:
            arrived = torch.empty(gk.numel() + gv.numel(), dtype=torch.float32, device=q.device)
            gk = arrived[: gk.numel()].reshape(gk.shape)
            gv = arrived[gk.numel() :].reshape(gv.shape)
            if i <= rank:
                gk, gv = partial_update(gk, dk_, 0, add=True), partial_update(gv, dv_, 0, add=True)
            else:
                gk += dk_
                gv += dv_
        torch.cat([gk.flatten(), gv.flatten()])  # next_grad_kv, sent on
        if partial:
            gq = partial_update(gq, dq_, 1, add=True)
        else:
            gq += dq_
    torch.empty(gk.numel() + gv.numel(), dtype=torch.float32, device=q.device).to(k.dtype)  # the last dK/dV
    return gq.to(q.dtype)


def check() -> None:
    """On the CPU: the replayed forward of every rank equals full causal attention on that rank's tokens, and
    its dQ equals full attention's (dK/dV travel through the ring, so they are not checked here)."""
    torch.manual_seed(0)
    b, h, s, d = 1, 2, 64, 16
    for size in (1, 2, 4):
        q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
        q.requires_grad_(True)
        full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        dout = torch.randn_like(full)
        (dq_full,) = torch.autograd.grad(full, q, dout)
        chunks = s // (2 * size)
        op = Flash("cpu")
        for rank in range(size):
            idx = torch.cat(
                [
                    torch.arange(rank * chunks, (rank + 1) * chunks),
                    torch.arange((2 * size - 1 - rank) * chunks, (2 * size - rank) * chunks),
                ]
            )
            ql = q.detach()[:, :, idx]
            # the ring delivers rank (rank - i)'s keys at step i
            steps = [
                (k[:, :, _rank_index(rank - i, size, chunks)], v[:, :, _rank_index(rank - i, size, chunks)])
                for i in range(size)
            ]
            out, lse = ring_forward(op, ql, steps.__getitem__, rank, size)
            assert torch.allclose(out, full.detach()[:, :, idx], atol=1e-5), (size, rank)
            dq = ring_backward(op, dout[:, :, idx], ql, steps.__getitem__, out, lse, rank, size)
            assert torch.allclose(dq, dq_full[:, :, idx], atol=1e-5), (size, rank)
    print("ring replay equals causal attention (cp 1, 2, 4; forward and dQ)")


def _rank_index(rank, size, chunks):
    rank %= size
    return torch.cat(
        [
            torch.arange(rank * chunks, (rank + 1) * chunks),
            torch.arange((2 * size - 1 - rank) * chunks, (2 * size - rank) * chunks),
        ]
    )


def timed(repeats: int, fn, *args) -> float:
    """Median seconds of fn(*args) on the GPU (CUDA events), after one warm-up call."""
    fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def measure(args) -> dict:
    dev = "cuda"
    op = Flash(dev)
    h, d, local = args.heads, args.head_dim, args.tokens
    result: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "heads": h,
        "head_dim": d,
        "tokens_per_rank": local,
        "kernels": [],
        "ring": [],
    }

    def attn_flops(sq, sk, causal):  # QK^T and PV, as the simulator counts them (causal skips half)
        return 4.0 * h * sq * sk * d / (2 if causal else 1)

    def rand(s):
        return torch.randn(1, h, s, d, device=dev, dtype=torch.bfloat16)

    def ring_step(q, k, v, rank, size):
        return ring_forward(op, q, gathered_kv(k, v, size), rank, size)

    def ring_step_backward(dout, q, k, v, out, lse, rank, size, rest):
        return ring_backward(op, dout, q, gathered_kv(k, v, size), out, lse, rank, size, rest)

    shapes = [(s, s, True) for s in args.causal_seqs] + [
        (local, local // 2, False),
        (local // 2, local, False),
    ]
    for sq, sk, causal in shapes:
        q, k, v = rand(sq), rand(sk), rand(sk)
        out, lse, rest = op.forward(q, k, v, causal)
        dout = torch.randn_like(out)
        f = timed(args.repeats, op.forward, q, k, v, causal)
        b = timed(args.repeats, op.backward, dout, q, k, v, out, lse, causal, rest)
        fl = attn_flops(sq, sk, causal)
        row = {"q": sq, "k": sk, "causal": causal, "forward_s": f, "backward_s": b}
        row["forward_tflops"] = fl / f / 1e12
        row["backward_tflops"] = 2.5 * fl / b / 1e12  # the kernel's work: 2.5x the forward's matmuls
        result["kernels"].append(row)
        print(json.dumps(row), flush=True)

    for size in args.cp:
        q, k, v = rand(local), rand(local), rand(local)
        for rank in sorted({0, size - 1}):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            out, lse, rest = None, None, None
            if size == 1:
                out, lse, rest = op.forward(q, k, v, True)
                fwd = timed(args.repeats, op.forward, q, k, v, True)
            else:
                kv_at = gathered_kv(k, v, size)
                out, lse = ring_forward(op, q, kv_at, rank, size)
                _, _, rest = op.forward(q[:, :, :128], k[:, :, :128], v[:, :, :128], True)
                fwd = timed(args.repeats, ring_step, q, k, v, rank, size)
            dout = torch.randn_like(out)
            if size == 1:
                bwd = timed(args.repeats, op.backward, dout, q, k, v, out, lse, True, rest)
            else:
                bwd = timed(args.repeats, ring_step_backward, dout, q, k, v, out, lse, rank, size, rest)
            peak = torch.cuda.max_memory_allocated() - base
            # the rank's share of causal attention over all size * local tokens
            fl = attn_flops(local, size * local, True)
            row = {
                "cp": size,
                "rank": rank,
                "sequence": size * local,
                "forward_s": fwd,
                "backward_s": bwd,
                "forward_tflops": fl / fwd / 1e12,
                "backward_tflops": 2.5 * fl / bwd / 1e12,
                "peak_extra_gib": peak / 2**30,
            }
            result["ring"].append(row)
            print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="CPU: check the replay against full attention")
    p.add_argument("--out", help="write the measurements here (JSON)")
    p.add_argument("--heads", type=int, default=32, help="query heads (K/V repeated to them, as torchtitan)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--tokens", type=int, default=32768, help="tokens per rank")
    p.add_argument("--cp", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--causal-seqs",
        type=int,
        nargs="+",
        default=[4096, 8192, 16384, 32768, 65536],
        help="sequence lengths of the plain causal kernels timed",
    )
    args = p.parse_args()
    if args.check:
        check()
        return
    t0 = time.perf_counter()
    result = measure(args)
    result["wall_s"] = time.perf_counter() - t0
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
