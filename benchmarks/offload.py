"""ZeRO-Offload, ZeRO-Infinity and 1-bit Adam what-ifs for docs/offload.md.

1. GPT-3 6.7B on one DGX A100: ZeRO-2 vs ZeRO-Offload (with and without the delayed parameter update) as the
   PCIe bandwidth per link goes from 4 to 64 GB/s (writes docs/images/offload-pcie.png; needs Chromium).
2. GPT-3 175B on one DGX A100: ZeRO-3 against ZeRO-Infinity with host memory or NVMe, and the aio settings.
3. GPT-3 1.3B on 4 nodes: 1-bit Adam and 0/1 Adam phases on 10 and 100 Gb/s per node.

Run: python benchmarks/offload.py
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
import yaml

from simulator import load_scenario, simulate

ROOT = Path(__file__).resolve().parents[1]


def scenario(path: str, **overrides) -> dict:
    data = yaml.safe_load((ROOT / "scenarios" / path).read_text())
    for dotted, value in overrides.items():
        node = data
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return data


def run(path: str, **overrides):
    return simulate(
        load_scenario(scenario(path, **overrides), base_dir=ROOT / "scenarios" / Path(path).parent)
    )


def pcie_sweep() -> None:
    names = {
        "ZeRO-2": "offload/gpt3-6.7b-zero2-8xa100.yaml",
        "ZeRO-Offload": "offload/gpt3-6.7b-zero2-offload-8xa100.yaml",
        "ZeRO-Offload + DPU": "offload/gpt3-6.7b-zero2-offload-dpu-8xa100.yaml",
    }
    speeds = [4, 8, 16, 31.5, 64]
    rows = {
        name: [run(path, **{"cluster.pcie_bandwidth_GBps": bw}).metrics for bw in speeds]
        for name, path in names.items()
    }
    print("| PCIe per link (GB/s, nominal) | " + " | ".join(names) + " | Offload / ZeRO-2 |")
    print("|---|" + "---|" * (len(names) + 1))
    for i, bw in enumerate(speeds):
        t = [rows[n][i].iteration_time_s for n in names]
        print(f"| {bw:g} | " + " | ".join(f"{x:.2f} s" for x in t) + f" | {t[1] / t[0]:.2f}x |")
    m = rows["ZeRO-Offload"][3]
    print(
        f"\nat 31.5 GB/s: GPU memory {rows['ZeRO-2'][3].memory_gib['peak']:.1f} -> {m.memory_gib['peak']:.1f} GiB, "
        f"host {m.memory_gib['host']:.1f} GiB per node, {m.comm['bytes_host_per_gpu'] / 2**30:.2f} GiB copied per GPU"
    )
    fig = go.Figure()
    for name in names:
        fig.add_trace(
            go.Scatter(x=speeds, y=[m.iteration_time_s for m in rows[name]], mode="lines+markers", name=name)
        )
    fig.update_layout(
        title="GPT-3 6.7B, 8x A100 (DGX A100, 2 GPUs per PCIe switch): iteration time vs PCIe bandwidth",
        xaxis_title="PCIe bandwidth per link, GB/s per direction (nominal)",
        yaxis_title="iteration time (s)",
        xaxis_type="log",
        template="plotly_white",
        width=900,
        height=500,
    )
    try:
        fig.write_image(ROOT / "docs/images/offload-pcie.png", scale=1)
    except Exception as e:  # noqa: BLE001 - the numbers above are the result; the picture needs Chromium
        print(f"(figure not written: {e})")


def infinity() -> None:
    base = "offload/gpt3-175b-zero-infinity-nvme-8xa100.yaml"
    cases = {
        "ZeRO-3": ("offload/gpt3-175b-zero3-8xa100.yaml", {}),
        "Infinity: host memory (cpu / cpu)": (
            base,
            {
                "parallelism.zero.offload_optimizer": {"device": "cpu", "pin_memory": True},
                "parallelism.zero.offload_param": {"device": "cpu", "pin_memory": True},
            },
        ),
        "Infinity: NVMe, 4 drives, aio 1 MiB x 8": (base, {}),
        "Infinity: NVMe, aio 128 KiB x 1": (
            base,
            {"parallelism.zero.aio": {"block_size": 131072, "queue_depth": 1}},
        ),
        "Infinity: NVMe, 8 drives": (base, {"cluster.nvme_drives": 8}),
        "Infinity: NVMe, not pipelined": (
            base,
            {"parallelism.zero.offload_optimizer": {"device": "nvme", "pin_memory": True}},
        ),
    }
    print(
        "\n| GPT-3 175B, 8x A100 | iteration | GPU peak (GiB) | fits | host / node (GiB) | fits host | NVMe / node (GiB) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, (path, over) in cases.items():
        m = run(path, **over).metrics
        print(
            f"| {name} | {m.iteration_time_s:.1f} s | {m.memory_gib['peak']:.1f} | {'no' if m.oom else 'yes'} | "
            f"{m.memory_gib['host']:.0f} | {'no' if m.host_oom else 'yes'} | {m.memory_gib['nvme']:.0f} |"
        )


def onebit() -> None:
    print("\n| optimizer | network per node | phase | steps | iteration | GiB sent per GPU |")
    print("|---|---|---|---|---|---|")
    for path in ("onebit/gpt3-1.3b-onebit-adam-4x10gbe.yaml", "onebit/gpt3-1.3b-zero-one-adam-4x10gbe.yaml"):
        for gbps in (10, 100):
            m = run(path, **{"cluster.nic_bandwidth_gbps": gbps}).metrics
            opt = path.split("/")[1].split("-4x")[0].replace("gpt3-1.3b-", "")
            for ph in m.optimizer_phases:
                print(
                    f"| {opt} | {gbps} Gb/s | {ph['phase']} | {ph['steps']:,} | {ph['iteration_time_s']:.2f} s | "
                    f"{ph['bytes_per_gpu'] / 2**30:.3f} |"
                )
            print(f"| {opt} | {gbps} Gb/s | **amortised** | | **{m.amortised_iteration_time_s:.2f} s** | |")


if __name__ == "__main__":
    pcie_sweep()
    infinity()
    onebit()
