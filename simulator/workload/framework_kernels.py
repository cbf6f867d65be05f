"""Kernels a framework launches beyond the model's own GEMMs, norms, softmax and activations.

The model's kernels (``transformer.py``) are what any implementation must run. An eager framework launches many
more small ones: bias adds outside the GEMM, layout copies, bias-gradient reductions, autograd's sums of
residual gradients, masks. Each costs a host dispatch and a little HBM traffic, which is what paces small
models (a 1,024-wide layer on one A100 issues ~80 kernels per microbatch in forward, recompute and backward).

``megatron-legacy``: Megatron-LM's ``megatron/model`` GPT as Megatron-DeepSpeed runs it in 2022-2023 (read at
microsoft/Megatron-DeepSpeed 4822c87e, 2023-09; the same layer code since the MoE merge of 2022-06), with apex
fused layer norm, the fused scale-mask-softmax and nvFuser-fused bias-dropout-add and bias-GeLU:

* forward: the QKV projection adds its bias in a separate kernel (``LinearWithGradAccumulationAndAsync
  Communication.forward``: ``output = output + bias``), the attention context is permuted with
  ``.contiguous()`` (``CoreAttention.forward``), and the MLP output projection (``RowParallelLinear``,
  ``skip_bias_add`` False) adds its bias after the all-reduce;
* backward: autograd sums the two gradients of each residual branch point (2), reduces each bias gradient over
  the tokens (QKV, attention output, MLP in, MLP out: 4), copies the attention context gradient back to its
  strided layout (1), scales the two ``baddbmm`` input gradients by alpha (2), concatenates the Q, K, V
  gradients of ``split_tensor_along_last_dim`` (1), and apex's layer norm backward reduces the weight and bias
  gradients in two more kernels per norm (4);
* embedding: position-embedding lookup, the add, the [b, s] -> [s, b] transpose copy and the embedding dropout
  (4; 6 more for the vocabulary masks with tensor parallelism), and their backward;
* loss: ``vocab_parallel_cross_entropy``'s target masks, gathers and clones (~16 small kernels besides the
  passes over the logits, counted in ``transformer.py``), the loss mask, sum and data-parallel average of
  ``loss_func`` in ``pretrain_gpt.py``, and the loss scaling (~10 more); backward ~10.

``torch``: eager PyTorch modules as model code such as MPT's writes them (torch 2.1 to 2.13, autograd's
derivatives.yaml; MPT's MPTBlock at mosaicml/llm-foundry b2a43a147, 2023-10): ``nn.Linear`` adds its bias in the
GEMM (``addmm``, cuBLASLt's bias epilogue), but autograd reduces each bias gradient over the tokens in a kernel of
its own (the expanded bias's ``sum_to``: QKV, attention output, MLP in, MLP out: 4), and a fused QKV projection
split by ``qkv.chunk(3, dim=2)`` has its three gradients concatenated (``SplitBackward0``: ``cat``, 1). Autograd's
residual-gradient sums come with ``elementwise: eager`` (elementwise.py); ``nn.LayerNorm``'s weight-gradient
reduction is inside the layer-norm backward the GPU files measure (calibration of ``F.layer_norm``).

``model``: only the model's own kernels (fused stacks such as Transformer Engine put bias adds in GEMM
epilogues; and the ideal upper bound).
"""

from __future__ import annotations

from simulator.workload.ops import Op

B = "backward"
KINDS = ("model", "megatron-legacy", "torch")

# the name prefix of Megatron's main_grad accumulation kernels (strategies whose framework runs no such hooks,
# DeepSpeed's BF16_Optimizer, drop them by it)
GRAD_ACCUMULATION = "gradient accumulation"


def grad_accumulation(fw, precision: str, name: str, params: int, tensors: int) -> Op | None:
    """Megatron-LM's local DDP without gradient-accumulation fusion: a hook adds every parameter's gradient
    into its main_grad buffer after each backward (megatron/model/distributed.py, param_hook), one kernel per
    tensor reading the gradient and main_grad and writing main_grad (fp32 for bf16 training). None where the
    framework runs no such hooks."""
    if not fw.grad_accumulation_kernels:
        return None
    main_bytes = 2 if precision == "fp16" else 4
    return Op(
        f"{GRAD_ACCUMULATION} ({name})",
        "memory",
        bytes=params * (2 + 2 * main_bytes),
        direction="backward",
        launches=tensors,
    )


def layer_forward(
    e: int, tokens: int, h: int, qkv_out: int, heads_dim: int, sp: int, bias: bool
) -> tuple[Op | None, Op | None, Op | None]:
    """Extra forward kernels of one layer (per tensor-parallel rank; ``sp`` splits the b x s x h tensors), in
    their places: (after the QKV GEMM, after the attention context, after the MLP output projection)."""
    return (
        _mem("qkv bias add", 2 * e * tokens * qkv_out, bias),
        _mem("attention context copy (permute)", 2 * e * tokens * heads_dim),
        _mem("mlp output bias add", 2 * e * tokens * h / sp, bias),
    )


def layer_backward(
    e: int, tokens: int, h: int, qkv_out: int, heads_dim: int, f_up: int, sp: int, bias: bool
) -> tuple[Op, ...]:
    """Extra backward kernels of one layer."""
    act = e * tokens * h / sp
    ops = [
        _mem("residual gradient sums", 2 * 3 * act, launches=2, direction=B),
        # the bias-gradient reductions and the Q, K, V gradient concatenation, as in any eager layer
        *torch_layer_backward(e, tokens, h, qkv_out, f_up, sp, bias),
        _mem("attention context gradient copy", 2 * e * tokens * heads_dim, direction=B),
        _mem(
            "attention score scaling of Q, K gradients",
            2 * 2 * e * tokens * heads_dim,
            launches=2,
            direction=B,
        ),
        _mem("layernorm weight-gradient reductions", 2 * 2 * act, launches=4, direction=B),
    ]
    return tuple(op for op in ops if op is not None)


def torch_layer_backward(
    e: int, tokens: int, h: int, qkv_out: int, f_up: int, sp: int, bias: bool
) -> tuple[Op, ...]:
    """Extra backward kernels of one eager PyTorch layer (``torch``, module docstring): the bias-gradient
    reductions (each reads its output gradient) and the Q, K, V gradient concatenation (reads and writes the
    three)."""
    ops = [
        _mem("bias gradient reductions", e * tokens * (qkv_out + h / sp + f_up + h / sp), bias, 4, B),
        _mem("Q, K, V gradient concatenation", 2 * e * tokens * qkv_out, direction=B),
    ]
    return tuple(op for op in ops if op is not None)


def embedding_forward(e: int, tokens: int, h: int, sp: int, t: int) -> tuple[Op, ...]:
    act = e * tokens * h / sp
    ops = [
        _mem("position lookup, add, transpose copy, dropout", 7 * act, launches=4),
        _mem("vocabulary masks", 6 * 8 * tokens, t > 1, 6),
    ]
    return tuple(op for op in ops if op is not None)


def embedding_backward(e: int, tokens: int, h: int, sp: int) -> tuple[Op, ...]:
    act = e * tokens * h / sp
    return (_mem("dropout, transpose and position-embedding backward", 6 * act, launches=6, direction=B),)


def loss_forward(tokens: int) -> tuple[Op, ...]:
    return (_mem("loss masks, gathers, scaling", 26 * 8 * tokens, launches=26),)


def loss_backward(tokens: int) -> tuple[Op, ...]:
    return (_mem("loss backward masks and scatter", 10 * 8 * tokens, launches=10, direction=B),)


def _mem(
    name: str, nbytes: float, present: bool = True, launches: int = 1, direction: str = "forward"
) -> Op | None:
    if not present:
        return None
    return Op(name, "memory", bytes=float(nbytes), direction=direction, launches=launches)
