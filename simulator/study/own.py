"""The --scenario file's own layout beside the plan's pick (``plan --scenario``)."""

from __future__ import annotations

import math

from simulator.metrics.metrics import layout_label
from simulator.scenario.schema import Scenario
from simulator.study.layouts import stage_split
from simulator.study.plan import _confirm, seconds


def own_layout(own: Scenario, gpus: int, batch: int, result: dict) -> dict | None:
    """The --scenario file's own layout, simulated as it is where it has the plan's GPUs and batch, beside the
    plan's pick: a schedule or split the search does not cover (DualPipe, a layout string) may beat every layout
    it found. None where the file's job differs or does not run."""
    p = own.parallelism
    if p.tensor_parallel * p.pipeline_parallel * p.context_parallel * p.data_parallel != gpus:
        return None
    if own.training.global_batch_size != batch:
        return None
    got = _confirm(own)
    if isinstance(got, str):
        return None
    label = layout_label(own)
    pick = next((r for r in result["top"] if r["status"] == "ok"), None)
    row = {"layout": label, "iteration_time_s": got["iteration_time_s"], "memory_gib": got["device_gib"]}
    row["fits"] = not got["oom"]
    best = pick["iteration_time_s"] if pick else math.inf
    row["beats_pick"] = row["fits"] and got["iteration_time_s"] < best
    # what the search does not lay out: a layout string, end stages other than its even split (stage_split)
    split = stage_split(own.model.num_layers, p.path_stages)
    ends = (p.first_pipeline_stage_layers, p.last_pipeline_stage_layers)
    uncovered = [
        x
        for x, on in (
            ("its pipeline_layout", p.pipeline_layout is not None),
            ("its end stages' layers", any(ends) and (split is None or ends != (split[0], split[2]))),
        )
        if on
    ]

    row["note"] = (
        f"the scenario's own layout, {label}, simulates at {seconds(got['iteration_time_s'])}"
        + (" (out of memory)" if not row["fits"] else "")
        + (
            f": faster than the plan's pick ({seconds(best)}), by "
            f"{1 - got['iteration_time_s'] / best:.1%}"
            + (f"; the search does not cover {' and '.join(uncovered)}" if uncovered else "")
            if row["beats_pick"]
            else ""
        )
    )
    return row
