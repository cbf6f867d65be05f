"""ZB-H1 zero-bubble schedule (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", Sec. 3).

The backward is split into B (input gradient, which the previous stage waits for) and W (weight gradient,
which nobody waits for). As in the paper's handcrafted schedules, the order is found with unit times
T_F = T_B = T_W: every stage, whenever it is free, runs a ready B first (critical path), else a ready F while
fewer than p - stage microbatches hold activations (forward done, W not yet: 1F1B's activation memory, so
peak memory is 1F1B's), else a pending W, so W steps fill what would be bubbles in 1F1B. The result is a static order per stage; the engine runs it with real times.
"""

from functools import cache

from simulator.strategy.schedules.step import Step


def schedule(p: int, m: int, v: int, stage: int) -> list[Step]:
    return list(_orders(p, m)[stage])


@cache
def _orders(p: int, m: int) -> tuple[tuple[Step, ...], ...]:
    done_f = [[None] * m for _ in range(p)]  # finish time of F(stage, mb)
    done_b = [[None] * m for _ in range(p)]
    next_f, next_b, next_w = [0] * p, [0] * p, [0] * p
    orders: list[list[Step]] = [[] for _ in range(p)]
    t = 0
    while any(w < m for w in next_w):
        for st in range(p):
            f, b, w = next_f[st], next_b[st], next_w[st]
            b_ready = b < f and (st == p - 1 or (done_b[st + 1][b] is not None and done_b[st + 1][b] <= t))
            f_ready = f < m and (st == 0 or (done_f[st - 1][f] is not None and done_f[st - 1][f] <= t))
            if b_ready:
                orders[st].append(Step("B", b))
                done_b[st][b] = t + 1
                next_b[st] += 1
            elif f_ready and f - w < p - st:
                orders[st].append(Step("F", f))
                done_f[st][f] = t + 1
                next_f[st] += 1
            elif w < b:
                orders[st].append(Step("W", w))
                next_w[st] += 1
        t += 1
    return tuple(tuple(o) for o in orders)
