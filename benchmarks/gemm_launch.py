"""Host time to launch one small GEMM, three ways an MoE layer launches its experts' GEMMs:

* from C++ through cuBLASLt as Transformer Engine's grouped GEMM does for each local expert (descriptors, the
  heuristic query and the launch; benchmarks/cublaslt_launch.cu, built here with nvcc): ``library_kernel_s``
  in simulator/frameworks/*.yaml;
* from Python, ``torch.mm`` per expert (Megatron-Core's SequentialMLP loop);
* from Python, one ``torch._grouped_mm`` for every expert (torchtitan's grouped experts).

The GPU is kept busy (a sleeping kernel queued first) so each call returns once the host has enqueued it: the
wall time per call is the host's. Prints one line per case; with --json FILE writes every number.

    python benchmarks/gemm_launch.py --json launch.json      # on a machine with a CUDA GPU and nvcc
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(512, 4096, 768), (1024, 2048, 1536), (2048, 7168, 4096), (128, 256, 256)]  # rows, k, n as the .cu


def host_us_per_call(call, batch: int = 128, batches: int = 15) -> float:
    """Median over batches of host microseconds per call, the GPU held busy ahead of each batch."""
    samples = []
    for b in range(batches + 2):
        torch.cuda._sleep(40_000_000)  # about 20 ms of GPU cycles queued before the batch
        t0 = time.perf_counter()
        for _ in range(batch):
            call()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        if b >= 2:
            samples.append((t1 - t0) / batch * 1e6)
    return statistics.median(samples)


def python_cases() -> list[dict]:
    rows_out = []
    dt = torch.bfloat16
    empty = torch.empty(1, device="cuda")
    rows_out.append({"case": "torch.add (1 element)", "us_per_call": host_us_per_call(lambda: empty.add_(1))})
    for rows, k, n in SHAPES:
        a = torch.randn(rows, k, device="cuda", dtype=dt)
        w = torch.randn(k, n, device="cuda", dtype=dt)
        mm = host_us_per_call(lambda a=a, w=w: torch.mm(a, w))
        experts = 16
        x = torch.randn(experts * rows, k, device="cuda", dtype=dt)
        ws = torch.randn(experts, n, k, device="cuda", dtype=dt).transpose(-2, -1)
        offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * rows
        try:
            grouped = host_us_per_call(lambda x=x, ws=ws, o=offs: torch._grouped_mm(x, ws, offs=o), batch=32)
        except (RuntimeError, AttributeError) as e:  # no grouped GEMM on this GPU or PyTorch
            grouped = None
            print(f"torch._grouped_mm: {e}", file=sys.stderr)
        rows_out.append(
            {
                "case": "torch.mm",
                "rows": rows,
                "k": k,
                "n": n,
                "us_per_call": mm,
                "grouped_mm_16_experts_us": grouped,
            }
        )
    return rows_out


def cublaslt_cases() -> list[dict]:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        print("no nvcc: the cuBLASLt cases are skipped", file=sys.stderr)
        return []
    exe = os.path.join(tempfile.mkdtemp(), "cublaslt_launch")
    cmd = [
        nvcc,
        "-O2",
        "-std=c++17",
        "-arch=sm_90",
        os.path.join(HERE, "cublaslt_launch.cu"),
        "-lcublasLt",
        "-o",
        exe,
    ]
    libs = ["/usr/local/cuda/lib64"]
    try:  # cuBLAS from its pip wheel, where the toolkit's own is not installed
        import nvidia.cublas

        libs += [os.path.join(p, "lib") for p in nvidia.cublas.__path__]
        cmd[1:1] = [f"-I{os.path.join(p, 'include')}" for p in nvidia.cublas.__path__]
    except ImportError:
        pass
    for lib in filter(os.path.isdir, libs):
        cmd[1:1] = ["-L", lib, "-Xlinker", "-rpath", "-Xlinker", lib]
        versioned = sorted(glob.glob(os.path.join(lib, "libcublasLt.so.*")))
        if not os.path.exists(os.path.join(lib, "libcublasLt.so")) and versioned:
            cmd[cmd.index("-lcublasLt")] = versioned[0]  # a wheel ships only the versioned name
            break
    subprocess.run(cmd, check=True)
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every number to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gemm_launch.py measures host launch times of CUDA GEMMs: it needs a CUDA GPU")
    rows = [{"case": "meta", "device": torch.cuda.get_device_name(), "torch": torch.__version__}]
    rows += python_cases()
    rows += cublaslt_cases()
    for r in rows:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
