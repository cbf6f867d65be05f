"""ECMP's hash collisions on a leaf switch's spine uplinks.

With ECMP a switch hashes each flow (its five-tuple; with Enhanced ECMP also the RoCE queue pair) onto one of its
equal-cost uplinks, and all of the flow's packets take that link. Training traffic is a few large, long flows
("low flow entropy"), so two of them often land on one uplink while another idles, and a collective then runs at
its busiest uplink's pace. Meta found plain ECMP performed poorly for training for this reason, and hashing on
the queue pair with more queue pairs per NCCL connection (NCCL_IB_QPS_PER_CONNECTION) improved AllReduce by up
to 40% (Gangidi et al., "RDMA over Ethernet for Distributed AI Training at Meta Scale", SIGCOMM 2024; Meta
engineering blog 2024-08-05). Adaptive routing (InfiniBand) or packet spraying moves packets to the least loaded
uplink, which the simulator's default treats as one pipe of the uplinks' total bandwidth.

``slowdown(f, u)``: f equal flows hashed uniformly onto u uplinks take E[most flows on one uplink] x u / f times
as long as on the u uplinks as one pipe (at least 1: even without a collision, fewer flows than uplinks leave
some idle, since a flow never uses more than one).
"""

from __future__ import annotations

from functools import cache
from itertools import product
from math import log, sqrt

import numpy as np

EXACT = 50_000  # enumerate every assignment up to this many
SAMPLES = 2_000  # else the mean of this many seeded draws
DRAWN = 4_000_000  # ... up to this many flow draws; beyond, the normal approximation of the maximum


@cache
def expected_max(flows: int, links: int) -> float:
    """E[the most flows any one link gets] when ``flows`` flows each pick one of ``links`` links uniformly."""
    if flows <= 0:
        return 0.0
    if links <= 1:
        return float(flows)
    if links**flows <= EXACT:
        total = sum(max(np.bincount(a, minlength=links)) for a in product(range(links), repeat=flows))
        return total / links**flows
    if flows * SAMPLES <= DRAWN:
        rng = np.random.default_rng(flows * 1_000_003 + links)
        draws = rng.integers(0, links, size=(SAMPLES, flows)) + links * np.arange(SAMPLES)[:, None]
        counts = np.bincount(draws.ravel(), minlength=SAMPLES * links).reshape(SAMPLES, links)
        return float(counts.max(axis=1).mean())
    mean = flows / links  # many flows: the maximum of u near-normal counts (Raab and Steger 1998)
    return mean + sqrt(2 * mean * (1 - 1 / links) * log(links))


def slowdown(flows: float, links: int) -> float:
    """How much longer ``flows`` equal flows take on ``links`` ECMP uplinks than on the uplinks as one pipe."""
    f = max(1, round(flows))
    if links <= 1:
        return 1.0
    return max(1.0, expected_max(f, links) * links / f)
