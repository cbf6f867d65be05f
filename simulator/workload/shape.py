"""The sizes one tensor-parallel rank works with for one micro-batch (tokens, heads, widths, bytes per element),
derived once from the scenario, and the memory-bound kernels every block repeats (norms, residual adds)."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.scenario.schema import Scenario
from simulator.workload.ops import Op, memory_op


@dataclass(frozen=True)
class LayerShape:
    """Megatron-LM's notation (Narayanan et al. SC21 Sec. 3.2; Korthikanti et al. 2022 Sec. 4), per rank."""

    b: int  # micro-batch size
    seq: int  # sequence length on this rank (the context-parallel share)
    t: int  # tensor-parallel degree
    sp: int  # t with sequence parallelism (norms and dropouts split by it), else 1
    e: int  # bytes per activation element
    h: int  # hidden size
    d: int  # per-head query / key width
    dv: int  # per-head value width (d, except with multi-head latent attention)
    f: int  # MLP width (whole model)
    f_up: int  # MLP up-projection output width: 2f for SwiGLU's gate and up, else f
    v: int  # vocabulary
    heads: int  # query heads on this rank
    kv_heads: int  # key / value heads on this rank
    norm_kind: str  # layernorm | rmsnorm
    residual_kind: str  # Megatron's fused bias-dropout-add, or a plain residual add without biases
    norm_params: int  # parameters of one norm

    @property
    def tokens(self) -> int:
        return self.b * self.seq

    @property
    def rows(self) -> int:
        """Rows of the b x s x h activations a rank's norms and dropouts work on."""
        return self.tokens // self.sp


def layer_shape(s: Scenario) -> LayerShape:
    m, p, tr = s.model, s.parallelism, s.training
    t = p.tensor_parallel
    f = m.ffn_size
    return LayerShape(
        b=tr.micro_batch_size,
        seq=m.seq_length // p.context_parallel,
        t=t,
        sp=t if p.sequence_parallel else 1,
        e=4 if tr.precision == "fp32" else 2,
        h=m.hidden_size,
        d=m.head_dim,
        dv=m.v_head_dim,
        f=f,
        f_up=2 * f if m.gated else f,
        v=m.vocab_size,
        heads=m.num_attention_heads // t,
        kv_heads=max(m.query_groups // t, 1),
        norm_kind=m.normalization,
        # without biases (and so without dropout in Llama-style models) the fused kernel is a plain residual add
        residual_kind="bias_dropout_add" if m.add_bias_linear else "residual_add",
        norm_params=2 * m.hidden_size if m.normalization == "layernorm" else m.hidden_size,
    )


def norm(sh: LayerShape, name: str) -> Op:
    """A LayerNorm / RMSNorm forward: read x, write y, plus fp32 statistics."""
    return memory_op(
        name, 2 * sh.e * sh.tokens * sh.h / sh.sp + 8 * sh.tokens / sh.sp, sh.norm_kind, sh.rows, sh.h
    )


def norm_backward(sh: LayerShape, name: str) -> Op:
    return memory_op(name, 3 * sh.e * sh.tokens * sh.h / sh.sp, sh.norm_kind, sh.rows, sh.h, "backward")


def residual(sh: LayerShape, name: str) -> Op:
    """Bias-dropout-add: read x and the residual, write y and a 1-byte mask."""
    return memory_op(name, (3 * sh.e + 1) * sh.tokens * sh.h / sh.sp, sh.residual_kind, sh.rows, sh.h)


def residual_backward(sh: LayerShape, name: str) -> Op:
    return memory_op(name, 2 * sh.e * sh.tokens * sh.h / sh.sp, sh.residual_kind, sh.rows, sh.h, "backward")


def activation(m, name: str, e: int, rows: int, cols: int, extra: float = 0.0) -> tuple[Op, Op]:
    """(forward, backward) of an MLP's activation over ``rows x cols`` outputs: a gated one (SwiGLU, GeGLU) reads
    the gate and up halves and writes one (3 elements moved forward, 5 backward), others read one and write one
    (2 / 3); ``extra`` bytes more each way (a routing probability read, its gradient written). GeGLU's kernel moves
    SwiGLU's bytes (Transformer Engine's geglu / swiglu share one gated-activation template, common/activation/
    activation_template.h) and is priced as that kind."""
    gated = m.gated
    kind = "swiglu" if gated else m.activation.replace("-", "_")  # gelu | swiglu | relu | squared_relu
    elems = rows * cols
    fwd = memory_op(name, e * elems * (3 if gated else 2) + extra, kind, rows, cols)
    bwd = memory_op(
        f"{name} backward", e * elems * (5 if gated else 3) + 2 * extra, kind, rows, cols, "backward"
    )
    return fwd, bwd
