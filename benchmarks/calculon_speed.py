"""This simulator's speed beside Calculon's (calculon-ai/calculon caa4b11, Apache-2.0) on the same jobs (issue 64):
the whole process (``clustersim run FILE --json`` against ``calculon llm APP EXE SYSTEM OUT``, CPU seconds of the
child, round-robin, best of 5) and in process (``simulate`` warm against Calculon's ``Llm.compile`` + ``run``,
best of 3), with the ratio (target: 1.0x or under for the whole process).

    pip install -e PATH/TO/calculon   # not a dependency of this project (calculon llm must be on PATH)
    python benchmarks/calculon_speed.py

Calculon cannot state every layout exactly: it needs the layers to divide by PP x interleaving (Llama 3 405B's 126
layers on 16 x 2 stages are 128 there) and has no embedding or output layer; each case's Calculon side is the
nearest job it can run, named beside the row.
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from bench_scale import gpt3_175b_data

from simulator import load_scenario, simulate

ROOT = Path(__file__).resolve().parents[1]


def exe(
    gpus: int,
    tp: int,
    pp: int,
    batch: int,
    mbs: int,
    recompute: str,
    dtype: str,
    v: int = 1,
    sp: bool = False,
) -> dict:
    """A Calculon execution (its examples/*.json fields), TP on the NVLink network, PP and DP on the other."""
    return {
        "num_procs": gpus, "tensor_par": tp, "pipeline_par": pp, "data_par": gpus // (tp * pp),
        "tensor_par_net": 0, "pipeline_par_net": 1, "data_par_net": 1, "batch_size": batch,
        "microbatch_size": mbs, "datatype": dtype, "fused_activation": True, "attention_type": "multihead",
        "activation_recompute": recompute, "pipeline_interleaving": v, "optimizer_sharding": False,
        "tensor_par_comm_type": "rs_ag" if sp else "ar",
        "tensor_par_overlap": "none", "seq_par_ag_redo": False, "data_par_overlap": False,
        "weight_offload": False, "activations_offload": False, "optimizer_offload": False, "training": True,
    }  # fmt: skip


def app(hidden: int, ffn: int, seq: int, heads: int, blocks: int) -> dict:
    return {
        "hidden": hidden,
        "feedforward": ffn,
        "seq_size": seq,
        "attn_heads": heads,
        "attn_size": hidden // heads,
        "num_blocks": blocks,
    }


# (name, this simulator's scenario (a shipped file or a dict), Calculon's application, execution and system file,
# what differs on Calculon's side)
CASES = [
    (
        "quickstart (GPT-3 1.3B, DDP, 8 A100)",
        "scenarios/quickstart-gpt3-1.3b-ddp-8xa100.yaml",
        app(2048, 8192, 2048, 16, 24),
        exe(8, 1, 1, 64, 4, "none", "float16"),
        "systems/a100_80g.json",
        "Calculon: fp16 (its A100 has no bf16 rate; the same peak)",
    ),
    (
        "GPT-3 175B on 1,024 A100",
        gpt3_175b_data(1024),
        app(12288, 49152, 2048, 96, 96),
        exe(1024, 8, 8, 256, 1, "attn_only", "float16", 3, sp=True),
        "systems/a100_80g.json",
        "",
    ),
    (
        "1T on 3,072 A100 (NAR21)",
        "scenarios/published/nar21-t1-1t.yaml",
        app(25600, 102400, 2048, 160, 128),
        exe(3072, 8, 64, 3072, 1, "full", "float16"),
        "systems/a100_80g.json",
        "",
    ),
    (
        "Llama 3 405B on 16,384 H100",
        "scenarios/llama3-405b-4d-cp1-16384xh100.yaml",
        app(16384, 53248, 8192, 128, 128),
        exe(16384, 8, 16, 2048, 1, "full", "float16", 2, sp=True),
        "systems/h100_80g_nvl8.json",
        "Calculon: 128 layers (126 do not split into 16 x 2 stages), no GQA, fp16",
    ),
    (
        "GPT-3 175B on 16,384 A100",
        gpt3_175b_data(16384),
        app(12288, 49152, 2048, 96, 96),
        exe(16384, 8, 8, 4096, 1, "attn_only", "float16", 3, sp=True),
        "systems/a100_80g.json",
        "",
    ),
]


def child_cpu(cmd: list[str], codes: tuple[int, ...] = (0,)) -> float:
    """CPU seconds (user + system) of one child process running ``cmd`` to the end with one of ``codes``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode not in codes:
        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def best(fn, runs: int) -> float:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def main() -> None:
    calculon_bin = shutil.which("calculon")
    try:
        import logging

        import calculon
        from calculon.llm import Llm
        from calculon.system import System
    except ImportError:
        calculon = None
    if calculon is None or calculon_bin is None:
        print("Calculon is not installed (pip install -e PATH/TO/calculon): nothing to compare")
        return
    root = Path(calculon.__file__).resolve().parents[1]
    work = Path(tempfile.mkdtemp(prefix="calculon-speed-"))
    clustersim = [sys.executable, "-m", "simulator"]
    print(
        f"{'job':38s} {'clustersim':>11s} {'Calculon':>9s} {'ratio':>6s} | {'in process':>10s} {'Calculon':>9s}"
        f" {'ratio':>6s}   (CPU s, whole process best of 5; wall s in process best of 3)"
    )
    for name, scenario, application, execution, system, differs in CASES:
        if isinstance(scenario, dict):
            path = work / f"{scenario['name']}.yaml"
            path.write_text(yaml.safe_dump(scenario))
        else:
            path = ROOT / scenario
        files = {k: work / f"{k}.json" for k in ("app", "exe")}
        files["app"].write_text(json.dumps(application))
        files["exe"].write_text(json.dumps(execution))
        ours_cmd = [*clustersim, "run", str(path), "--json"]
        theirs_cmd = [calculon_bin, "llm", str(files["app"]), str(files["exe"]), str(root / system),
                      str(work / "out.json")]  # fmt: skip
        ours, theirs = [], []
        for _ in range(5):  # round-robin: the machine's drift falls on both
            ours.append(child_cpu(ours_cmd))
            # calculon llm exits 255 where the layout needs more memory than the system has, after modelling it
            theirs.append(child_cpu(theirs_cmd, (0, 255)))
        s = load_scenario(path)
        simulate(s)  # caches warm, as a sweep or a plan runs it
        warm = best(lambda s=s: simulate(s), 3)
        a = Llm.Application(application)
        syst = System(calculon.io.read_json_file(str(root / system)))

        def calc(a=a, syst=syst, execution=execution) -> None:
            model = Llm(a, logging.Logger("calculon"))
            model.compile(syst, Llm.Execution.from_json(execution))
            with contextlib.suppress(Llm.Error):  # out of memory: said after the model ran (Llm.run)
                model.run(syst)

        inproc = best(calc, 3)
        print(
            f"{name:38s} {min(ours):9.3f} s {min(theirs):7.3f} s {min(ours) / min(theirs):5.2f}x |"
            f" {warm:8.4f} s {inproc:7.4f} s {warm / inproc:5.1f}x" + (f"   ({differs})" if differs else "")
        )


if __name__ == "__main__":
    main()
