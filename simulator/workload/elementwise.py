"""The layer's elementwise chains as a framework runs them: fused (one kernel per chain) or eager (each PyTorch op
its own kernel, with its own pass over HBM).

* RoPE on the queries and keys. Fused (Megatron-Core ``apply_rotary_pos_emb`` with Transformer Engine's
  ``fused_rope``, core_v0.13.0): one kernel per tensor reads it and writes it, forward and backward. Eager
  (torchtitan ``apply_rotary_emb``, torchtitan/models/llama3/model.py @000204a4): ``xq.float()`` (read 16-bit,
  write fp32), ``view_as_complex(...) * freqs_cis`` (read and write fp32), ``.type_as(xq)`` (read fp32, write
  16-bit): 3 kernels and 2e + 16 bytes per element each way (autograd's backward mirrors them).
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


def styles(fw, training) -> tuple[str, str]:
    """(SwiGLU and residual style, RoPE style): 'fused' or 'eager' (module docstring)."""
    if fw.elementwise == "fused":
        return "fused", "fused"
    return ("fused" if training.compile else "eager"), "eager"


def rope(sh: LayerShape, style: str) -> tuple[Op, Op]:
    """(forward, backward) of RoPE on this rank's queries and keys (every head's full width)."""
    elems = sh.tokens * (sh.heads + sh.kv_heads) * sh.d
    if style == "fused":
        per_elem, launches = 2 * sh.e, 2
    else:
        per_elem, launches = 2 * sh.e + 16, 2 * EAGER_ROPE_KERNELS
    nbytes = float(per_elem * elems)
    return (
        Op("rope (queries, keys)", "memory", bytes=nbytes, launches=launches),
        Op("rope backward", "memory", bytes=nbytes, direction=B, launches=launches),
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
