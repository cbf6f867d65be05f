"""The loss's memory: the output layer's logits and what the loss makes of them, in the order the frameworks
allocate and free them, replayed on the caching allocator (workload/allocator.py). Pure functions; each cites
its source."""

from __future__ import annotations

from simulator.frameworks import get_framework
from simulator.scenario.schema import Scenario
from simulator.workload.allocator import Event, replay

# The loss's tensors, in bytes per logit, in the order they are allocated and freed ("-" frees), from the output
# layer's logits to the 16-bit gradient handed back to it; replayed on the caching allocator's best fit
# (workload/allocator.py) for the most allocated at once and the most the allocator then holds.
# - Megatron: the fp32 logits its vocab-parallel cross-entropy keeps (Korthikanti et al. Sec. 4.3), made while
#   the 16-bit ones are still referenced (megatron/model/gpt_model.py post_language_model_processing passes
#   ``output.float()``; Megatron-Core's VocabParallelCrossEntropy casts inside, the caller holding the logits),
#   its softmax and gradient computed in place, the gradient cast back to 16 bits in the logits' hole. DeepSpeed's
#   pipeline engine keeps the last stage's outputs until their backward (pipe/engine.py _exec_forward_pass
#   ``self.pipe_buffers['outputs'][buffer_id] = outputs`` before the loss), so there the logits stay: 8 bytes.
# - PyTorch's F.cross_entropy as torchtitan calls it (torchtitan 9dec370 train.py, v0.2.2
#   components/loss.py ``cross_entropy_loss``: ``F.cross_entropy(pred.flatten(0, 1).float(), labels...)``, then
#   ``del pred`` before ``loss.backward()``): the 16-bit logits, their fp32 copy and log_softmax's fp32 output;
#   the copy and the logits freed before backward leave a 6-byte hole under the log-probabilities, in which
#   nll_loss_backward's fp32 gradient fits but log_softmax_backward's next one does not: 12 bytes allocated at
#   once, 14 held. Under torch.distributed.pipelining the stage keeps its output for backward (no ``del``).
#   Compiled with the model (training.compile_loss) the copy fuses into log_softmax and its backward into one
#   kernel writing the 16-bit gradient.
# - With tensor parallelism torchtitan runs the loss vocabulary-parallel (loss_parallel, on unless disabled):
#   torch/distributed/tensor/parallel/loss.py ``_log_softmax`` makes x - max ("shifted") and its exp beside the
#   fp32 copy, and its ``_nll_loss_backward`` builds the gradient from exp(log-probabilities) through two more
#   fp32 temporaries: 16 bytes at once, 18 held.
# Each sequence is what torch's profiler records (benchmarks/loss_allocations.py, torch 2.13 on the CPU: the
# same aten ops as on a GPU). Measured on one H100, torchtitan's 8B step at 32,768 tokens allocates 67.7 GiB at
# its peak (docs/measurements/h100-torchtitan-8b-rank.json), which 12 bytes per logit account for and 10 do not.
# - flash-attn's fused cross-entropy (MPT's fused_crossentropy) keeps the 16-bit logits and, in backward, writes
#   their 16-bit gradient beside them (xentropy_cuda.backward, not in place: inplace_backward defaults to False).
_TORCH_FORWARD = (("+logits", 2), ("+fp32", 4), ("+logprobs", 4), ("-fp32", 0), ("-logits", 0))
_TORCH_BACKWARD = (
    ("+nll grad", 4),
    ("+grad", 4),
    ("-nll grad", 0),
    ("-logprobs", 0),
    ("+grad16", 2),
    ("-grad", 0),
)
LOSS_TENSORS: dict[str, tuple[Event, ...]] = {
    "megatron": (("+logits", 2), ("+fp32", 4), ("-logits", 0), ("+grad16", 2), ("-fp32", 0)),
    "torch": (*_TORCH_FORWARD, *_TORCH_BACKWARD),
    "torch-compiled": (("+logits", 2), ("+logprobs", 4), ("-logits", 0), ("+grad16", 2), ("-logprobs", 0)),
    "torch-parallel": (
        ("+logits", 2), ("+fp32", 4), ("+shifted", 4), ("+exp", 4), ("-exp", 0), ("+logprobs", 4),
        ("-shifted", 0), ("-fp32", 0), ("-logits", 0),
        ("+nll grad", 4), ("+exp", 4), ("+sum", 4), ("-exp", 0), ("+grad", 4), ("-sum", 0), ("-nll grad", 0),
        ("-logprobs", 0), ("+grad16", 2), ("-grad", 0),
    ),
    "flash-attn": (("+logits", 2), ("+grad16", 2), ("-logits", 0), ("-grad16", 0)),
}  # fmt: skip
# a pipeline stage keeping its output (the logits) until its backward
for _kind in ("torch", "torch-parallel", "megatron"):
    _seq = LOSS_TENSORS[_kind]
    LOSS_TENSORS[f"{_kind}-held"] = (*(e for e in _seq if e[0] != "-logits"), ("-logits", 0))
# bytes per logit (allocated at once, held by the allocator)
LOSS_BYTES: dict[str, tuple[float, float]] = {k: replay(v) for k, v in LOSS_TENSORS.items()}
LOGIT_BYTES = {k: v[0] for k, v in LOSS_BYTES.items()}


def loss_kind(s: Scenario) -> str:
    """Which of LOSS_TENSORS the scenario's loss runs: the framework's, compiled, vocabulary-parallel or under
    pipelining as the scenario has it."""
    loss = get_framework(s.framework).loss
    p = s.parallelism
    if (
        loss == "megatron"
    ):  # DeepSpeed's pipeline engine keeps each stage's outputs for backward (pipe_buffers)
        return "megatron-held" if p.pipeline_parallel > 1 and p.pipeline_schedule == "deepspeed" else loss
    if loss != "torch":
        return loss
    if s.training.compile and s.training.compile_loss:
        return "torch-compiled"
    kind = "torch-parallel" if p.tensor_parallel > 1 else "torch"
    return f"{kind}-held" if p.pipeline_parallel > 1 else kind


def head_reserve_bytes(s: Scenario) -> float:
    """What the caching allocator holds beyond its allocated peak at the loss: the holes its tensors leave
    (LOSS_TENSORS), per micro-batch on the last stage."""
    m, p = s.model, s.parallelism
    logits = (
        m.seq_length // p.context_parallel * s.training.micro_batch_size * m.vocab_size / p.tensor_parallel
    )
    allocated, held = LOSS_BYTES[loss_kind(s)]
    return (held - allocated) * logits


def head_activation_bytes(s: Scenario) -> float:
    """Output layer: final layernorm input and the logits live at the loss (LOSS_TENSORS: the most the
    framework's loss allocates at once; Korthikanti et al. Sec. 4.3 count 4 s b h / t + 4 s b v / t for the last
    stage)."""
    m, p = s.model, s.parallelism
    sq, b, t = m.seq_length // p.context_parallel, s.training.micro_batch_size, p.tensor_parallel
    return 4 * sq * b * m.hidden_size / t + LOGIT_BYTES[loss_kind(s)] * sq * b * m.vocab_size / t
