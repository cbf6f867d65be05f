"""Interleaved 1F1B (Narayanan et al. SC21 Sec. 2.2; Megatron-LM ``forward_backward_pipelining_with_
interleaving``): each stage holds v model chunks; microbatches go through the chunks in groups of p, so the
bubble shrinks to (p-1)/(v m + p - 1). Needs m to be a multiple of p."""

from simulator.strategy.schedules.step import Step


def schedule(p: int, m: int, v: int, stage: int, extra_warmup: int = 0) -> list[Step]:
    total = m * v

    def microbatch(k: int) -> int:
        return (k // (p * v)) * p + k % p

    def forward(k: int) -> Step:
        return Step("F", microbatch(k), (k // p) % v)

    def backward(k: int) -> Step:
        return Step("B", microbatch(k), v - 1 - (k // p) % v)

    warmup = min((p - stage - 1) * 2 + (v - 1) * p + extra_warmup, total)
    steps = [forward(k) for k in range(warmup)]
    for i in range(total - warmup):
        steps += [forward(warmup + i), backward(i)]
    steps += [backward(k) for k in range(total - warmup, total)]
    return steps
