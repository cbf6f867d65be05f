"""What the GPU benchmarks (compile_delta.py, moe_grouped_gemm.py) write: their rows with the device and PyTorch
that measured them."""

from __future__ import annotations

import json

import torch


def save(path: str | None, rows: list[dict]) -> None:
    """Write ``rows`` to ``path`` (nothing without one) as {"meta": device and PyTorch, "rows": rows}."""
    if not path:
        return
    cuda = torch.cuda.is_available()
    meta = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__}
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
