"""ZeRO++ (Wang et al. 2023, arXiv 2306.10209) on ZeRO-3: quantized weight all-gathers (qwZ), a secondary weight
shard inside each node for backward's gathers (hpZ), and quantized gradient reduction as two all-to-alls (qgZ).
What each changes in the sharded iteration is a field of :class:`~simulator.strategy.sharded.ShardingPlan`."""

from __future__ import annotations

import math

from simulator.errors import ScenarioError
from simulator.hardware.cluster import Cluster
from simulator.scenario.schema import Scenario
from simulator.strategy.groups import grad_group, model_parallel_size

# Block quantization keeps one fp32 scale per block; blocks of 256 elements are assumed (the paper quantizes per
# block but the size is a tuning knob).
QWZ_BYTES_PER_PARAM = 1 + 4 / 256  # INT8 weights + scales
QGZ_BYTES_PER_PARAM = 0.5 + 4 / 256  # INT4 gradients + scales
DEQUANTIZE_BYTES_PER_PARAM = 3.0  # read 1 byte, write 2 (qwZ, on every gathered weight)
GRAD_QUANTIZE_BYTES_PER_PARAM = 3.5  # read 2 bytes, write 0.5; then read the peers' 0.5 and write 0.5 (qgZ)


def plan_fields(s: Scenario, dp: int, cluster: Cluster) -> dict:
    """ShardingPlan fields for qwZ, hpZ and qgZ."""
    cfg, group = s.parallelism.zero, grad_group(s)
    out: dict = {}
    if cfg.zero_quantized_weights:  # qwZ: forward all-gathers in INT8, dequantized before use
        out.update(
            forward_gather_bytes=QWZ_BYTES_PER_PARAM, forward_extra_bytes_per_param=DEQUANTIZE_BYTES_PER_PARAM
        )
    hpz = cfg.zero_hpz_partition_size
    if hpz > 1:  # hpZ: backward all-gathers from the secondary shard, inside the hpZ group (a node)
        if dp % hpz:
            raise ScenarioError(
                f"parallelism.zero.zero_hpz_partition_size ({hpz}) does not divide the {dp} "
                "data-parallel ranks"
            )
        out["backward_gather_group"] = f"{group}/{hpz}"
    if cfg.zero_quantized_gradients:  # qgZ: INT4 all-to-all among the node's ranks, reduce, then across nodes
        node = cluster.gpus_per_node // model_parallel_size(s)
        intra = math.gcd(max(node, 1), dp)
        out.update(
            quantized_reduce=(f"{group}/{intra}", f"{group}%{intra}", intra, QGZ_BYTES_PER_PARAM),
            backward_extra_bytes_per_param=GRAD_QUANTIZE_BYTES_PER_PARAM,
        )
    return out
