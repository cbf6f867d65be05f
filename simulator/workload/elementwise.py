"""The layer's elementwise chains as a framework runs them: fused (one kernel per chain) or eager (each PyTorch op
its own kernel, with its own pass over HBM).

* RoPE on the queries and keys. Fused (Megatron-Core ``apply_rotary_pos_emb`` with Transformer Engine's
  ``fused_rope``, core_v0.13.0): one kernel per tensor reads it and writes it, forward and backward. Eager
  (torchtitan ``apply_rotary_emb``, torchtitan/models/llama3/model.py @000204a4): ``xq.float()`` (read 16-bit,
  write fp32), ``view_as_complex(...) * freqs_cis`` (read and write fp32), ``.type_as(xq)`` (read fp32, write
  16-bit): 3 kernels and 2e + 16 bytes per element each way (autograd's backward mirrors them).
* RoPE unfused in Megatron-Core: ``apply_rotary_pos_emb`` leaves Transformer Engine's fused kernel where YaRN's
  attention factor is not 1 (rope_utils.py, Megatron-LM d7288711, "mscale ... is not supported by TE's fused RoPE")
  and runs ``_apply_rotary_pos_emb_bshd`` per tensor: ``t * cos_``, ``-x2``, ``cat((-x2, x1))``, ``* sin_``, the
  sum, ``cat((t, t_pass))``: 6 kernels and 12 bytes per 16-bit element forward (beside 6 small ones making
  ``cos_`` and ``sin_`` from the frequencies); autograd's backward: the two products' gradients, the negation's,
  ``chunk``'s cat, the two paths' sum and the full slice's zero-fill and copy, 7 kernels and 13 bytes.
* SwiGLU's ``silu(w1(x)) * w3(x)`` eager: SiLU (read, write) then multiply (read two, write one), 5 elements
  moved forward against the fused kernel's 3; backward, the multiply's two gradients (6) and SiLU's (3), 9 against 5.
* The residual stream's gradients: autograd adds the two gradients of each branch point (attention and MLP
  input) in kernels of their own (read two, write one); fused stacks' profiles absorb it.

``training.compile`` (torch.compile per block, Inductor's default mode) fuses the chains of an eager framework,
except RoPE in complex numbers: Inductor generates no complex kernels ("Torchinductor does not support code
generation for complex operators", PyTorch 2.11) and runs them as eager kernels. Measured on one H200 (PyTorch
2.11, benchmarks/compile_delta.py, docs/measurements/h200-compile-delta*.json): torch.compile of a Llama block
changes its forward + backward by -13% to +15%, median about 5% faster; torchtitan's complex RoPE costs 0.55 ms of
the Llama 3 8B layer's 21.5 ms at sequence 8,192 in eager mode.
"""

from __future__ import annotations

from simulator.workload.ops import Op
from simulator.workload.shape import LayerShape

B = "backward"
EAGER_ROPE_KERNELS = 3  # per tensor each way: float(), complex multiply, type_as


def styles(fw, training, model) -> tuple[str, str]:
    """(SwiGLU and residual style, RoPE style): 'fused' or 'eager'; a fused stack's RoPE 'unfused' where YaRN's
    attention factor is not 1 (module docstring)."""
    if fw.elementwise == "fused":
        return "fused", "fused" if model.rope_mscale == 1.0 else "unfused"
    return ("fused" if training.compile else "eager"), "eager"


def rope(sh: LayerShape, style: str) -> tuple[Op, Op]:
    """(forward, backward) of RoPE on this rank's queries and keys (every head's full width): ``style`` fused,
    eager (torchtitan's complex multiply) or unfused (Megatron-Core's own, where YaRN's factor is not 1)."""
    elems = sh.tokens * (sh.heads + sh.kv_heads) * sh.d
    if style == "fused":
        fwd, bwd, launches, launches_bwd = 2 * sh.e, 2 * sh.e, 2, 2
    elif style == "unfused":  # per tensor: 6 large + 6 small kernels forward, 7 backward (module docstring)
        fwd, bwd, launches, launches_bwd = 6 * sh.e, 6.5 * sh.e, 2 * 12, 2 * 7
    else:
        fwd = bwd = 2 * sh.e + 16
        launches = launches_bwd = 2 * EAGER_ROPE_KERNELS
    return (
        Op("rope (queries, keys)", "memory", bytes=float(fwd * elems), launches=launches),
        Op("rope backward", "memory", bytes=float(bwd * elems), direction=B, launches=launches_bwd),
    )


def glu_clamp(e: int, rows: int, cols: int) -> tuple[Op, Op]:
    """Megatron-Core's clamp of a gated activation's input (``activation_func_clamp_value``) over ``rows`` x 2
    ``cols``, before the fused kernel (fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl, Megatron-LM
    d7288711): ``chunk``, a clamp of each half (read, write) and ``torch.cat`` of the two (read, write), 4 elements
    of the input moved in 3 kernels; backward, each clamp's masked gradient (read the gradient and the input,
    write) and ``chunk``'s cat of the two gradients, 5 in 3."""
    elems = 2 * rows * cols
    return (
        Op(
            "activation clamp: two clamps and a cat (eager)", "memory", bytes=float(4 * e * elems), launches=3
        ),
        Op(
            "activation clamp backward (eager)", "memory", bytes=float(5 * e * elems), direction=B, launches=3
        ),
    )


def expert_bias(e: int, rows: int, cols: int, experts: int) -> tuple[Op, Op]:
    """Megatron-Core's expert output bias (TEGroupedMLP's fc2 with ``skip_bias_add``, experts.py ``_apply_bias``,
    Megatron-LM d7288711): per local expert ``t + b * p`` (the bias weighted by the routing probability; two
    kernels) then ``torch.cat`` of the experts' rows, over ``rows x cols`` outputs: 6 elements moved forward (write
    b p; read t and b p, write; read, write). Backward: the bias's and the probability's gradients, each a product
    with the output gradient and a sum (3 elements each), and ``split``'s cat of the experts' gradients (2): 8."""
    elems = rows * cols
    return (
        Op(
            "experts fc2 bias (per expert, eager)",
            "memory",
            bytes=float(6 * e * elems),
            launches=2 * experts + 1,
        ),
        Op(
            "experts fc2 bias backward (per expert, eager)",
            "memory",
            bytes=float(8 * e * elems),
            direction=B,
            launches=4 * experts + 1,
        ),
    )


def swiglu_eager(e: int, rows: int, cols: int) -> tuple[Op, Op]:
    """What eager SiLU-then-multiply moves beyond the fused SwiGLU kernel over ``rows x cols`` outputs: 2
    elements more and one more kernel forward, 4 more and two more kernels backward."""
    elems = rows * cols
    return (
        Op("swiglu: separate silu and multiply (eager)", "memory", bytes=float(2 * e * elems)),
        Op(
            "swiglu backward: separate multiply and silu gradients (eager)",
            "memory",
            bytes=float(4 * e * elems),
            direction=B,
            launches=2,
        ),
    )


def residual_gradient_sums(sh: LayerShape) -> Op:
    """Autograd's two sums of the residual stream's gradients per layer (read two, write one)."""
    act = sh.e * sh.tokens * sh.h / sh.sp
    return Op(
        "residual gradient sums (autograd)", "memory", bytes=float(2 * 3 * act), direction=B, launches=2
    )
