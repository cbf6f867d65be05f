"""The caching allocator's replay (workload/allocator.py) and what the memory model takes from it: the loss's
holes, the phases that are never live together, and what torch's tensor parallelism keeps (workload/memory.py,
strategy/memory.py), each against a hand count."""

import pytest

from simulator import load_scenario, simulate
from simulator.workload.allocator import replay
from simulator.workload.loss import LOSS_BYTES, head_activation_bytes
from simulator.workload.memory import activation_bytes_per_layer


def test_best_fit_takes_the_smallest_hole_that_fits_and_splits_it():
    """a(4) b(1) c(2) d(1); a and c freed leave holes of 4 and 2: a request of 2 takes c's hole exactly, one of 3
    the low part of a's, and one of 2 more finds only a's last 1 and goes on top: 10 held, 9 allocated at most."""
    ev = [("+a", 4), ("+b", 1), ("+c", 2), ("+d", 1), ("-a", 0), ("-c", 0), ("+e", 2), ("+f", 3), ("+g", 2)]
    layout: list = []
    assert replay(ev, layout) == (9, 10)
    assert [(start, size, name) for start, size, name in layout] == [
        (0, 3, "f"), (3, 1, None), (4, 1, "b"), (5, 2, "e"), (7, 1, "d"), (8, 2, "g"),
    ]  # fmt: skip


def test_freed_neighbours_merge_and_a_free_block_on_top_grows_in_place():
    """a(2) b(2) c(2): b then a freed merge into one hole of 4 that a request of 4 fills; c freed at the top
    is extended by a request of 3 (expandable segments map the pages after it): 7 held, not 9."""
    ev = [("+a", 2), ("+b", 2), ("+c", 2), ("-b", 0), ("-a", 0), ("+d", 4), ("-c", 0), ("+e", 3)]
    assert replay(ev) == (7, 7)


def test_the_eager_losses_allocate_and_hold_as_counted_by_hand():
    """Bytes per logit (workload/loss.py LOSS_TENSORS): torch's F.cross_entropy on an fp32 copy allocates 12 at
    once (log-probabilities, nll_loss_backward's gradient, log_softmax_backward's) and holds 14; its
    vocabulary-parallel form 16 and 18; Megatron's in-place cross-entropy beside the 16-bit logits 6 and 6."""
    assert LOSS_BYTES["torch"] == (12, 14)
    assert LOSS_BYTES["torch-parallel"] == (16, 18)
    assert LOSS_BYTES["torch-held"] == (14, 14)
    assert LOSS_BYTES["megatron"] == (6, 6)
    assert LOSS_BYTES["torch-compiled"] == (6, 6)
    assert LOSS_BYTES["flash-attn"] == (4, 4)


def llama(framework="pytorch-2024", tp=1, accumulation=1, recompute="full"):
    dp = 8 // tp
    return load_scenario(
        {
            "name": "llama-narrow",
            "framework": framework,
            "model": {
                "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "num_query_groups": 8,
                "ffn_hidden_size": 3584, "seq_length": 4096, "vocab_size": 32000, "activation": "swiglu",
                "normalization": "rmsnorm", "position_embedding": "rope", "add_bias_linear": False,
                "attention": "flash", "tied_embeddings": False,
            },
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {
                "global_batch_size": dp * accumulation, "micro_batch_size": 1, "precision": "bf16",
                "activation_recompute": recompute,
            },
            "parallelism": {"data_parallel": dp, "tensor_parallel": tp, "sequence_parallel": tp > 1, "fsdp": {}},
        }
    )  # fmt: skip


def test_fsdp_runs_its_loss_before_the_steps_gradients_exist_and_the_allocator_holds_the_holes():
    """FSDP, one micro-batch, full recompute: the loss's working set (12 bytes per logit and the final norm's
    input, 4 s h) is the peak's, with the sharded gradients not yet allocated (zero_grad freed them) and of the
    buffers only the last block's gathered parameters; the backward's recomputation (one layer's whole
    activations, with the gradients) is smaller. Held beyond: the loss's 2 bytes per logit of holes, the
    recomputation's working set (the hole a layer's forward leaves under the logits) and what FSDP freed before
    the loss, kept by its streams' pools. With two micro-batches the second's loss runs beside the first's
    gradients."""
    s, s2 = llama(), llama(accumulation=2)
    m, m2 = (simulate(x).metrics.memory_gib for x in (s, s2))
    gib = 2**30
    tokens, logits = 4096, 4096 * 32000
    loss = head_activation_bytes(s)
    assert loss == 4 * tokens * 1024 + 12 * logits
    kept = 4 * 2 * tokens * 1024  # four layer inputs
    whole = activation_bytes_per_layer(s, recompute="none")
    assert whole < loss
    block = simulate(s).workload.layer.params * 2  # bf16
    relief = m["grads"] * gib + m["buffers"] * gib - block
    assert m["activations"] * gib == pytest.approx(kept + loss - relief, rel=1e-9)
    assert m["reserved"] * gib == pytest.approx(m["peak"] * gib + 2 * logits + whole + relief, rel=1e-9)
    assert m2["activations"] * gib == pytest.approx(kept + loss - (m2["buffers"] * gib - block), rel=1e-9)


def test_torchs_tensor_parallelism_keeps_the_gathered_inputs_of_its_column_parallel_layers():
    """With sequence parallelism Megatron keeps the QKV and MLP inputs sequence-sharded (2 s h / t bytes each);
    torch's ColwiseParallel keeps what it all-gathered, the whole sequence (2 s h each): 4 s h (1 - 1/t) more per
    layer at TP 4."""
    torch_tp, megatron_tp = llama(tp=4, recompute="none"), llama("megatron-core-2024", tp=4, recompute="none")
    sh = 4096 * 1024
    assert activation_bytes_per_layer(torch_tp) - activation_bytes_per_layer(megatron_tp) == pytest.approx(
        4 * sh * (1 - 1 / 4), rel=1e-12
    )


def test_the_first_stage_holds_the_whole_vocabularys_embedding_gradient_under_torch_tp_and_pipelining():
    """torch's tensor parallelism shards the embedding by vocabulary but DTensor computes its gradient whole (no
    vocabulary-sharded backward strategy), and FSDP2 under pipelining accumulates it unsharded in fp32. Stage 0
    of 2, 1F1B, 4 micro-batches (F F B F B F B B), K bytes kept per micro-batch, V x h = E elements, TP 2:
    at the first backward (one micro-batch still in flight) K + 6 E (the 16-bit gradient, its fp32 cast); from
    then on 4 E (1 - 1/2) = 2 E more than the gradient's shard; at each later backward K' + 2 E + 6 E. The most:
    the second backward, with one micro-batch in flight after it: K + 8 E. A Megatron-style stack keeps none."""
    from types import SimpleNamespace

    from simulator.strategy.pipeline.memory import _embedding_gradient, _walk
    from simulator.strategy.schedules import get_schedule

    s = load_scenario(
        {
            "name": "pp-tp",
            "framework": "pytorch-2024",
            "model": {"preset": "llama3-8b", "seq_length": 2048},
            "cluster": {"topology": "dgx-h100", "num_nodes": 1},
            "training": {"global_batch_size": 8, "micro_batch_size": 1, "activation_recompute": "full"},
            "parallelism": {
                "tensor_parallel": 2, "sequence_parallel": True, "pipeline_parallel": 2, "data_parallel": 2,
                "fsdp": {"reshard_after_forward": False},
            },
        }
    )  # fmt: skip
    steps = get_schedule("1f1b")(2, 4, 1, 0)
    assert [k for k, _, _ in steps] == ["F", "F", "B", "F", "B", "F", "B", "B"]
    chunks = {(0, 0): [SimpleNamespace(name="embedding"), SimpleNamespace(name="layer")]}
    change = {"F": 1.0, "B": -1.0, "W": -0.5, "O": 0.0}
    K = 1000.0
    E = 128256 * 4096
    torch_tp = SimpleNamespace(framework=SimpleNamespace(tensor_parallel="dtensor"))
    tasks = [(x,) for x in steps]  # one step a task (pipeline/memory.py walks tasks)
    most, at_embedding = _walk(tasks, change, {0: K}, _embedding_gradient(s, torch_tp, chunks, 0, 1))
    assert at_embedding == K + 8 * E
    # two in flight again after the third forward, beside the accumulated gradient
    assert most == 2 * K + 2 * E
    megatron = SimpleNamespace(framework=SimpleNamespace(tensor_parallel="megatron"))
    assert _embedding_gradient(s, megatron, chunks, 0, 1) is None
    assert _walk(tasks, change, {0: K}, None) == (2 * K, 0.0)
