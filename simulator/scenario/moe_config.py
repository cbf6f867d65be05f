"""``model.moe:``: mixture-of-experts MLPs and how their tokens spread (split from model.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from simulator.scenario.section import Section


class ExpertLoadConfig(Section):
    """How routed tokens spread over the experts. Uniform by default (what Megatron's
    ``--moe-router-force-load-balancing`` benchmarks run); ``imbalance`` is a measured ratio of the busiest
    expert's tokens to the mean; ``skew`` draws tokens per expert from a Zipf law of that exponent (experts in a
    random order from ``seed``). The busiest expert-parallel rank sets the pace of every MoE layer."""

    imbalance: float = Field(
        1.0, ge=1, le=1e3, description="Tokens of the busiest expert / the mean (1 = uniform)."
    )
    skew: float | None = Field(None, gt=0, le=8, description="Zipf exponent of tokens per expert.")
    seed: int = Field(0, ge=0, le=2**32, description="Which experts get the most tokens under skew.")


class MoeConfig(Section):
    """Mixture-of-experts MLPs (Megatron-Core ``--num-experts`` ... options; Hugging Face's Mixtral, Qwen-MoE,
    DeepSeek and OLMoE configs map onto these fields)."""

    num_experts: PositiveInt = Field(le=2**14, description="Routed experts per MoE layer.")
    top_k: PositiveInt = Field(2, le=256, description="Routed experts per token.")
    ffn_hidden_size: PositiveInt | None = Field(
        None, le=2**20, description="Width of one routed expert's MLP. Default: model.ffn_hidden_size."
    )
    shared_expert_ffn_hidden_size: int = Field(
        0,
        ge=0,
        le=2**20,
        description="Width of the shared experts together (one MLP every token runs); 0 = none.",
    )
    shared_expert_gate: bool = Field(False, description="A sigmoid gate on the shared expert (Qwen2-MoE).")
    first_dense_layers: int = Field(
        0,
        ge=0,
        le=4096,
        description="Dense layers before the first MoE layer (DeepSeek first_k_dense_replace).",
    )
    layer_freq: PositiveInt = Field(
        1,
        le=4096,
        description="Every n-th layer after the dense ones is MoE, counting from 1 (layer i is MoE when "
        "(i - first_dense_layers + 1) % layer_freq == 0; Qwen2-MoE decoder_sparse_step, Llama 4's interleave step).",
    )
    score_function: Literal["softmax", "sigmoid"] = "softmax"
    num_groups: PositiveInt | None = Field(
        None, description="Group-limited routing: expert groups (DeepSeek n_group)."
    )
    group_topk: PositiveInt | None = Field(None, description="Group-limited routing: groups a token may use.")
    expert_bias: bool = Field(
        False, description="Aux-loss-free balancing: a per-expert bias on the scores (DeepSeek-V3)."
    )
    aux_loss: Literal["none", "aux_loss", "seq_aux_loss"] = Field(
        "aux_loss", description="Load-balancing loss (Megatron moe_router_load_balancing_type)."
    )
    capacity_factor: float | None = Field(
        None,
        gt=0,
        le=64,
        description="Tokens an expert takes at most, x top_k x tokens / experts; none = dropless.",
    )
    pad_to_capacity: bool = Field(
        False,
        description="Every expert gets exactly its capacity (Megatron moe_pad_expert_input_to_capacity).",
    )
    load: ExpertLoadConfig = Field(default_factory=ExpertLoadConfig)

    @model_validator(mode="after")
    def _check(self) -> MoeConfig:
        e, k = self.num_experts, self.top_k
        if k > e:
            raise ValueError(f"model.moe.top_k ({k}) exceeds num_experts ({e})")
        g, gk = self.num_groups, self.group_topk
        if (g is None) != (gk is None):
            raise ValueError("model.moe: group-limited routing needs both num_groups and group_topk")
        if g is not None and e % g:
            raise ValueError(f"model.moe.num_experts ({e}) is not divisible by num_groups ({g})")
        if g is not None and gk > g:
            raise ValueError(f"model.moe.group_topk ({gk}) exceeds num_groups ({g})")
        if g is not None and gk * (e // g) < k:
            raise ValueError(
                f"model.moe: group-limited routing offers group_topk x num_experts / num_groups = {gk} x {e} / {g} = "
                f"{gk * (e // g)} experts to a token, fewer than top_k ({k})"
            )
        if self.load.imbalance > e / k:
            raise ValueError(
                f"model.moe.load.imbalance ({self.load.imbalance:g}) exceeds num_experts / top_k = {e} / {k} = "
                f"{e / k:g}: an expert receives each token at most once, so at most 1 / top_k of the routed copies"
            )
        if self.pad_to_capacity and self.capacity_factor is None:
            raise ValueError(
                "model.moe.pad_to_capacity needs a capacity_factor (dropless routing has no capacity)"
            )
        if self.load.skew is not None and self.load.imbalance != 1.0:
            raise ValueError(
                f"model.moe.load: give either imbalance ({self.load.imbalance}) or skew ({self.load.skew}), not both"
            )
        if self.expert_bias and self.score_function != "sigmoid":
            raise ValueError("model.moe.expert_bias needs score_function: sigmoid (as Megatron-Core)")
        return self
