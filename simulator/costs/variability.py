"""Synchronous training runs at the pace of its slowest GPU.

GPUs of one model and SKU do not all sustain the same speed: manufacturing spread and power management leave
some slower than others. Sinha et al., "Not All GPUs Are Created Equal: Characterizing Variability in
Large-Scale, Accelerator-Rich Systems" (SC22, arXiv 2208.11035) measured more than 90% of the GPUs of five
clusters (Summit, Vortex, Longhorn, Frontera, Corona) and found 8% average performance variation (max 22%) for
compute-bound kernels, with outliers up to 1.5x slower than the median GPU.

Every collective and point-to-point transfer of a training step waits for its slowest participant, and the
data-parallel reduction joins every pipeline, so a job's compute phases advance at the speed of the slowest
of its ``n`` GPUs. With sustained speeds spread normally with standard deviation ``sd`` (as a fraction of the
typical GPU's), the slowest is on average ``sd * E[max of n standard normals]`` slower. One GPU runs at the
typical speed; 8 GPUs at 1.42 sd, 512 at 3.04 sd, 4,096 at 3.63 sd slower.
"""

from __future__ import annotations

from functools import cache
from math import erf, pi, sqrt

import numpy as np


@cache
def _grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x on [-12, 12] and the standard normal's density and distribution function there (shared by every n)."""
    x = np.linspace(-12.0, 12.0, 24001)
    pdf = np.exp(-0.5 * x * x) / sqrt(2 * pi)
    cdf = 0.5 * (1.0 + np.fromiter(map(erf, (x / sqrt(2.0)).tolist()), float, len(x)))  # math.erf per point
    return x, pdf, cdf


@cache
def expected_max_std_normal(n: int) -> float:
    """E[max of ``n`` independent standard normal variables]: 0 for n = 1, 1/sqrt(pi) for n = 2.

    E[max] = integral of x * n * phi(x) * Phi(x)^(n-1) dx, evaluated on a fine grid (the integrand is smooth
    and negligible beyond |x| = 12 for any n up to 10^7)."""
    if n < 1:
        raise ValueError(f"n must be at least 1 (got {n})")
    if n == 1:
        return 0.0
    x, pdf, cdf = _grid()
    # Phi^(n-1) through logs: Phi underflows to 0 far left, where the integrand is 0 anyway
    with np.errstate(divide="ignore"):
        power = np.exp((n - 1) * np.log(cdf))
    y = x * n * pdf * power
    return float(np.sum(y[1:] + y[:-1]) * 0.5 * (x[1] - x[0]))  # trapezoid rule (numpy >= 1.26)


def slowest_gpu_factor(sd: float, n: int) -> float:
    """How much longer a compute-bound kernel takes on the slowest of ``n`` GPUs than on a typical one."""
    if sd <= 0 or n <= 1:
        return 1.0
    return 1.0 + sd * expected_max_std_normal(n)


__all__ = ["expected_max_std_normal", "slowest_gpu_factor"]
