"""Sustained bf16 GEMM throughput (clocks under the power cap) against the first seconds, with the SM clock,
power and temperature sampled every second by nvidia-smi.

    SECONDS_PER_SHAPE=40 python benchmarks/gemm_sustained.py     (OUT=dir for the JSON)

DTYPES=bf16,fp8 times FP8 GEMMs too (E4M3, per-tensor scales, bf16 output: torch._scaled_mm, as Transformer
Engine runs them), each shape for SECONDS_PER_SHAPE.

Measured on one H100 SXM: docs/measurements/gemm-sustained-h100.json, summarised in docs/deepspeed.md.
"""

import json
import os
import subprocess
import threading
import time

SHAPES = [(16384, 12288, 36864), (8192, 8192, 8192)]  # GPT-3 175B's MLP GEMM at 16k tokens; a square one


def main() -> None:
    import torch

    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": [], "smi": []}
    done = threading.Event()

    def sample() -> None:
        query = [
            "nvidia-smi",
            "--query-gpu=clocks.sm,power.draw,temperature.gpu",
            "--format=csv,noheader,nounits",
        ]
        while not done.is_set():
            r = subprocess.run(query, capture_output=True, text=True)
            out["smi"].append((time.time(), r.stdout.strip()))
            time.sleep(1.0)

    threading.Thread(target=sample, daemon=True).start()
    seconds = float(os.environ.get("SECONDS_PER_SHAPE", 45))
    one = torch.ones((), device="cuda")
    for dtype in os.environ.get("DTYPES", "bf16").split(","):
        for m, k, n in SHAPES:
            _shape(out, dtype, m, k, n, seconds, one)
    done.set()
    time.sleep(1.2)
    with open(os.path.join(os.environ.get("OUT", "."), "gemm_sustained.json"), "w") as f:
        json.dump(out, f)


def _shape(out: dict, dtype: str, m: int, k: int, n: int, seconds: float, one) -> None:
    import torch

    if dtype == "fp8":
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt takes it

        def gemm():
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)

        def gemm():
            return a @ b

    for _ in range(3):
        gemm()
    torch.cuda.synchronize()
    t0, windows, reps = time.time(), [], 20
    while time.time() - t0 < seconds:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            gemm()
        end.record()
        end.synchronize()
        windows.append((time.time() - t0, 2 * m * k * n * reps / (start.elapsed_time(end) / 1e3) / 1e12))
    out["runs"].append({"dtype": dtype, "shape": [m, k, n], "tflops": windows})
    best = max(w[1] for w in windows)
    tail = sorted(w[1] for w in windows if w[0] > seconds / 2)
    print(
        f"{dtype} {m} x {k} x {n}: first {windows[0][1]:.0f}, best {best:.0f}, "
        f"median of the second half {tail[len(tail) // 2]:.0f}, last {windows[-1][1]:.0f} TFLOP/s",
        flush=True,
    )


if __name__ == "__main__":
    main()
