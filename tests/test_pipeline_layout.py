"""Megatron-Core's --pipeline-model-parallel-layout (parallelism.pipeline_layout): parsed as Megatron-LM parses it,
checked as validate_layer_layout checks it, and placed stage by stage."""

import pytest
from conftest import make

from simulator import simulate
from simulator.errors import ScenarioError
from simulator.scenario.pipeline_layout import Stage, parse, unroll

MODEL = {
    "num_layers": 12,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "seq_length": 512,
    "vocab_size": 32000,
}


def run(par, model=MODEL, batch=16):
    s = make(
        model=model,
        cluster={"gpus_per_node": par["pipeline_parallel"]},
        training={"global_batch_size": batch, "micro_batch_size": 1},
        parallelism=par,
    )
    return simulate(s)


def test_unrolled_as_megatrons_parse_str_to_list_comments_say():
    assert unroll("xy(ab|cd|ef)*2,pq") == "xyab|cd|efab|cd|efpq"
    assert unroll("(ab)*3") == "ababab"
    assert unroll("ab,(cd|)*2") == "abcd|cd|"
    assert unroll("(|ab)*2,cd") == "|ab|abcd"
    stages = parse("Ettt|(tt|)*29,m|L")  # the docstring's DeepSeek-V3 layout: 32 stages, 61 layers
    assert stages[0] == Stage(3, 0, True, False)
    assert stages[1:30] == [Stage(2, 0, False, False)] * 29
    assert stages[30:] == [Stage(0, 1, False, False), Stage(0, 0, False, True)]


def test_a_layout_that_says_what_first_and_last_counts_say_runs_the_same():
    by_counts = run(
        {"pipeline_parallel": 4, "first_pipeline_stage_layers": 2, "last_pipeline_stage_layers": 4}
    )
    by_layout = run({"pipeline_parallel": 4, "pipeline_layout": "Ett|ttt|ttt|ttttL"})
    assert by_layout.metrics.iteration_time_s == by_counts.metrics.iteration_time_s
    assert [r.label for r in by_layout.program.ranks] == [r.label for r in by_counts.program.ranks]
    assert [r.memory.peak for r in by_layout.program.ranks] == [
        r.memory.peak for r in by_counts.program.ranks
    ]


def test_virtual_stages_come_from_the_layout_and_a_stage_may_hold_only_the_embedding():
    r = run({"pipeline_parallel": 2, "pipeline_layout": "E|ttt|ttt|tttttt,L"})
    par = r.scenario.parallelism
    assert (par.virtual_pipeline_stages, par.pipeline_schedule) == (2, "interleaved-1f1b")
    # stage 0 holds virtual stages 0 and 2 (E; ttt), stage 1 holds 1 and 3 (ttt; tttttt L)
    assert [r.label for r in r.program.ranks] == [
        "stage 0: 3 layers + embedding",
        "stage 1: 9 layers + output layer",
    ]


def test_a_standalone_multi_token_prediction_stage_holds_its_own_embedding_and_output_layer():
    model = MODEL | {"mtp_layers": 1, "tied_embeddings": False}
    r = run({"pipeline_parallel": 4, "pipeline_layout": "Ettt|tttt|tttttm|L"}, model)
    plain = run({"pipeline_parallel": 4, "pipeline_layout": "Ettt|tttt|ttttt|mL"}, model)
    ranks, ranks_plain = r.program.ranks, plain.program.ranks
    assert ranks[2].label == "stage 2: 6 layers" and ranks[3].label == "stage 3: 0 layers + output layer"
    # stage 2 gains the prediction layer with copies of the embedding and the output layer; stage 3 loses the
    # prediction layer and the embedding's copy it held for it: the difference is the output layer's copy, bf16
    gained = ranks[2].memory.params - ranks_plain[2].memory.params
    lost = ranks_plain[3].memory.params - ranks[3].memory.params
    assert gained - lost == 32000 * 512 * 2


@pytest.mark.parametrize(
    "par,text",
    [
        ({"pipeline_parallel": 4, "pipeline_layout": "Ettt|tttt|tttt|tttxL"}, "unknown character 'x'"),
        ({"pipeline_parallel": 4, "pipeline_layout": "Ettt|tttt|tttt|L"}, "11 transformer layers (t)"),
        (
            {"pipeline_parallel": 4, "pipeline_layout": "Ettt|tttt|ttttL"},
            "3 stages, where the pipeline has 4",
        ),
        (
            {"pipeline_parallel": 4, "pipeline_layout": "tEtt|tttt|tttt|tL"},
            "the embedding (E) must come first",
        ),
        ({"pipeline_parallel": 4, "pipeline_layout": "Ettt|tttt|tLtt|t"}, "the loss (L) must come last"),
        (
            {
                "pipeline_parallel": 4,
                "pipeline_layout": "Ettt|tttt|tttt|tL",
                "first_pipeline_stage_layers": 3,
            },
            "leave first_pipeline_stage_layers",
        ),
        (
            {
                "pipeline_parallel": 4,
                "pipeline_layout": "Ettt|tttt|tttt|tL",
                "pipeline_schedule": "deepspeed",
            },
            "a Megatron or DualPipe schedule",
        ),
    ],
)
def test_bad_layouts_get_one_line_naming_the_field(par, text):
    with pytest.raises(ScenarioError) as e:
        run(par)
    assert text in str(e.value) and "parallelism.pipeline_layout" in str(e.value) and "\n" not in str(e.value)
