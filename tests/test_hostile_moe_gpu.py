"""Generated hostile inputs for the surfaces issue 63 names beyond those of test_hostile.py and
test_hostile_surfaces.py: mixture-of-experts fields (the model's moe section and the expert-parallel layout), GPU
files (derived from a shipped one with ``base:``, and whole copies), and topology link efficiencies. The contract
is test_hostile.py's: exit 0, 2 (one ``error:`` line, nothing written) or 3, never a traceback or a hang.

Default run: 25 examples per generator; ``pytest -m slow``: 1,000 each."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from conftest import TINY
from hypothesis import strategies as st
from test_hostile import HOSTILE as SHARED
from test_hostile import _dump, _fresh, _run, check_cli, mutated

FAST, SLOW = 25, 1000
HOSTILE = SHARED.map(copy.deepcopy)
ROOT = Path(__file__).resolve().parents[1]
MOE_MODEL = {
    "num_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "ffn_hidden_size": 512,
    "seq_length": 256,
    "vocab_size": 1024,
    "activation": "swiglu",
    "moe": {
        "num_experts": 8,
        "top_k": 2,
        "ffn_hidden_size": 256,
        "shared_expert_ffn_hidden_size": 256,
        "num_groups": 4,
        "group_topk": 2,
        "capacity_factor": 1.0,
        "load": {"skew": 1.0, "seed": 3},
    },
}
MOE = {
    "name": "hostile-moe",
    "model": MOE_MODEL,
    "cluster": {"topology": "dgx-h100", "num_nodes": 1},
    "training": {"global_batch_size": 16, "micro_batch_size": 2},
    "parallelism": {
        "tensor_parallel": 2,
        "sequence_parallel": True,
        "expert_parallel": 2,
        "expert_tensor_parallel": 1,
        "moe": {"dispatcher": "alltoall"},
    },
}
GPU = {
    "name": "hostile-gpu",
    "base": "h100-sxm5-80gb",
    "hbm_gib": 96,
    "gemm": {"max_efficiency": 0.7, "k_half": 256},
    "memory_kernels": {"softmax": {"forward": 0.6, "backward": 0.4}},
    "flash_attention_efficiency": 0.5,
    "power_w": 700,
}
WHOLE_GPU = yaml.safe_load((ROOT / "simulator" / "hardware" / "gpus" / "h100-sxm5-80gb.yaml").read_text())
TOPOLOGY = yaml.safe_load((ROOT / "topologies" / "dgx-h100.yaml").read_text())
# conftest's two-layer model and batch, on whichever cluster and layout each case sets
BASE = {"name": "hostile", **{k: copy.deepcopy(TINY[k]) for k in ("model", "training")}}


def moe_case(work: Path, scenario) -> int:
    d = _fresh(work)
    return check_cli(["run", str(_dump(scenario, d / "s.yaml", "yaml")), "--quiet", "--json"], [])


def gpu_case(work: Path, data) -> int:
    gpu, layout, power = data
    d = _fresh(work)
    _dump(gpu, d / "g.yaml", "yaml")
    scenario = {
        **BASE,
        "cluster": {
            "topology": "dgx-h100",
            "num_nodes": 1,
            "gpu": "g.yaml",
            **({"power_w": power} if power else {}),
        },
        "parallelism": layout,
    }
    return check_cli(["run", str(_dump(scenario, d / "s.yaml", "yaml")), "--quiet", "--json"], [])


def efficiency_case(work: Path, topo) -> int:
    d = _fresh(work)
    _dump(topo, d / "t.yaml", "yaml")
    scenario = {
        **BASE,
        "cluster": {"topology": "t.yaml", "num_nodes": 2},
        "parallelism": {"tensor_parallel": 2},
    }
    return check_cli(["run", str(_dump(scenario, d / "s.yaml", "yaml")), "--quiet", "--json"], [])


LAYOUTS = st.sampled_from(
    [
        {},
        {"tensor_parallel": 2},
        {"pipeline_parallel": 2},
        {"fsdp": {}},
        {"zero_stage": 3},
        {"context_parallel": 2},
    ]
)
GENERATORS = {
    "moe": (moe_case, mutated(MOE)),
    "gpu_file": (
        gpu_case,
        st.tuples(
            st.one_of(mutated(GPU), mutated(WHOLE_GPU), HOSTILE), LAYOUTS, st.one_of(st.none(), HOSTILE)
        ),
    ),
    "topology_efficiency": (
        efficiency_case,
        st.builds(
            lambda eff, nccl: {**TOPOLOGY, "efficiency": eff, "nccl": nccl},
            mutated({**TOPOLOGY["efficiency"], "nvls": 1.0}),
            st.one_of(st.just({}), mutated({"hop_us": {"ring": {"network": {"Simple": 9.6}}}})),
        ),
    ),
}


@pytest.fixture
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("moe-gpu")


@pytest.mark.parametrize("name", list(GENERATORS))
def test_hostile_moe_gpu_and_topology_inputs_get_one_line(name, work):
    _run(name, FAST, work, GENERATORS)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(GENERATORS))
def test_hostile_moe_gpu_and_topology_inputs_nightly(name, work):
    _run(name, SLOW, work, GENERATORS)
