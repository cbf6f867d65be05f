"""How far the plan's screen (closed-form estimates) was from the simulation over the layouts it confirmed: the
line under plan's table, and a check of the screen itself (tests/test_plan.py)."""

from __future__ import annotations

import numpy as np


def screen_accuracy(confirmed: list) -> dict:
    """How the screen's estimates compare with the simulation over the simulated layouts that ran: Spearman's
    rank correlation (ties at their mean rank; None under three layouts or where either side is all one value)
    and the largest and mean |estimate / simulated - 1|, with the layout of the largest."""
    ok = [c for c in confirmed if c.status == "ok" and c.iteration_time_s]
    if not ok:
        return {
            "simulated": 0,
            "rank_correlation": None,
            "max_error": None,
            "mean_error": None,
            "worst": None,
        }
    est = np.array([c.estimate_s for c in ok])
    sim = np.array([c.iteration_time_s for c in ok])
    error = np.abs(est / sim - 1)
    rho = None
    if len(ok) >= 3 and np.ptp(est) > 0 and np.ptp(sim) > 0:
        rho = float(np.corrcoef(_ranks(est), _ranks(sim))[0, 1])
    worst = int(error.argmax())
    return {
        "simulated": len(ok),
        "rank_correlation": rho,
        "max_error": float(error[worst]),
        "mean_error": float(error.mean()),
        "worst": ok[worst].layout.label(),
    }


def accuracy_line(acc: dict) -> str | None:
    """:func:`screen_accuracy` as one line for a reader (None under two simulated layouts)."""
    if acc["simulated"] < 2:
        return None
    rho = f"rank correlation {acc['rank_correlation']:.2f}, " if acc["rank_correlation"] is not None else ""
    return (
        f"screen against simulation over the {acc['simulated']} simulated: {rho}estimates within "
        f"{acc['max_error']:.1%} (mean {acc['mean_error']:.1%}; largest: {acc['worst']})"
    )


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x``, equal values at their mean rank."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    _, inverse = np.unique(x, return_inverse=True)
    inverse = inverse.ravel()
    return (np.bincount(inverse, ranks) / np.bincount(inverse))[inverse]
