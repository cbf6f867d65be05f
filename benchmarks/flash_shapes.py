"""FlashAttention's speed by shape on one GPU: forward and backward of torch's SDPA kernels over sequence length,
batch x heads and head dimension, causal and not, for the attention efficiency by shape (docs/validation.md).

    python benchmarks/flash_shapes.py --out flash.json            # a GPU (minutes)
    python benchmarks/flash_shapes.py --backend cudnn --out c.json   # cuDNN's attention (torch >= 2.5)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from cp_attention import Flash, timed  # noqa: E402


def cudnn_ops():
    aten = torch.ops.aten

    def forward(q, k, v, causal):
        out, lse, *rest = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False)
        return out, lse, rest

    def backward(dout, q, k, v, out, lse, causal, rest):
        cq, ck, mq, mk, seed, offset, _ = rest
        return aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse, seed, offset, None, cq, ck, q.size(2), k.size(2), 0.0, causal
        )

    return forward, backward


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out")
    p.add_argument("--backend", choices=["flash", "cudnn"], default="flash")
    p.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--batch-heads", type=int, nargs="+", default=[16, 32, 128, 512])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--max-elements", type=float, default=2**30, help="skip shapes whose q exceeds this")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    flash = Flash("cuda")
    fwd_op, bwd_op = (flash.forward, flash.backward) if a.backend == "flash" else cudnn_ops()
    rows = []
    for d in a.head_dims:
        for s in a.seqs:
            for bh in a.batch_heads:
                if bh * s * d > a.max_elements:
                    continue
                for causal in (True, False):
                    q, k, v = (
                        torch.randn(1, bh, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)
                    )
                    try:
                        out, lse, rest = fwd_op(q, k, v, causal)
                        dout = torch.randn_like(out)
                        f = timed(a.repeats, fwd_op, q, k, v, causal)
                        b = timed(a.repeats, bwd_op, dout, q, k, v, out, lse, causal, rest)
                    except (RuntimeError, TypeError) as e:  # a shape or signature the backend refuses
                        print(json.dumps({"d": d, "s": s, "bh": bh, "error": str(e)[:200]}), flush=True)
                        continue
                    flops = 4.0 * bh * s * s * d / (2 if causal else 1)
                    row = {
                        "head_dim": d,
                        "seq": s,
                        "batch_heads": bh,
                        "causal": causal,
                        "forward_s": f,
                        "backward_s": b,
                        "forward_tflops": round(flops / f / 1e12, 1),
                        "backward_tflops": round(2.5 * flops / b / 1e12, 1),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "backend": a.backend,
        "rows": rows,
    }
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
