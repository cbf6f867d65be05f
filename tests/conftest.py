import copy
import os
import tempfile

import pytest

from simulator.hardware.cluster import Cluster
from simulator.hardware.topology import cluster_spec, ideal_network
from simulator.scenario.loader import load_scenario

# what the tests work out once (parsed tables, routes inside a node: paths.cache_root) goes to a directory of
# their own, not the user's cache; processes the tests start inherit it
os.environ.setdefault("CLUSTERSIM_CACHE", tempfile.mkdtemp(prefix="clustersim-test-cache-"))

GPT_SMALL = {
    "num_layers": 4,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "seq_length": 1024,
    "vocab_size": 32000,
}

# a two-layer mixture-of-experts model (8 experts, top-2)
SMALL_MOE = {
    "num_layers": 2,
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "ffn_hidden_size": 2816,
    "seq_length": 2048,
    "vocab_size": 32000,
    "activation": "swiglu",
    "normalization": "rmsnorm",
    "position_embedding": "rope",
    "add_bias_linear": False,
    "tied_embeddings": False,
    "moe": {"num_experts": 8, "top_k": 2},
}

# a two-layer model on one DGX A100 that simulates in milliseconds: CLI, sweep and hostile-input tests
TINY = {
    "model": {
        "num_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "seq_length": 256,
        "vocab_size": 1024,
    },
    "cluster": {"topology": "dgx-a100", "num_nodes": 1},
    "training": {"global_batch_size": 16, "micro_batch_size": 2},
    "parallelism": {"data_parallel": 8},
}


def make(model=None, cluster=None, training=None, parallelism=None, name="test", framework="ideal"):
    """A validated scenario from small dicts, with test defaults: the ideal framework (no host cost, no
    framework kernels), so that closed forms hold exactly."""
    data = {
        "name": name,
        "framework": framework,
        "model": copy.deepcopy(model or GPT_SMALL),
        "cluster": {"topology": "dgx-a100", "num_nodes": 1, **(cluster or {})},
        "training": {"global_batch_size": 8, "micro_batch_size": 1, "precision": "bf16", **(training or {})},
        "parallelism": parallelism or {},
    }
    return load_scenario(data)


def ideal_network_cluster(scenario) -> Cluster:
    """The scenario's cluster with every link infinitely fast and without latency."""
    return Cluster(ideal_network(cluster_spec(scenario)), scenario.cluster.num_nodes)


@pytest.fixture
def scenario_factory():
    return make


def reference_loads(cm, hops) -> dict:
    """The definition ``LinkLoads.loads`` (costs/traffic.py) computes per route piece with numpy: every hop adds its share to
    every link of ``cluster.route``; a class's value is its busiest link's units over that link's bandwidth."""
    cl, load, out = cm.cluster, {}, {}
    if isinstance(hops, tuple):  # all_pairs: three arrays
        hops = list(zip(*(x.tolist() for x in hops), strict=True))
    for a, b, share in hops:
        for link in cl.route(a, b)[0]:
            load[link] = load.get(link, 0.0) + share
    for link, units in load.items():
        node, u, v = link
        c = (cm.stages_of(link), *cl.link_class(link))
        out[c] = max(out.get(c, 0.0), units / cl.link_info(link).bandwidth_Bps)
    return out
