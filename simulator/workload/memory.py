"""Per-GPU memory: model states (ZeRO paper) and activations (Korthikanti et al. 2022), in bytes.

Pure functions; each cites its source. Strategies combine them into a :class:`MemoryBreakdown`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from simulator.frameworks import get_framework
from simulator.scenario.schema import Scenario
from simulator.workload.attention import softmax_in_fp32
from simulator.workload.fp8 import saved_input_bytes
from simulator.workload.shape import layer_shape


@dataclass(frozen=True)
class MemoryBreakdown:
    """GPU memory of one rank, plus what offloading puts in its node's host memory and on its NVMe drives."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    capacity: float
    host: float = 0.0  # bytes per node (every rank of the node together)
    host_capacity: float = 0.0
    nvme: float = 0.0  # bytes per node
    # temporaries of the optimizer step, allocated once backward has freed the activations (DeepSpeed's fp32
    # gradient partition): they count only where they exceed the activations
    step: float = 0.0
    # outside what the program allocates (runtime_memory below): the CUDA context, NCCL's buffers, and the
    # caching allocator's reserve beyond its peak allocation as a fraction of it, where the user states one
    context: float = 0.0
    nccl: float = 0.0
    fragmentation: float = 0.0
    # what the caching allocator holds beyond the peak allocation in holes it cannot reuse: the loss's
    # (workload/loss.py head_reserve_bytes, workload/allocator.py); ``fragmentation``, where set, replaces it
    reserve: float = 0.0
    # the static inputs of Megatron-Core's per-layer CUDA graphs (workload/cuda_graphs.py)
    graphs: float = 0.0

    @property
    def step_extra(self) -> float:
        return max(0.0, self.step - self.activations)

    @property
    def peak(self) -> float:
        """The most bytes allocated at once, as ``torch.cuda.max_memory_allocated`` reports it."""
        return (
            self.params
            + self.grads
            + self.optimizer
            + self.activations
            + self.buffers
            + self.graphs
            + self.step_extra
        )

    @property
    def reserved(self) -> float:
        """What PyTorch's caching allocator holds at the peak (``torch.cuda.max_memory_reserved``, torchtitan's
        memory line): the peak allocation and the holes it cannot reuse (``reserve``), or the peak times
        1 + ``fragmentation`` where the user states that."""
        return self.peak * (1.0 + self.fragmentation) if self.fragmentation else self.peak + self.reserve

    @property
    def device(self) -> float:
        """What must fit on the GPU: the peak allocation (times 1 + ``fragmentation`` where the user states one),
        the CUDA context and NCCL's buffers. Not the allocator's holes (``reserve``): before it fails a request
        it releases its cached free memory and retries (CUDACachingAllocator ``release_cached_blocks``, counted
        in ``num_alloc_retries``), as torchtitan's 8B step did on an 80 GB H100 while holding 78 GiB
        (docs/measurements/h100-torchtitan-8b-rank.json)."""
        return self.peak * (1.0 + self.fragmentation) + self.context + self.nccl

    @property
    def oom(self) -> bool:
        return self.device > self.capacity

    @property
    def host_oom(self) -> bool:
        return self.host > self.host_capacity > 0

    def gib(self) -> dict[str, float]:
        out = {k: v / 2**30 for k, v in asdict(self).items()}
        out["step_extra"] = self.step_extra / 2**30
        out["peak"] = self.peak / 2**30
        out["reserved"] = self.reserved / 2**30
        out["fragmentation"] = self.fragmentation  # a fraction, not GiB
        out["device"] = self.device / 2**30
        return out


# NCCL's buffers (NVIDIA/nccl src/init.cc DEFAULT_*BUFFSIZE and src/include/device.h, unchanged from 2.12 to 2.2x):
# every connection of every channel holds one FIFO per protocol, NCCL_STEPS = 8 slots each.
NCCL_LL_BYTES = 8 * 512 * 8 * 16  # LL_LINES_PER_THREAD x LL_MAX_NTHREADS x STEPS x sizeof(ncclLLFifoLine)
NCCL_LL128_BYTES = 120 * 640 * 8 * 8  # LL128_ELEMS_PER_THREAD x LL128_MAX_NTHREADS x STEPS x sizeof(uint64_t)
NCCL_SIMPLE_BYTES = 1 << 22  # DEFAULT_BUFFSIZE (NCCL_BUFFSIZE), 4 MiB
NCCL_CONNECTION_BYTES = NCCL_LL_BYTES + NCCL_LL128_BYTES + NCCL_SIMPLE_BYTES  # 9,633,792 B = 9.19 MiB


def nccl_buffer_bytes(communicators: int, channels: int) -> float:
    """GPU memory NCCL allocates outside PyTorch's allocator: per communicator, ``channels`` rings each with one
    receive connection's three protocol FIFOs (NCCL_CONNECTION_BYTES). More communicators or channels, more
    memory, linearly (NVIDIA/nccl issues #864 and #986, the maintainers: "memory usage is linearly tied to the
    number of channels"; a ring "only has 2 connections regardless of the scale")."""
    return communicators * channels * NCCL_CONNECTION_BYTES


MOMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def state_bytes_per_param(precision: str, optimizer: str, moments: str = "fp32") -> tuple[int, int, int]:
    """(weight, gradient, optimizer-state) bytes per parameter.

    Mixed precision with Adam: 2 + 2 + K, K = 12 (fp32 master weights, momentum, variance), ZeRO paper
    (Rajbhandari et al. SC20) Sec. 3.1. fp32 training keeps no master copy: 4 + 4 + 8. SGD with momentum
    keeps K = 4 + 4 (mixed) or 4 (fp32). ``moments``: the dtype Adam keeps its two moments in (Megatron-LM
    --use-precision-aware-optimizer with --exp-avg-dtype / --exp-avg-sq-dtype, Transformer Engine's FusedAdam;
    DeepSeek-V3 keeps them in bf16): K = 4 + 2 x 2 with bf16.
    """
    adam = optimizer != "sgd"  # Adam, AdamW and the 1-bit variants keep momentum and variance
    m = MOMENT_BYTES[moments]
    if precision == "fp32":
        return 4, 4, 2 * m if adam else 4
    return 2, 2, 4 + 2 * m if adam else 8


def zero_model_state_bytes(
    psi: float, n: int, stage: int, k: int = 12, w: int = 2, g: int = 2
) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes per GPU for ZeRO stage 0..3 over ``n`` data-parallel ranks.

    DDP (2 + 2 + K) Psi; ZeRO-1 2Psi + 2Psi + K Psi/N; ZeRO-2 2Psi + (2 + K) Psi/N; ZeRO-3 (2 + 2 + K) Psi/N
    (Rajbhandari et al. SC20, Fig. 1 and Sec. 5).
    """
    return (
        w * psi / (n if stage >= 3 else 1),
        g * psi / (n if stage >= 2 else 1),
        k * psi / (n if stage >= 1 else 1),
    )


def activation_bytes_per_layer(
    s: Scenario, recompute: str | None = None, moe: bool = False, kind: str = "layer"
) -> float:
    """Activations one transformer layer stores for one microbatch on one GPU (``moe``: a mixture-of-experts
    layer: attention as in a dense layer, then the MoE MLP's tensors, ``moe_mlp_activation_bytes``). ``kind``: a
    hybrid stack's layer of its own (``model.hybrid_pattern``): "attention" or "mlp" keep their half of the
    layer's tensors (its linear input, residual dropout mask and norm input, and their own); "moe" the MoE MLP's;
    "mamba" the mixer's (``mamba.mamba_activation_bytes``) beside the same three.

    Korthikanti et al. 2022 Sec. 4 (16-bit activations, 1-byte dropout masks), generalised to grouped-query
    attention, heads of their own width, gated MLPs, FlashAttention and multi-head latent attention. For a
    standard GPT layer it reduces exactly to:
      no parallelism            s b h (34 + 5 a s / h)
      tensor parallel           s b h (10 + 24/t + 5 a s / (h t))
      tensor + sequence par.    s b h / t (34 + 5 a s / h)
      + selective recompute     34 s b h / t   (attention scores, softmax and dropout are recomputed)
      full recompute            2 s b h        (only the layer input; / t with sequence parallelism)
    Where Megatron's softmax runs in fp32 torch ops (``attention.softmax_in_fp32``) its output takes 4
    bytes, so 5 a s / h becomes 7 a s / h.
    """
    m, p, tr = s.model, s.parallelism, s.training
    sq, b, h, a = (
        m.seq_length // p.context_parallel,
        s.training.micro_batch_size,
        m.hidden_size,
        m.num_attention_heads,
    )
    t = p.tensor_parallel
    sp = t if p.sequence_parallel else 1
    sbh = sq * b * h
    # a layer's policy (workload/recompute.py), or the training's: per-op for torchtitan's selective-op;
    # selective-layer's layers are each full or none (chunk_activation_bytes asks per layer)
    mode = recompute or {"selective-op": "op", "selective-layer": "none"}.get(
        tr.activation_recompute, tr.activation_recompute
    )
    if mode == "full":
        return 0.0 if tr.cpu_checkpointing else checkpoint_bytes_per_layer(s)
    if mode == "op":
        return op_policy_bytes(s, moe)
    modules = set(tr.recompute.modules) if mode == "selective" else set()  # Megatron's --recompute-modules
    q = a * m.head_dim / h  # query width relative to h (1 unless heads have a width of their own)
    kv = m.query_groups * m.head_dim / h  # K and V width relative to h (1 without GQA)
    v = m.query_groups * m.v_head_dim / h
    out = a * m.v_head_dim / h  # the attention output, the projection's input
    f_up = (2 if m.gated else 1) * m.ffn_size / h
    f = m.ffn_size / h
    lin = linear_input_bytes(s)  # what a linear layer keeps of its input: 2, or 1 in FP8 (Transformer Engine)
    # QKV input, attention dropout mask, MLP input, MLP dropout mask, 2 norms; torch's tensor parallelism keeps
    # the two linear inputs whole (gathered), Megatron's sharded like the rest
    gathered = sbh * 2 * lin if sp > 1 and get_framework(s.framework).tensor_parallel == "dtensor" else 0.0
    replicated = sbh * (lin + 1 + lin + 1 + 4) - gathered
    # MLP up out, act out (the down projection's input; MoE: its own; recomputed mlp: only its input)
    act_in = 1 if tr.activation_fp8_input_store else 2  # SwiGLU's input kept in FP8 (Megatron-Core's option)
    mlp = 0.0 if moe or "mlp" in modules else act_in * f_up + lin * f
    # Q, K, V (not kept where multi-head latent attention's up-projections are recomputed: mla_up_proj), the
    # projection input, MLP
    qkv = 0.0 if "mla_up_proj" in modules and m.mla is not None else 2 * q + 2 * kv + 2 * v
    attn = sbh * (qkv + lin * out)
    if m.attention == "standard" and "core_attn" not in modules:
        # softmax output (fp32 where Megatron's fused kernel does not take the shape: attention.softmax_in_fp32),
        # dropout mask, dropout output
        fp32 = softmax_in_fp32(get_framework(s.framework).kernels, layer_shape(s))
        attn += (7 if fp32 else 5) * a * sq * sq * b
    if m.attention == "flash":
        attn += 2 * sbh * out + 4 * sq * b * a  # attention output kept by the kernel + fp32 log-sum-exp
    if kind != "layer":  # half the replicated tensors: the linear input, the residual's mask, the norm input
        half = sbh * (lin + 1 + 2) / sp
        if kind == "mamba":
            from simulator.workload.mamba import mamba_activation_bytes

            return half + sq * b * mamba_activation_bytes(s)
        if kind == "attention":
            return half + attn / t
        if kind == "mlp":
            return half + sbh * mlp / t
        return half + _moe_mlp_bytes(s, modules, lin * sbh / sp)
    total = replicated / sp + gathered + (attn + sbh * mlp) / t
    if m.mla is not None:
        # the latents of the replicated down-projections, every token on every TP rank (0.14): the down outputs
        # (norm inputs) and the norm outputs (up-projection inputs), 16-bit
        c = m.mla
        q_rank = c.q_lora_rank or 0
        total += 2 * sq * b * (2 * q_rank + 2 * c.kv_lora_rank + c.qk_rope_head_dim)
    if moe:
        total += _moe_mlp_bytes(s, modules, lin * sbh / sp)
    return total


def _moe_mlp_bytes(s: Scenario, modules: set, norm_out: float) -> float:
    """An MoE MLP's tensors under Megatron's recompute ``modules`` (a recomputed MoE MLP keeps only its input);
    ``norm_out``: the pre-MLP norm's output, the router's and dispatcher's input, re-run with layernorm."""
    if "moe" in modules:
        return 0.0
    kept = moe_mlp_activation_bytes(
        s, recompute_act="moe_act" in modules, recompute_shared="shared_experts" in modules
    )
    return kept - (norm_out if "layernorm" in modules else 0.0)


def torchtitan_matmuls(s: Scenario, moe: bool = False) -> tuple[tuple[str, float], ...]:
    """The matmuls (``aten.mm``) of one torchtitan block's forward in the order they run, each with its output's
    width on one tensor-parallel rank (elements per token): torchtitan's Llama (models/llama3/model/model.py,
    9dec370 to v0.2.2) runs ``self.wq(x), self.wk(x), self.wv(x)``, then ``wo``, then
    ``self.w2(F.silu(self.w1(x)) * self.w3(x))``; DeepSeek-V3's attention its low-rank pairs (wq_a, wq_b;
    wkv_a, wkv_b; the down-projections replicated). A row-parallel layer's output (wo, w2) is the whole width of
    partial sums. An MoE block's router is left out (v0.2.2 forces its recompute without counting it,
    ``per_op_sac_force_recompute_mm_shapes_by_fqns``), so are its grouped expert GEMMs (not ``aten.mm``); its
    shared expert runs like the dense MLP."""
    m, t = s.model, s.parallelism.tensor_parallel
    h, a, g = m.hidden_size, m.num_attention_heads, m.query_groups
    if m.mla is None:
        mms = [("wq", a * m.head_dim / t), ("wk", g * m.head_dim / t), ("wv", g * m.v_head_dim / t)]
    else:
        c = m.mla
        q = (
            [("wq_a", c.q_lora_rank), ("wq_b", a * m.head_dim / t)]
            if c.q_lora_rank
            else [("wq", a * m.head_dim / t)]
        )
        kv_up = a * (c.qk_nope_head_dim + m.v_head_dim) / t
        mms = [*q, ("wkv_a", c.kv_lora_rank + c.qk_rope_head_dim), ("wkv_b", kv_up)]
    mms.append(("wo", h))
    f = (m.moe.shared_expert_ffn_hidden_size or 0) if moe else m.ffn_size
    if f:
        gate = [("w1", f / t)] if m.gated else []
        mms += [*gate, ("w3" if gate else "w1", f / t), ("w2", h)]
    return tuple(mms)


def op_policy_bytes(s: Scenario, moe: bool = False) -> float:
    """What torchtitan's per-op selective checkpointing keeps of one layer (workload/recompute.py): the layer
    input, the outputs of every other matmul (the 1st, 3rd...: ``mm_count % 2`` of torchtitan_matmuls: wq, wv,
    w1, w2 of a Llama block), of attention (its output and fp32 log-sum-exp) and of the sequence-parallel
    reduce-scatters, 16-bit. An MoE layer (torchtitan v0.2.2 llama4 / deepseek_v3 ``_op_sac_save_list``): its
    shared expert's matmuls continue the count (w1 and w2 kept), the routed experts' ``torch._grouped_mm`` are
    not on the list (re-run), and the expert-parallel all-to-alls are: the tokens this rank's experts receive and
    the expert outputs sent back to its tokens are kept."""
    m, p = s.model, s.parallelism
    sq, b, h, t = (
        m.seq_length // p.context_parallel,
        s.training.micro_batch_size,
        m.hidden_size,
        p.tensor_parallel,
    )
    sp = t if p.sequence_parallel else 1
    tokens = sq * b
    heads = m.num_attention_heads / t
    mms = torchtitan_matmuls(s, moe)
    saved = sum(width for i, (_, width) in enumerate(mms) if i % 2 == 0)
    kept = 2 * tokens * h / sp + 2 * tokens * saved + tokens * heads * (2 * m.v_head_dim + 4)
    if sp > 1:  # the reduce-scatters after wo and w2 (on the save list)
        kept += 2 * (2 * tokens * h / sp)
    if moe and p.expert_parallel > 1:
        from simulator.workload.expert_load import expert_load

        routed = tokens // sp  # the rank's tokens at the MoE input
        received = expert_load(m.moe, routed, p.expert_parallel, p.etp).total_rows
        kept += 2 * h * (received + routed * m.moe.top_k)  # the dispatch's and the combine's outputs
    return kept


def moe_mlp_activation_bytes(
    s: Scenario, recompute_act: bool = False, recompute_shared: bool = False
) -> float:
    """What an MoE MLP keeps for backward on the busiest expert-parallel rank (Megatron-Core core_v0.13.0, what
    the router, ``moe_utils.permute`` and the experts save): the router's fp32 logits and probabilities with the
    routing map, the permutation's row map, and for each of the ``N`` rows the experts compute, the fc1 input
    (the gathered tokens), fc1's output, the activation's output and the routing probability; the shared
    expert's like a dense MLP's. ``recompute_act``: Megatron's moe_act recompute keeps fc1's output and re-runs the
    activation, so its output (fc2's input) is not kept."""
    from simulator.workload.expert_load import expert_load

    m, p = s.model, s.parallelism
    moe = m.moe
    t = p.tensor_parallel
    sp = t if p.sequence_parallel else 1
    e = 4 if s.training.precision == "fp32" else 2
    tokens = s.training.micro_batch_size * (m.seq_length // p.context_parallel)
    T = tokens // sp  # the rank's tokens at the MoE input
    n = expert_load(moe, T, p.expert_parallel, p.etp).total_rows
    f = m.expert_ffn_size // p.etp
    f_up = (2 if m.gated else 1) * f
    experts = moe.num_experts
    router = T * experts * (4 + 4 + 1) + T * experts * 4  # logits, probabilities, map; the row map (int32)
    lin = linear_input_bytes(s)
    act_in = 1 if s.training.activation_fp8_input_store else e  # SwiGLU's input in FP8 (fused_bias_swiglu.py)
    routed = n * (lin * m.hidden_size + act_in * f_up + (0 if recompute_act else lin * f) + 4)
    shared = 0.0
    if moe.shared_expert_ffn_hidden_size and not recompute_shared:
        fs = moe.shared_expert_ffn_hidden_size
        fs_up = (2 if m.gated else 1) * fs
        shared = tokens * (act_in * fs_up + e * fs) / t
    einsums = 0.0
    if p.moe.dispatcher == "deepspeed":  # sharded_moe.py: the einsums keep their operands for backward
        from simulator.workload.expert_load import capacity

        slots = experts * capacity(moe, T)
        # the [S, E, C] dispatch mask (input type) and fp32 combine weights, the [E, C, M] expert output
        einsums = T * slots * (e + 4) + slots * m.hidden_size * e
    return router + routed + shared + einsums


def linear_input_bytes(s: Scenario) -> float:
    """Bytes per element a linear layer keeps of its input for the weight gradient: 2 (the 16-bit activations
    Korthikanti et al. count), or in FP8 training with Transformer Engine the quantized column-wise copy
    (workload/fp8.py)."""
    tr = s.training
    if tr.precision != "fp8":
        return 2
    return saved_input_bytes(tr.fp8.recipe, tr.fp8.library)


def checkpoint_bytes_per_layer(s: Scenario) -> float:
    """The layer input full recompute keeps, 2 s b h bytes (16-bit), split over the tensor-parallel ranks by
    sequence parallelism or by DeepSpeed's ``partition_activations`` (Korthikanti Sec. 5; DeepSpeed
    activation checkpointing docs)."""
    m, p, tr = s.model, s.parallelism, s.training
    sbh = m.seq_length // p.context_parallel * tr.micro_batch_size * m.hidden_size
    t = p.tensor_parallel
    return 2 * sbh / (t if p.sequence_parallel or tr.partition_activations else 1)
