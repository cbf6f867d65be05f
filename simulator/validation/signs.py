"""How validation errors are signed, one convention for every report of them (accuracy.py, first_contact.py,
runner.py): a speed error is + where the simulation is faster than measured, whatever the metric (an iteration time
compares as measured / simulated, a throughput as simulated / measured); a memory error is + where it needs more."""

from __future__ import annotations

SPEED_METRICS = ("iteration_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu")
MEMORY_METRICS = ("peak_memory_gib", "reserved_memory_gib")


def speed_error_pct(metric: str, published: float, predicted: float) -> float:
    """Simulated speed over measured speed, less 1, in %: positive = the simulation is faster than measured."""
    if metric == "iteration_time_s":
        return 100.0 * (published / predicted - 1.0)
    return 100.0 * (predicted / published - 1.0)


def kind_and_error(metric: str, published: float, predicted: float) -> tuple[str, float] | None:
    """(speed | memory, signed error %) of a prediction, or None for a metric that is neither."""
    if metric in SPEED_METRICS:
        return "speed", speed_error_pct(metric, published, predicted)
    if metric in MEMORY_METRICS:
        return "memory", 100.0 * (predicted / published - 1.0)
    return None
