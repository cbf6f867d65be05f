"""NCCL's protocols: which of LL, LL128 and Simple a collective runs on, its latency and its bandwidth.

NCCL times every (algorithm, protocol) pair of a call as ``base + steps x hop + bytes / bandwidth`` and runs the
fastest (src/graph/tuning.cc, ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``, with the constants of NCCL
v2.14-2.17; ``nccl.yaml`` lists how other releases differ). LL (8-byte flag per 8 bytes) has the lowest
latency and a quarter of the bandwidth; LL128 nearly full bandwidth at a higher latency; Simple full bandwidth
and the highest latency. Small messages therefore pay a few microseconds per step, large ones move at the
link's bus bandwidth, and the curve between bends where the protocol changes.

The constants are NCCL's (``nccl.yaml``); a topology may replace the hop latencies and bandwidth factors of a
link kind with values measured there (``nccl:`` in topologies/*.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from simulator.scenario.files import read_shipped_yaml

PROTOCOLS = ("LL", "LL128", "Simple")
_DATA = Path(__file__).with_name("nccl.yaml")


@dataclass(frozen=True)
class ProtocolCost:
    protocol: str
    latency_s: float
    bandwidth_factor: float  # bus bandwidth as a fraction of the Simple protocol's


@cache
def _table() -> dict:
    return read_shipped_yaml(_DATA)


@cache
def defaults(version: str = "2.17") -> dict:
    """NCCL's constants as ``version`` (``release``'s: "2.17" or "2.18") tunes."""
    d = dict(_table())
    return {**d, **d["releases"][version]} if version in d["releases"] else d


RECENT = ("hopper", "blackwell")


def release(version: str | None, architecture: str) -> str:
    """The tuning table a collective runs on: "2.18" from NCCL 2.18 on, "2.17" before; without a version the
    release the GPU's stacks bundle (Hopper and later: PyTorch 2.1+ and NGC containers from 23.x carry 2.18+;
    before: the 2.10-2.17 of the runs validated on them)."""
    if version is None:
        return "2.18" if architecture in RECENT else "2.17"
    return "2.18" if tuple(int(x) for x in version.split(".")[:2]) >= (2, 18) else "2.17"


def tuning_of(cluster) -> dict:
    """The topology's ``nccl`` section with the release resolved (``version``: "2.17" or "2.18")."""
    t = cluster.spec.nccl.model_dump()
    return {**t, "version": release(t.get("version"), cluster.gpu.architecture)}


def protocol_costs(
    algorithm: str,
    intra_steps: int,
    inter_steps: int,
    intra: str,
    overrides: dict | None = None,
    busbw_Bps: float | None = None,
    size_bytes: float | None = None,
    plateau: float = 1.0,
) -> list[ProtocolCost]:
    """Latency and bandwidth factor of each protocol for a collective of ``intra_steps`` steps inside nodes
    (over ``intra``: nvlink | pcie) and ``inter_steps`` steps across the network. ``overrides`` (a topology's
    ``nccl`` section) replaces base and hop latencies and bandwidth factors; ``busbw_Bps``, the Simple protocol's bus
    bandwidth, caps LL at NCCL's ``llMaxBw``; ``size_bytes`` (a tree's buffer) applies NCCL's tree correction by
    size; ``plateau`` multiplies the Simple ring's latency (``ring_plateau``)."""
    o = overrides or {}
    d = defaults(o.get("version") or "2.17")
    out = []
    for p in PROTOCOLS:
        hop_intra = _pick(o, d, "hop_us", algorithm, intra, p)
        hop_inter = _pick(o, d, "hop_us", algorithm, "network", p)
        factor = o.get("bandwidth", {}).get(algorithm, {}).get(p, d["bandwidth"][algorithm][p])
        if p == "LL" and busbw_Bps:
            factor = min(factor, d["ll_max_busbw_GBps"] * 1e9 / busbw_Bps)
        if p == "LL" and inter_steps > 0:
            # tuning.cc v2.10-v2.17: ``if (nNodes > 1 && p == NCCL_PROTO_LL) intraLat *= 1.8;``
            hop_intra *= d["ll_multi_node_intra_factor"]
        if algorithm == "ring" and inter_steps > 0 and "net_overhead_us" in d:
            # v2.18+: "Inter-node rings still have to launch nsteps * net overhead" (x3 on Simple)
            floor = o.get("net_overhead_us") or d["net_overhead_us"]
            hop_intra = max(hop_intra, floor * (3 if p == "Simple" else 1))
        if algorithm == "tree" and size_bytes:
            factor *= tree_correction(p, size_bytes)
        base = o.get("base_us", {}).get(algorithm, {}).get(p, d["base_us"][algorithm][p])
        latency_us = base + intra_steps * hop_intra + inter_steps * hop_inter
        if algorithm == "ring" and p == "Simple":
            latency_us *= plateau
        out.append(ProtocolCost(p, latency_us * 1e-6, factor))
    return out


def tree_correction(protocol: str, size_bytes: float) -> float:
    """NCCL's static correction of a tree's bandwidth for medium sizes (ncclTopoGetAlgoTime, v2.14.3-v2.17.1:
    ``logSize = log2i(nBytes >> 6); if (logSize < 23) bw *= treeCorrectionFactor[protocol][logSize]``)."""
    log_size = (int(size_bytes) >> 6).bit_length() - 1
    table = _table()["tree_correction"][protocol]
    return table[log_size] if 0 <= log_size < len(table) else 1.0


def ring_plateau(
    op: str, ranks: int, nodes: int, size_bytes: float, architecture: str, version: str = "2.17"
) -> float:
    """The factor on a multi-node Simple ring all-reduce's latency (ncclTopoGetAlgoTime, v2.17.1: ``lat *=
    minCompCap < 90 ? 1.9 : 1.5; // Plateau effect of ring`` for ``nBytes >= nRanks/16.0*65536``; v2.18+:
    ``minCompCap < 80 ? 1.9 : 1.4``); 1 otherwise."""
    d = defaults(version)["ring_plateau"]
    if op != "all_reduce" or nodes <= 1 or size_bytes < ranks / 16 * d["min_bytes_per_16_ranks"]:
        return 1.0
    if "ampere_and_later" in d:
        return d["before_ampere"] if architecture in ("volta", "turing") else d["ampere_and_later"]
    return d["hopper"] if architecture in RECENT else d["before_hopper"]


def _pick(o: dict, d: dict, key: str, algorithm: str, kind: str, p: str) -> float:
    return o.get(key, {}).get(algorithm, {}).get(kind, {}).get(p, d[key][algorithm][kind][p])


def fastest(costs: list[ProtocolCost], bandwidth_s: float) -> ProtocolCost:
    """The protocol NCCL picks: the lowest latency + time at its bandwidth (``bandwidth_s`` at Simple's)."""
    return min(costs, key=lambda c: c.latency_s + bandwidth_s / c.bandwidth_factor)
