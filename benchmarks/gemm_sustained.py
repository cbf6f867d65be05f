"""Sustained bf16 GEMM throughput (clocks under the power cap) against the first seconds, with the SM clock,
power and temperature sampled every second by nvidia-smi.

    SECONDS_PER_SHAPE=40 python benchmarks/gemm_sustained.py     (OUT=dir for the JSON)

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
    for m, k, n in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        t0, windows, reps = time.time(), [], 20
        while time.time() - t0 < seconds:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                a @ b
            end.record()
            end.synchronize()
            windows.append((time.time() - t0, 2 * m * k * n * reps / (start.elapsed_time(end) / 1e3) / 1e12))
        out["runs"].append({"shape": [m, k, n], "tflops": windows})
        best = max(w[1] for w in windows)
        print(
            f"{m} x {k} x {n}: first {windows[0][1]:.0f}, best {best:.0f}, last {windows[-1][1]:.0f} TFLOP/s"
        )
    done.set()
    time.sleep(1.2)
    with open(os.path.join(os.environ.get("OUT", "."), "gemm_sustained.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
