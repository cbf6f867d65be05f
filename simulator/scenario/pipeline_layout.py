"""Megatron-Core's pipeline layout string (``--pipeline-model-parallel-layout``; Megatron-LM d98e8a64,
megatron/core/transformer/pipeline_parallel_layer_layout.py ``parse_str_to_list`` and ``validate_layer_layout``).

``"Et*3|(tt|)*29,m|L"``: one ``|``-separated entry per virtual pipeline stage in Megatron's flattened order
(virtual stage v of rank r at v x PP + r), each listing what it holds: ``E`` the embedding, ``t`` a transformer
layer, ``m`` a multi-token prediction layer, ``L`` the output layer and loss. ``(..)*n`` and ``x*n`` repeat,
commas are cosmetic, an entry may be empty.
"""

from __future__ import annotations

import re
from typing import NamedTuple

SYMBOLS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}


class Stage(NamedTuple):
    """One virtual stage of a layout: its transformer and multi-token prediction layers, and whether it holds
    the embedding or the loss."""

    layers: int
    mtp: int
    embedding: bool
    loss: bool


def unroll(layout: str) -> str:
    """The layout with its repeats written out and its commas gone (``parse_str_to_list``'s two passes)."""
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    return text


def parse(layout: str) -> list[Stage]:
    """The stages of a layout string, as Megatron unrolls it; ValueError naming the character it does not know."""
    stages = []
    for entry in unroll(layout).split("|"):
        bad = sorted(set(entry) - set(SYMBOLS))
        if bad:
            raise ValueError(
                f"parallelism.pipeline_layout {layout!r}: unknown character {bad[0]!r} (Megatron's layout knows "
                "E embedding, t transformer layer, m multi-token prediction layer, L loss, | between stages, "
                "(..)*n and x*n repeats)"
            )
        stages.append(Stage(entry.count("t"), entry.count("m"), "E" in entry, "L" in entry))
    return stages


def check(layout: str, stages: list[Stage], num_layers: int, mtp_layers: int, positions: int) -> None:
    """``validate_layer_layout``'s conditions, for ``positions`` virtual stages; ValueError with the one that
    fails."""
    where = f"parallelism.pipeline_layout {layout!r}"
    if len(stages) != positions:
        raise ValueError(f"{where}: {len(stages)} stages, where the pipeline has {positions}")
    text = unroll(layout).replace("|", "")
    if text.count("E") != 1 or not text.startswith("E"):
        raise ValueError(f"{where}: the embedding (E) must come first, once")
    if text.count("L") != 1 or not text.endswith("L"):
        raise ValueError(f"{where}: the loss (L) must come last, once")
    layers = sum(s.layers for s in stages)
    if layers != num_layers:
        raise ValueError(f"{where}: {layers} transformer layers (t), where model.num_layers is {num_layers}")
    mtp = sum(s.mtp for s in stages)
    if mtp != mtp_layers:
        raise ValueError(
            f"{where}: {mtp} multi-token prediction layers (m), where model.mtp_layers is {mtp_layers}"
        )
    if mtp and "t" in text[text.index("m") :]:
        raise ValueError(f"{where}: the multi-token prediction layers (m) go after every transformer layer")
    if mtp and max(s.mtp for s in stages) != mtp:
        raise ValueError(f"{where}: every multi-token prediction layer (m) goes in one stage")
