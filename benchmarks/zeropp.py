"""ZeRO++ vs ZeRO-3 on the ZeRO++ evaluation setup: 384 V100 (24 DGX-2 nodes), 1x or 4x 100 Gb/s InfiniBand per
node, 1K or 2K tokens per GPU; compared with the ratios of DeepSpeed's published bars. Also the what-if figure:
ZeRO++ and hpZ gain against inter-node bandwidth, 50-800 Gb/s per node.

Run: python benchmarks/zeropp.py   (writes docs/images/zeropp-bandwidth.png; needs Chromium for the PNG)
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from simulator import load_scenario, simulate

# GPT shapes of the paper's parameter counts (the paper's exact shapes are not verified: compare ratios)
MODELS = {
    "18B": {"num_layers": 40, "hidden_size": 6144, "num_attention_heads": 48},
    "49B": {"num_layers": 60, "hidden_size": 8192, "num_attention_heads": 64},
    "91B": {"num_layers": 72, "hidden_size": 10240, "num_attention_heads": 80},
    "138B": {"num_layers": 76, "hidden_size": 12288, "num_attention_heads": 96},
}
# DeepSpeed blog "ZeRO++", figures eval1-eval3: TFLOP/s per GPU [ZeRO-3, ZeRO++]
PUBLISHED = {
    ("4x100", "1K"): {"18B": (25, 35), "49B": (23, 36), "91B": (23, 36), "138B": (23, 36)},
    ("4x100", "2K"): {"18B": (40, 53), "49B": (36, 51), "91B": (36, 51), "138B": (36, 50)},
    ("1x100", "1K"): {"18B": (14, 31), "49B": (11, 22), "91B": (11, 22), "138B": (11, 22)},
    ("1x100", "2K"): {"18B": (26, 46), "49B": (20, 38), "91B": (20, 38), "138B": (20, 38)},
}
ZEROPP = {"zero_quantized_weights": True, "zero_hpz_partition_size": 16, "zero_quantized_gradients": True}


def scenario(model: str, tokens: str, nics: int, zero: dict, gbps: float = 100.0) -> dict:
    """``nics`` x ``gbps`` per node (a DGX-2's PCIe gen3 caps one NIC near 100 Gb/s, so nodes grow NICs)."""
    mbs = {"1K": 1, "2K": 2}[tokens]
    return {
        "name": f"zeropp-{model}-{tokens}-{nics}x{gbps:g}",
        # the paper's Megatron-DeepSpeed GPT on V100: the unfused attention layer (no FlashAttention on Volta)
        "model": {
            **MODELS[model],
            "seq_length": 1024,
            "vocab_size": 51200,
            "tied_embeddings": False,
            "attention": "standard",
        },
        "cluster": {
            "topology": "dgx2-v100",
            "num_nodes": 24,
            "nics_per_node": nics,
            "nic_bandwidth_gbps": gbps,
        },
        "training": {
            "global_batch_size": 384 * mbs,
            "micro_batch_size": mbs,
            "precision": "fp16",
            "activation_recompute": "full",
        },
        "parallelism": {"zero_stage": 3, "zero": zero},
    }


def tflops(d: dict) -> float:
    return simulate(load_scenario(d)).metrics.model_tflops_per_gpu


def main() -> None:
    print(
        "| network | tokens/GPU | model | ZeRO-3 sim. | ZeRO++ sim. | ratio sim. | ratio published | published bars |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (net, tokens), rows in PUBLISHED.items():
        nics = int(net.split("x")[0])
        for model, (z3_pub, zpp_pub) in rows.items():
            z3, zpp = tflops(scenario(model, tokens, nics, {})), tflops(scenario(model, tokens, nics, ZEROPP))
            print(
                f"| {nics} x 100 Gb/s | {tokens} | {model} | {z3:.1f} | {zpp:.1f} | {zpp / z3:.2f} | "
                f"{zpp_pub / z3_pub:.2f} | {z3_pub} / {zpp_pub} |"
            )

    bandwidths = [50, 100, 200, 400, 800]
    layout = {50: (1, 50), 100: (1, 100), 200: (2, 100), 400: (4, 100), 800: (8, 100)}  # NICs x Gb/s
    variants = {
        "ZeRO++ (qwZ + hpZ + qgZ)": ZEROPP,
        "hpZ only": {"zero_hpz_partition_size": 16},
        "qwZ only": {"zero_quantized_weights": True},
        "qgZ only": {"zero_quantized_gradients": True},
    }
    fig = go.Figure()
    print("\n| per-node bandwidth (Gb/s) | ZeRO-3 TFLOP/s | " + " | ".join(variants) + " |")
    print("|---" * (2 + len(variants)) + "|")
    for model in ("18B",):
        base = [tflops(scenario(model, "2K", *layout[g][:1], {}, layout[g][1])) for g in bandwidths]
        gains = {
            name: [
                tflops(scenario(model, "2K", layout[g][0], z, layout[g][1])) / b
                for g, b in zip(bandwidths, base, strict=True)
            ]
            for name, z in variants.items()
        }
        for i, g in enumerate(bandwidths):
            print(f"| {g} | {base[i]:.1f} | " + " | ".join(f"{gains[n][i]:.2f}x" for n in variants) + " |")
        for name, ys in gains.items():
            fig.add_trace(go.Scatter(x=bandwidths, y=ys, mode="lines+markers", name=name))
    pub = PUBLISHED
    fig.add_trace(
        go.Scatter(
            x=[100, 400],
            y=[
                pub[("1x100", "2K")]["18B"][1] / pub[("1x100", "2K")]["18B"][0],
                pub[("4x100", "2K")]["18B"][1] / pub[("4x100", "2K")]["18B"][0],
            ],
            mode="markers",
            marker={"size": 12, "symbol": "diamond"},
            name="published ZeRO++ (DeepSpeed blog)",
        )
    )
    fig.update_layout(
        title="18B GPT, 384 V100 (24 DGX-2), 2K tokens/GPU: throughput gain over ZeRO-3",
        xaxis={"type": "log", "title": "inter-node bandwidth per node (Gb/s)", "tickvals": bandwidths},
        yaxis={"title": "speed-up over ZeRO-3"},
        width=900,
        height=520,
    )
    out = Path(__file__).resolve().parents[1] / "docs" / "images"
    out.mkdir(exist_ok=True)
    fig.write_image(out / "zeropp-bandwidth.png")


if __name__ == "__main__":
    main()
