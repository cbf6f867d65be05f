import copy

import pytest

from simulator.hardware.cluster import Cluster
from simulator.hardware.topology import cluster_spec
from simulator.scenario.loader import load_scenario

GPT_SMALL = {
    "num_layers": 4,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "seq_length": 1024,
    "vocab_size": 32000,
}


def make(model=None, cluster=None, training=None, parallelism=None, name="test"):
    """A validated scenario from small dicts, with test defaults."""
    data = {
        "name": name,
        "model": copy.deepcopy(model or GPT_SMALL),
        "cluster": {"topology": "dgx-a100", "num_nodes": 1, **(cluster or {})},
        "training": {"global_batch_size": 8, "micro_batch_size": 1, "precision": "bf16", **(training or {})},
        "parallelism": parallelism or {},
    }
    return load_scenario(data)


def ideal_network_cluster(scenario) -> Cluster:
    """The scenario's cluster with every link infinitely fast and without latency."""
    spec = cluster_spec(scenario)
    node = spec.node.model_copy(
        update={
            "nvlink_bandwidth_GBps": 1e30,
            "pcie_bandwidth_GBps": 1e30,
            "nic_bandwidth_gbps": 1e30,
            "nvlink_latency_us": 0.0,
            "pcie_latency_us": 0.0,
            "nic_latency_us": 0.0,
        }
    )
    fabric = spec.fabric.model_copy(update={"switch_latency_us": 0.0})
    spec = spec.model_copy(update={"node": node, "fabric": fabric, "collective_step_latency_us": 0.0})
    return Cluster(spec, scenario.cluster.num_nodes)


@pytest.fixture
def scenario_factory():
    return make
