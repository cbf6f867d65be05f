"""What a kind of run adds to its metrics: mixture-of-experts load and expert communication, FP8 utilisation,
and the time and cost of the whole training run."""

from __future__ import annotations

from simulator.metrics.metrics import Metrics

EXPERT_GROUPS = ("ep", "etp", "etp+ep")  # the dispatchers' groups (workload/moe.py)


def moe_metrics(load, comm_by_collective: dict) -> dict:
    """What a mixture-of-experts run adds: the busiest expert-parallel rank's rows over the mean rank's, the
    fraction of routed token copies the capacity dropped, and the dispatch / combine communication's time (DeepEP's
    RDMA and NVLink legs included)."""
    # DeepEP's two legs run on sub-groups of the expert group: "ep%8" across nodes (RDMA), "ep/8" inside them
    expert = [
        v
        for k, v in comm_by_collective.items()
        if k.split(":", 1)[1].replace("%", "/").split("/")[0] in EXPERT_GROUPS
    ]
    return {
        "busiest_rank_load": load.imbalance,
        "tokens_dropped_fraction": load.dropped,
        "expert_comm_s": sum(v["time_s"] for v in expert),
        "expert_comm_exposed_s": sum(v["exposed_s"] for v in expert),
    }


def train_metrics(tokens: float, m: Metrics, price_per_gpu_hour: float | None) -> dict:
    """Time and cost to train on ``tokens`` tokens at this iteration's throughput (the amortised one where optimizer
    phases differ): days, GPU-hours and, with a price, US dollars."""
    seconds_per_iteration = m.amortised_iteration_time_s or m.iteration_time_s
    rate = m.tokens_per_s * m.iteration_time_s / seconds_per_iteration  # tokens per second, amortised
    seconds = tokens / rate
    gpu_hours = seconds / 3600 * m.gpus
    return {
        "tokens": tokens,
        "days": seconds / 86400,
        "gpu_hours": gpu_hours,
        "price_per_gpu_hour": price_per_gpu_hour,
        "cost_usd": gpu_hours * price_per_gpu_hour if price_per_gpu_hour else None,
    }


def fp8_metrics(plan, m: Metrics, peak_16bit: float, peak_low: float) -> dict:
    """What an FP8 run adds: its recipe, and its model FLOP/s as a fraction of the low-precision dense peak (MFU
    stays against the bf16 peak, the convention of NVIDIA's and Megatron's published FP8 MFU)."""
    return {
        "recipe": plan.recipe,
        "library": plan.library,
        "gemm_dtype": plan.gemm_dtype,
        "mfu_vs_low_precision_peak": m.mfu * peak_16bit / peak_low,
    }
