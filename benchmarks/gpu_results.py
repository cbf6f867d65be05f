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


def main_of(doc: str, run, options: dict | None = None) -> int:
    """The command line of a GPU benchmark: ``--json FILE`` and ``--repeats N``, and ``options`` (flag ->
    argparse keywords, each passed to ``run`` by its name); ``run(device, repeats, quick, ...)`` times on the GPU,
    or a tiny smoke run (``quick``) on a CPU."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--json", help="write every timing to this file")
    ap.add_argument("--repeats", type=int, default=10)
    for flag, kwargs in (options or {}).items():
        ap.add_argument(flag, **kwargs)
    args = vars(ap.parse_args())
    path, repeats = args.pop("json"), args.pop("repeats")
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    save(path, run(device, repeats if cuda else 1, quick=not cuda, **args))
    return 0
