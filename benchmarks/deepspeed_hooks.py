"""Measure the host cost of DeepSpeed ZeRO-3's per-module hooks: ``zero3_module_forward_s``,
``zero3_module_backward_s`` and ``zero3_tensor_step_s`` in the framework profiles (simulator/frameworks/*.yaml).

A GPT-shaped model split into Megatron's modules (per layer: the layer, two LayerNorms, the attention with
query_key_value and dense, the MLP with dense_h_to_4h and dense_4h_to_h), so small (hidden 64, 64 tokens) that
every kernel is shorter than its launch: an iteration's time is host time. ZeRO-2 and ZeRO-3 run the same model
on one GPU; ZeRO-3's extra forward, backward and step time, taken between 8 and 32 layers, divided by the extra
module invocations (and parameter tensors for the step), is the per-module cost. A third run makes every
parameter persistent (the hooks run, nothing is fetched).

    L=8 python benchmarks/deepspeed_hooks.py; L=32 python benchmarks/deepspeed_hooks.py   (OUT=dir for JSON)

Needs a CUDA GPU, PyTorch and DeepSpeed (pip install deepspeed; DS_BUILD_OPS=0 is enough). Measured on one H100
host with DeepSpeed 0.16.4 and PyTorch 2.11: docs/measurements/deepspeed-hooks-h100-L*.json, docs/deepspeed.md.
"""

import json
import os
import time


def main() -> None:
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533"), ("RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("LOCAL_RANK", "0")
    import deepspeed
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    deepspeed.init_distributed(dist_backend="nccl")
    h, vocab, seq, layers = int(os.environ.get("H", 64)), 512, 64, int(os.environ.get("L", 16))

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.query_key_value, self.dense = nn.Linear(h, 3 * h), nn.Linear(h, h)

        def forward(self, x):
            q, k, v = self.query_key_value(x).chunk(3, dim=-1)
            b, t, _ = q.shape
            q, k, v = (y.view(b, t, 4, h // 4).transpose(1, 2) for y in (q, k, v))
            return self.dense(
                F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, h)
            )

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense_h_to_4h, self.dense_4h_to_h = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x):
            return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.self_attention = nn.LayerNorm(h), Attention()
            self.post_attention_layernorm, self.mlp = nn.LayerNorm(h), MLP()

        def forward(self, x):
            x = x + self.self_attention(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.word_embeddings, self.position_embeddings = nn.Embedding(vocab, h), nn.Embedding(seq, h)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.final_layernorm, self.output_layer = nn.LayerNorm(h), nn.Linear(h, vocab, bias=False)

        def forward(self, ids):
            x = self.word_embeddings(ids) + self.position_embeddings(torch.arange(seq, device=ids.device))
            for layer in self.layers:
                x = layer(x)
            return F.cross_entropy(
                self.output_layer(self.final_layernorm(x)).float().view(-1, vocab), ids.view(-1)
            )

    def invocations(model) -> int:
        count = [0]
        hooks = [
            m.register_forward_pre_hook(lambda *a: count.__setitem__(0, count[0] + 1))
            for m in model.modules()
        ]
        with torch.no_grad():
            model(torch.randint(0, vocab, (1, seq), device="cuda"))
        for hook in hooks:
            hook.remove()
        return count[0]

    def run(stage: int, persist: float | None, iters: int = 60) -> dict:
        cfg = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "bf16": {"enabled": True},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
            "zero_optimization": {"stage": stage},
        }
        if persist is not None:
            cfg["zero_optimization"]["stage3_param_persistence_threshold"] = persist
        if stage == 3:
            with deepspeed.zero.Init(config_dict_or_path=cfg):
                model = GPT()
        else:
            model = GPT()
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=torch.optim.AdamW(model.parameters()), config=cfg
        )
        ids = torch.randint(0, vocab, (1, seq), device="cuda")
        parts: dict[str, list[float]] = {"forward": [], "backward": [], "step": []}
        for i in range(iters):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = engine(ids)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            engine.backward(loss)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            engine.step()
            torch.cuda.synchronize()
            t3 = time.perf_counter()
            if i >= 10:
                parts["forward"].append(t1 - t0)
                parts["backward"].append(t2 - t1)
                parts["step"].append(t3 - t2)
        return {
            "stage": stage,
            "persist": persist,
            "median_s": {k: sorted(v)[len(v) // 2] for k, v in parts.items()},
            "module_invocations_forward": invocations(engine.module),
            "parameters": sum(1 for _ in engine.module.parameters()),
        }

    out = {
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "gpu": torch.cuda.get_device_name(),
        "H": h,
        "L": layers,
        "runs": [],
    }
    for stage, persist in ((2, None), (3, None), (3, 1e9), (2, None), (3, None), (3, 1e9)):
        out["runs"].append(run(stage, persist))
        print(out["runs"][-1], flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), f"zero3_hooks_H{h}_L{layers}.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
