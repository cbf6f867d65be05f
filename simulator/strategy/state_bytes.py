"""Bytes per parameter of each model state as a strategy moves and keeps it: the 16-bit (or fp32) weight and the
gradient, which some frameworks keep and reduce in fp32."""

from __future__ import annotations

from simulator.scenario.schema import Scenario
from simulator.workload.memory import state_bytes_per_param


def weight_bytes(s: Scenario) -> int:
    return state_bytes_per_param(s.training.precision, s.training.optimizer, s.training.optimizer_moments)[0]


def grad_bytes(s: Scenario, framework=None) -> int:
    """Bytes per gradient element, in memory and on the wire: the training precision (PyTorch DDP and FSDP,
    DeepSpeed ZeRO), except bf16 where Megatron runs the reduction with fp32 main gradients
    (``parallelism.ddp.grad_reduce_in_fp32``, else ``framework.bf16_main_grads``; megatron/arguments.py:
    "bfloat16 requires gradient accumulation and all-reduce to be done in fp32"). ``framework``: the run's
    profile, which decides; without it, the precision. DeepSpeed's BF16_Optimizer is the pipeline engine's
    (``reduction.bf16_optimizer``)."""
    g = state_bytes_per_param(s.training.precision, s.training.optimizer, s.training.optimizer_moments)[1]
    if framework is None or s.training.dtype != "bf16":
        return g
    par = s.parallelism
    deepspeed = par.pipeline_schedule == "deepspeed" or par.zero_stage >= 2
    if par.fsdp is not None or deepspeed or (par.zero_stage == 1 and framework.zero == "deepspeed"):
        return g
    fp32 = par.ddp.grad_reduce_in_fp32
    if fp32 is None:
        fp32 = framework.bf16_main_grads == "fp32"
    return 4 if fp32 else g


def fsdp_reduce_bytes(s: Scenario, framework=None) -> int:
    """Bytes per gradient element FSDP2 reduce-scatters, and keeps when it accumulates unsharded gradients
    without reducing (under pipelining): 4 where it reduces in fp32 (``parallelism.fsdp.reduce_in_fp32``, else
    ``framework.fsdp_reduce_in_fp32``: torchtitan's mixed_precision_reduce), else the gradient's own (PyTorch
    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py ``foreach_reduce``: the reduce-scatter input is
    allocated in reduce_dtype and the unsharded gradients cast into it; _fsdp_param.py
    ``to_accumulated_grad_if_needed``: ``unsharded_accumulated_grad = grad.to(reduce_dtype)``). The sharded
    gradient the optimizer steps on is fp32 either way, as the sharded fp32 parameter it belongs to (counted in
    the ZeRO formulas' 2 + 2 + K)."""
    g = grad_bytes(s)
    cfg = s.parallelism.fsdp
    fp32 = None if cfg is None else cfg.reduce_in_fp32
    if fp32 is None:
        fp32 = framework is not None and framework.fsdp_reduce_in_fp32
    return 4 if fp32 else g


def gather_bytes(s: Scenario, w, experts: bool = False) -> float:
    """Bytes per parameter a parameter all-gather moves: the weight's, except with FP8 parameter gathering
    (``training.fp8.param_gather``), where the FP8 layers' weights travel quantized (``Fp8Plan.gather_bytes``)
    beside the others' 16 bits; ``experts``: of the routed experts."""
    wb = weight_bytes(s)
    plan = w.fp8
    if plan is None or not plan.param_gather:
        return wb
    dense, routed = w.fp8_params_per_rank
    if experts:
        return plan.gather_bytes if routed else wb
    total = w.params_per_rank
    return (dense * plan.gather_bytes + (total - dense) * wb) / total if total else wb


def fp8_weight_copy_bytes(s: Scenario, w, params: float) -> float:
    """Bytes of the quantized weights Transformer Engine keeps beside ``params`` FP8-layer parameters
    (``Fp8Plan.weight_copy_bytes``); none where FSDP or ZeRO-3 gathers the weights each time (TE does not cache
    under FSDP2: linear.py ``cache_name = None if ... self.is_fsdp2``)."""
    plan, par = w.fp8, s.parallelism
    if plan is None or par.fsdp is not None or par.zero_stage >= 3:
        return 0.0
    return params * plan.weight_copy_bytes
