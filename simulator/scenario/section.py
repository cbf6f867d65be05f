"""What every scenario section shares (unknown keys refused, frozen, no NaN or infinity), and the limits of
what one simulation can hold."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# What one simulation can hold: every GPU of the cluster is placed and every micro-batch of the iteration is
# simulated (loader.py checks the products). 131,072 H100 simulate in about 13 s (benchmarks/bench_scale.py).
MAX_GPUS = 2**17
MAX_MICROBATCHES = 2**16  # per iteration and data-parallel rank (gradient accumulation steps)
MAX_STAGE_MICROBATCHES = 2**20  # micro-batches x pipeline stages x virtual stages: about 15 s
