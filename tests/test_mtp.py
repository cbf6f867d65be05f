"""Multi-token prediction (DeepSeek-V3's MTP depths) on the last pipeline stage."""

import pytest

from simulator import load_scenario
from simulator.api import simulate
from simulator.strategy.pipeline.partition import chunk_units

BASE = {
    "model": {
        "preset": "deepseek-v2-lite",
        "seq_length": 4096,
        "num_layers": 8,
        "moe": {"first_dense_layers": 1},
    },
    "cluster": {"topology": "dgx-h100", "num_nodes": 1},
    "framework": "megatron-core-2024",
    "training": {"global_batch_size": 16, "micro_batch_size": 1},
    "parallelism": {"pipeline_parallel": 2, "data_parallel": 4, "expert_parallel": 4, "zero_stage": 1},
}


def scenario(mtp: int, tied: bool = False, pp: int = 2):
    model = {**BASE["model"], "mtp_layers": mtp, "tied_embeddings": tied}
    par = {**BASE["parallelism"], "pipeline_parallel": pp, "data_parallel": 8 // pp}
    return load_scenario({**BASE, "model": model, "parallelism": par})


@pytest.mark.parametrize(
    ("mtp", "tied", "pp", "copy"),
    [(1, False, 2, True), (0, False, 2, False), (1, True, 2, False), (1, False, 1, False)],
)
def test_the_mtp_stage_keeps_a_copy_of_the_word_embedding(mtp, tied, pp, copy):
    """Megatron-Core (core_v0.15.0 gpt_model.py L142, L745-752): the MTP stage embeds the next tokens, so a last
    stage that is not the first keeps a copy of the word embedding, tied to the first stage's; with tied embeddings
    the output layer's copy is that one already, and without a pipeline there is one stage."""
    result = simulate(scenario(mtp, tied, pp))
    w = result.workload
    head = chunk_units(w, pp, 1)[(pp - 1, 0)][-1]
    assert head.params == w.head.params + (w.embedding.params if copy else 0)


def test_the_copy_adds_its_model_states_to_the_last_stage():
    """A vocabulary of 102,400 x 2,048 = 209.7M parameters more on the last stage: its weights, gradients and
    optimizer shard, about 7 bytes a parameter here (BF16 weights and gradients, 12 bytes of Adam over 4 ranks)."""
    with_mtp = simulate(scenario(1)).metrics.stages
    without = simulate(scenario(0)).metrics.stages
    assert with_mtp[0]["memory_peak_gib"] == pytest.approx(without[0]["memory_peak_gib"])
    grown = with_mtp[-1]["memory_peak_gib"] - without[-1]["memory_peak_gib"]
    assert grown > 209.7e6 * 7 / 2**30  # the copy, and the MTP depth's own layer beside it
