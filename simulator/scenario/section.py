"""What every scenario section shares (unknown keys refused, frozen, no NaN or infinity), and the limits of
what one simulation can hold."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # defer_build: each model's validator is built on its first use, not at import (the package's models took 17 ms
    # of a 0.175 s start-up, measured 2026-11-27: benchmarks/bench_scale.py); sub-sections default through
    # default_factory, since an instance made in a class body would build its validator at import after all. The
    # hardware, framework and table models do the same.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)


# What one simulation can hold: every GPU of the cluster is placed and every micro-batch of the iteration is
# simulated (loader.py checks the products). 131,072 H100 simulate in about 13 s (benchmarks/bench_scale.py).
MAX_GPUS = 2**17
GBPS_MAX = 1e5  # GB/s or Gb/s: 100 TB/s
# the slowest rate a file may state, GB/s or Gb/s (10 MB/s): below any link a cluster has, and a smaller positive
# rate (5e-324 passes gt=0) only overflows the times it divides
GBPS_MIN = 0.01
EFFICIENCY_MIN = 0.01  # a link or kernel reaching under 1% of its nominal rate is a typo, not a measurement
MAX_MICROBATCHES = 2**16  # per iteration and data-parallel rank (gradient accumulation steps)
MAX_STAGE_MICROBATCHES = 2**20  # micro-batches x pipeline stages x virtual stages: about 15 s
