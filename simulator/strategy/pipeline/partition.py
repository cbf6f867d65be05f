"""Which layers each pipeline stage and model chunk holds, and the layouts the pipeline frameworks refuse."""

from __future__ import annotations

from dataclasses import replace

from simulator.errors import ScenarioError
from simulator.scenario.schema import Scenario
from simulator.strategy.units import Unit, units
from simulator.workload.transformer import Workload


def check(s: Scenario) -> None:
    """One clear message per combination the modelled frameworks do not support."""
    p, m = s.parallelism, s.model
    pp, v = p.pipeline_parallel, p.virtual_pipeline_stages
    if v < 2 and p.pipeline_schedule == "interleaved-1f1b":
        raise ScenarioError(
            "parallelism: pipeline_schedule interleaved-1f1b needs virtual_pipeline_stages >= 2 (without them "
            "Megatron runs plain 1F1B: set pipeline_schedule: 1f1b, or virtual stages)"
        )
    if v > 1 and p.pipeline_schedule != "interleaved-1f1b":
        raise ScenarioError(
            f"parallelism.virtual_pipeline_stages ({v}) needs pipeline_schedule: interleaved-1f1b "
            f"(got {p.pipeline_schedule})"
        )
    first, last = p.first_pipeline_stage_layers, p.last_pipeline_stage_layers
    if first or last:
        middle_layers = m.num_layers - (first or 0) - (last or 0)
        middle_stages = pp - (first is not None) - (last is not None)
        if (
            middle_layers < 0
            or (middle_stages == 0 and middle_layers)
            or (middle_stages and middle_layers % middle_stages)
        ):
            raise ScenarioError(
                f"parallelism: model.num_layers ({m.num_layers}) - first_pipeline_stage_layers ({first or 0}) - "
                f"last_pipeline_stage_layers ({last or 0}) = {middle_layers} does not split evenly over the "
                f"{middle_stages} other stages"
            )
        per_middle = middle_layers // middle_stages if middle_stages else 0
        if v > 1 and per_middle % v:
            raise ScenarioError(
                f"parallelism: the middle stages' {per_middle} layers each do not split into "
                f"virtual_pipeline_stages ({v}) equal chunks"
            )
        # one chunk of the first (last) stage may hold the embedding (output layer) alone: Megatron-Core's split
        # with --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split
        for name, n, alone in (("first", first, "embedding"), ("last", last, "output layer")):
            if v > 1 and n is not None and n < v - 1:
                raise ScenarioError(
                    f"parallelism: {name}_pipeline_stage_layers ({n}) gives more than one of the stage's "
                    f"virtual_pipeline_stages ({v}) chunks no layer (one may hold the {alone} alone)"
                )
    elif m.num_layers % (pp * v):
        raise ScenarioError(
            f"model.num_layers ({m.num_layers}) is not divisible by pipeline_parallel ({pp}) x "
            f"virtual_pipeline_stages ({v}) = {pp * v}"
        )
    gas = s.gradient_accumulation_steps
    if p.pipeline_schedule == "interleaved-1f1b" and gas % pp:
        raise ScenarioError(
            f"parallelism: interleaved-1f1b needs the microbatches per pipeline, global_batch_size / "
            f"(micro_batch_size x data_parallel) = {s.training.global_batch_size} / ({s.training.micro_batch_size}"
            f" x {p.data_parallel}) = {gas}, to be a multiple of pipeline_parallel ({pp})"
        )
    if p.zero_stage > 1:
        raise ScenarioError(
            f"parallelism: zero_stage {p.zero_stage} with pipeline_parallel ({pp}) is not supported by "
            "DeepSpeed's pipeline engine or Megatron (use zero_stage 0 or 1)"
        )
    if p.fsdp is not None and p.fsdp.reshard_after_forward:
        raise ScenarioError(
            "parallelism: fsdp with pipeline_parallel > 1 needs fsdp.reshard_after_forward: false (torchtitan's "
            "setting under pipelining: parameters stay gathered across the micro-batches); gathering them again "
            "for every micro-batch is not modelled"
        )
    if p.fsdp is not None and p.fsdp.hybrid_shard_size:
        raise ScenarioError(
            "parallelism: fsdp.hybrid_shard_size (HSDP) with pipeline_parallel > 1 is not modelled; leave it unset "
            "to shard over the whole data-parallel group"
        )


def chunk_units(w: Workload, pp: int, v: int) -> dict[tuple[int, int], list[Unit]]:
    """Units of each (stage, chunk): global chunk g = chunk x pp + stage holds layers [g L/(pp v), ...);
    the embedding goes first on chunk 0 of stage 0, the output head last on the last chunk of the last stage."""
    us = units(w)
    par = w.scenario.parallelism
    first, last = par.first_pipeline_stage_layers, par.last_pipeline_stage_layers
    if first or last:
        # uneven stages: the given counts at the ends, the rest evenly in between; with interleaving each stage's
        # layers split over its v chunks as evenly as possible, the first stage's first chunk and the last
        # stage's last chunk the lightest (Llama 3's 126 layers on 16 x 2 chunks: one layer fewer in each)
        middle = (w.num_layers - (first or 0) - (last or 0)) // max(
            pp - (first is not None) - (last is not None), 1
        )
        per_stage = [middle] * pp
        if first is not None:
            per_stage[0] = first
        if last is not None:
            per_stage[-1] = last
        split = {}
        for st, n in enumerate(per_stage):
            base, extra = divmod(n, v)
            chunks = [base] * v
            for k in range(extra):  # the remainder goes to the chunks away from the model's ends
                chunks[v - 1 - k if st == 0 else k] += 1
            split[st] = chunks
        counts = [split[st][c] for c in range(v) for st in range(pp)]
    else:
        counts = [w.num_layers // (pp * v)] * (pp * v)
    starts = [sum(counts[:g]) for g in range(len(counts))]
    out: dict[tuple[int, int], list[Unit]] = {}
    for c in range(v):
        for st in range(pp):
            g = c * pp + st
            out[(st, c)] = us[1 + starts[g] : 1 + starts[g] + counts[g]]
    out[(0, 0)].insert(0, us[0])
    # multi-token prediction runs on the last stage, after its layers (Megatron-Core mtp_on_last_stage)
    out[(pp - 1, v - 1)] += [u for u in us if u.name.startswith("mtp ")]
    # with tied embeddings Megatron keeps a copy of the word embedding on the last stage for the logits; so it does
    # for multi-token prediction, whose depths embed the next tokens (Megatron-Core core_v0.15.0 gpt_model.py: "if
    # self.pre_process or self.mtp_process: self.embedding = ...", the copy tied to the first stage's, L142, L745)
    head = w.head.params
    m = w.scenario.model
    if m.mtp_layers and pp > 1 and not m.tied_embeddings:
        head += w.embedding.params
    out[(pp - 1, v - 1)].append(replace(us[-1], params=head))
    return out


def stage_label(stage: int, mine: list[Unit]) -> str:
    """``stage 0: 4 layers + embedding``: how a stage's rank is named in tables and reports."""
    extras = [
        name
        for name, unit in (("embedding", "embedding"), ("output layer", "head"))
        if any(u.name == unit for u in mine)
    ]
    return f"stage {stage}: {sum(u.is_layer for u in mine)} layers" + "".join(f" + {e}" for e in extras)
