"""Which layers each pipeline stage and model chunk holds, and the layouts the pipeline frameworks refuse."""

from __future__ import annotations

from dataclasses import replace

from simulator.errors import ScenarioError
from simulator.scenario.schema import Scenario
from simulator.strategy.pipeline.route import Route
from simulator.strategy.schedules import DUAL
from simulator.strategy.units import Unit, units
from simulator.workload.transformer import Workload


def check(s: Scenario) -> None:
    """One clear message per combination the modelled frameworks do not support."""
    p = s.parallelism
    if p.virtual_pipeline_stages < 2 and p.pipeline_schedule == "interleaved-1f1b":
        raise ScenarioError(
            "parallelism: pipeline_schedule interleaved-1f1b needs virtual_pipeline_stages >= 2 (without them "
            "Megatron runs plain 1F1B: set pipeline_schedule: 1f1b, or virtual stages)"
        )
    if p.pipeline_schedule in DUAL:
        _check_dual(s)
    else:
        _check_layers(s)
    _check_sharding(s)


def _check_layers(s: Scenario) -> None:
    """Megatron's and DeepSpeed's schedules: virtual stages, the layer split, interleaving's micro-batches."""
    p, m = s.parallelism, s.model
    pp, v = p.pipeline_parallel, p.virtual_pipeline_stages
    if v > 1 and p.pipeline_schedule != "interleaved-1f1b":
        raise ScenarioError(
            f"parallelism.virtual_pipeline_stages ({v}) needs pipeline_schedule: interleaved-1f1b "
            f"(got {p.pipeline_schedule})"
        )
    first, last = p.first_pipeline_stage_layers, p.last_pipeline_stage_layers
    if p.pipeline_layout is not None:
        pass  # every stage stated, checked with the scenario (schema.py _check_layout)
    elif first or last:
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


def _check_sharding(s: Scenario) -> None:
    """What data-parallel sharding the pipeline frameworks run beside a pipeline."""
    p, pp = s.parallelism, s.parallelism.pipeline_parallel
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


def _check_dual(s: Scenario) -> None:
    """What deepseek-ai/DualPipe's ``step`` asserts (3da1bbe: ``num_chunks >= num_ranks * 2``; DualPipe also an even
    number of ranks and of micro-batches), two chunks a rank, and the layers splitting over the path's stages."""
    p, name = s.parallelism, s.parallelism.pipeline_schedule
    pp, v, gas = p.pipeline_parallel, p.virtual_pipeline_stages, s.gradient_accumulation_steps
    if v != 2:
        raise ScenarioError(
            f"parallelism: pipeline_schedule {name} holds two model chunks a rank: virtual_pipeline_stages must be "
            f"2 or unset (got {v})"
        )
    if name == "dualpipe" and pp % 2:
        raise ScenarioError(f"parallelism: dualpipe needs an even pipeline_parallel (got {pp})")
    if gas < 2 * pp or (name == "dualpipe" and gas % 2):
        even = " and even" if name == "dualpipe" else ""
        raise ScenarioError(
            f"parallelism: {name} needs at least 2 x pipeline_parallel = {2 * pp}{even} micro-batches per pipeline; "
            f"global_batch_size / (micro_batch_size x data_parallel) = {s.training.global_batch_size} / "
            f"({s.training.micro_batch_size} x {p.data_parallel}) = {gas}"
        )
    stages = p.path_stages
    first, last = p.first_pipeline_stage_layers, p.last_pipeline_stage_layers
    inner = stages - (first is not None) - (last is not None)
    rest = s.model.num_layers - (first or 0) - (last or 0)
    # (a layout states every stage: schema.py _check_layout)
    if p.pipeline_layout is None and (rest < 0 or (inner == 0 and rest) or (inner and rest % inner)):
        given = "".join(
            f" - {n}_pipeline_stage_layers ({x})"
            for n, x in (("first", first), ("last", last))
            if x is not None
        )
        raise ScenarioError(
            f"parallelism: {name} splits the model into {stages} stages; model.num_layers ({s.model.num_layers})"
            f"{given} = {rest} does not split evenly over {inner} of them"
        )
    if p.fsdp is not None and name == "dualpipe":
        raise ScenarioError(
            "parallelism: dualpipe with fsdp is not modelled (DeepSeek runs it with ZeRO-1; torchtitan pipelines "
            "FSDP2 with dualpipev)"
        )


def chunk_units(w: Workload, pp: int, v: int) -> dict[tuple[int, int], list[Unit]]:
    """Units of each (stage, chunk): the model stage at the chunk's position on a micro-batch's path
    (``pipeline/route.py``; Megatron's global chunk g = chunk x pp + stage) holds the next ``counts[g]`` layers;
    the embedding goes first on the path's first stage, the output head (and multi-token prediction) last on
    its last; DualPipe's two paths hold every model stage twice, so the embedding and the output layer too."""
    us = units(w)
    par = w.scenario.parallelism
    r = Route(par.pipeline_schedule, pp, v)
    if par.pipeline_layout is not None:  # Megatron-Core's layout string says each stage's layers
        counts = [stage.layers for stage in par.layout_stages]
    elif par.pipeline_schedule in DUAL:
        counts = _path_counts(w, r.length)
    else:
        counts = _megatron_counts(w, pp, v)
    starts = [sum(counts[:k]) for k in range(r.length)]
    out: dict[tuple[int, int], list[Unit]] = {}
    for key, (_, k) in r.pos.items():
        out[key] = list(us[1 + starts[k] : 1 + starts[k] + counts[k]])
    for key in r.starts:
        out[key].insert(0, us[0])
    # with tied embeddings Megatron keeps a copy of the word embedding on the last stage for the logits; so it does
    # for multi-token prediction, whose depths embed the next tokens (Megatron-Core core_v0.15.0 gpt_model.py: "if
    # self.pre_process or self.mtp_process: self.embedding = ...", the copy tied to the first stage's, L142, L745),
    # where that stage's rank does not hold the embedding already
    m = w.scenario.model
    mtp = [u for u in us if u.name.startswith("mtp ")]
    # multi-token prediction runs on the last stage, after its layers (Megatron-Core mtp_on_last_stage), or on the
    # stage a layout gives it (Megatron's standalone MTP stage, which builds its own embedding and output layer)
    at = next((k for k, x in enumerate(par.layout_stages or ()) if x.mtp), r.length - 1)
    standalone = at != r.length - 1
    for key in r.ends:
        copy = m.mtp_layers and not m.tied_embeddings and key[0] not in {st for st, _ in r.starts}
        out[key] += [] if standalone else mtp
        out[key].append(
            replace(us[-1], params=w.head.params + (w.embedding.params if copy and not standalone else 0))
        )
    if standalone and mtp:
        # (tied, the output layer computes with the embedding's weight: one copy)
        copies = w.embedding.params + (
            0 if m.tied_embeddings else m.vocab_size * m.hidden_size // par.tensor_parallel
        )
        for key, (_, k) in r.pos.items():
            if k == at:
                out[key] += [replace(mtp[0], params=mtp[0].params + copies), *mtp[1:]]
    return out


def _megatron_counts(w: Workload, pp: int, v: int) -> list[int]:
    """Layers of each global chunk g = chunk x pp + stage: even, or with the first and last stages' given counts
    and the rest even in between; with interleaving each stage's layers split over its v chunks as evenly as
    possible, the first stage's first chunk and the last stage's last chunk the lightest (Llama 3's 126 layers on
    16 x 2 chunks: one layer fewer in each)."""
    par = w.scenario.parallelism
    first, last = par.first_pipeline_stage_layers, par.last_pipeline_stage_layers
    if not (first or last):
        return [w.num_layers // (pp * v)] * (pp * v)
    split = {}
    for st, n in enumerate(_path_counts(w, pp)):
        base, extra = divmod(n, v)
        chunks = [base] * v
        for k in range(extra):  # the remainder goes to the chunks away from the model's ends
            chunks[v - 1 - k if st == 0 else k] += 1
        split[st] = chunks
    return [split[st][c] for c in range(v) for st in range(pp)]


def _path_counts(w: Workload, length: int) -> list[int]:
    """Layers of each model stage along a path: the first and last stage's given counts, the rest even."""
    par = w.scenario.parallelism
    first, last = par.first_pipeline_stage_layers, par.last_pipeline_stage_layers
    inner = length - (first is not None) - (last is not None)
    middle = (w.num_layers - (first or 0) - (last or 0)) // max(inner, 1)
    counts = [middle] * length
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def stage_label(stage: int, mine: list[Unit]) -> str:
    """``stage 0: 4 layers + embedding``: how a stage's rank is named in tables and reports."""
    extras = [
        name
        for name, unit in (("embedding", "embedding"), ("output layer", "head"))
        if any(u.name == unit for u in mine)
    ]
    return f"stage {stage}: {sum(u.is_layer for u in mine)} layers" + "".join(f" + {e}" for e in extras)
