"""This simulator against Calculon (calculon-ai/calculon caa4b11, Apache-2.0) on GPT-3 175B / 1,024 A100 and the
1T model / 3,072 A100: the layouts Calculon's ``llm-optimal-execution`` search picks (its output, stored in
docs/measurements/calculon-*.json with the command that made it), each simulated here, and this simulator's own
pick (``clustersim plan``), with Calculon's time for that layout where it was run (``calculon llm``).

    python benchmarks/calculon_compare.py

Calculon is not a dependency: its outputs are read from the stored files.
"""

from __future__ import annotations

import json
import time
from itertools import product
from pathlib import Path

from simulator import load_scenario, simulate
from simulator.study.plan import plan

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "docs" / "measurements"

# Calculon's model files (models/gpt3-175B.json, models/megatron-1T.json) have no vocabulary; the scenarios use
# Narayanan et al.'s (51,200), as NAR21-T1-1T does.
CASES = {
    "gpt3-175b-1024": {"num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96, "gpus": 1024},
    "megatron-1t-3072": {"num_layers": 128, "hidden_size": 25600, "num_attention_heads": 160, "gpus": 3072},
}
RECOMPUTE = {"full": "full", "attn_only": "selective", "none": "none"}


def scenario_of(name: str, execution: dict):
    """A Calculon execution as a scenario: its degrees, batch, micro-batch, recomputation, interleaving,
    optimizer sharding (ZeRO-1 / distributed optimizer), sequence parallelism (its ``rs_ag`` and ``p2p_rs_ag``
    TP communication) and TP / DP overlap, on DGX A100 nodes in fp16 with Megatron-LM's 2021 kernels. Calculon's
    offload of weights, activations and optimizer states to a second memory tier has no Megatron counterpart
    here: such layouts are simulated without it (and show as out of memory)."""
    shape = CASES[name]
    e = execution
    v = e["pipeline_interleaving"]
    sp = e["tensor_par_comm_type"] != "ar" and e["tensor_par"] > 1
    parallelism = {
        "tensor_parallel": e["tensor_par"],
        "pipeline_parallel": e["pipeline_par"],
        "data_parallel": e["data_par"],
        "sequence_parallel": sp,
        "tp_comm_overlap": sp and e["tensor_par_overlap"] != "none",
        "zero_stage": 1 if e["optimizer_sharding"] else 0,
        "ddp": {"overlap_grad_reduce": bool(e["data_par_overlap"])},
    }
    if e["pipeline_par"] > 1:
        parallelism["pipeline_schedule"] = "interleaved-1f1b" if v > 1 else "1f1b"
        parallelism["virtual_pipeline_stages"] = v
    return load_scenario(
        {
            "name": f"{name} {describe(e)}",
            "framework": "megatron-2021",
            "model": {
                **{k: shape[k] for k in ("num_layers", "hidden_size", "num_attention_heads")},
                "seq_length": 2048,
                "vocab_size": 51200,
            },
            "cluster": {"topology": "dgx-a100", "num_nodes": shape["gpus"] // 8},
            "training": {
                "global_batch_size": e["batch_size"],
                "micro_batch_size": e["microbatch_size"],
                "precision": "fp16",
                "activation_recompute": RECOMPUTE[e["activation_recompute"]],
            },
            "parallelism": parallelism,
        }
    )


def describe(e: dict) -> str:
    pp = f"PP{e['pipeline_par']}" + (
        f"x{e['pipeline_interleaving']}" if e["pipeline_interleaving"] > 1 else ""
    )
    return (
        f"TP{e['tensor_par']} {pp} DP{e['data_par']} mbs{e['microbatch_size']} rc:{e['activation_recompute']}"
        f"{' zero1' if e['optimizer_sharding'] else ''} tp:{e['tensor_par_comm_type']}/{e['tensor_par_overlap']}"
        f"{' dp-overlap' if e['data_par_overlap'] else ''}"
        + "".join(
            f" {k[:-8]}" for k in ("weight_offload", "activations_offload", "optimizer_offload") if e[k]
        )
    )


def calculon_top(name: str, stored: dict, title: str = "") -> None:
    """Calculon's stored top layouts, each also simulated here."""
    print(
        f"\n{title or name}: Calculon's top layouts ({stored['command']}; {stored['executions']:,} executions)"
    )
    for rank, row in sorted(stored["top"].items(), key=lambda kv: int(kv[0])):
        e, stats = row["execution"], row["stats"]
        m = simulate(scenario_of(name, e)).metrics
        ours = f"{m.iteration_time_s:7.1f} s, {m.memory_gib['device']:5.1f} GiB" + (" OOM" if m.oom else "")
        print(
            f"  #{int(rank) + 1} {describe(e):62s} Calculon {stats['total_time']:7.1f} s,"
            f" {stats['proc_mem_tier1_cap_req'] / 2**30:5.1f} GiB | this simulator {ours}"
        )
    for label, seconds in stored.get("calculon_on_our_picks", {}).items():
        best = stored["top"]["0"]["stats"]["total_time"]
        print(
            f"  Calculon on this simulator's pick {label}: {seconds:.1f} s, {seconds / best - 1:+.1%} against "
            f"Calculon's own pick ({best:.1f} s)"
        )


CALCULON_MODELS = {"gpt3-175b-1024": "models/gpt3-175B.json", "megatron-1t-3072": "models/megatron-1T.json"}
RECOMPUTE_BACK = {v: k for k, v in RECOMPUTE.items()}


def calculon_space(name: str) -> dict:
    """Calculon's search space as plan options: its TP sizes (every factor of the GPUs dividing the hidden size and
    the heads, across nodes too: ``Llm.get_all_tensor_parallelisms``), every PP dividing the layers, every
    micro-batch size dividing a rank's batch, DDP or the distributed optimizer, and the switches (SP, TP overlap,
    the data-parallel overlaps) each on and off; Megatron's schedules only."""
    shape = CASES[name]
    gpus, h, heads = shape["gpus"], shape["hidden_size"], shape["num_attention_heads"]
    tps = tuple(t for t in range(1, gpus + 1) if gpus % t == 0 and h % t == 0 and heads % t == 0)
    return {
        "shardings": ("ddp", "zero1"),
        "switches": True,
        "max_micro_batch": 10**6,
        "tp": tps,
        "max_pp": shape["num_layers"],
        "schedules": (),
    }


def calculon_scorer(name: str):
    """Calculon's own model (``Llm.compile`` and ``run``) of a layout of this simulator's plan, on A100 80 GB
    without the second memory tier, the best over what Calculon's search would also vary for that layout
    (networks, TP overlap kind, the SP all-gather redo); None where Calculon is not installed (not a dependency:
    ``pip install -e PATH/TO/calculon``)."""
    try:
        import logging

        import calculon
        from calculon.llm import Llm
        from calculon.system import System
    except ImportError:
        return None
    from calculon_speed import exe  # beside this file: on the path when the benchmark runs as a script

    root = Path(calculon.__file__).resolve().parents[1]
    app = Llm.Application(calculon.io.read_json_file(str(root / CALCULON_MODELS[name])))
    system = calculon.io.read_json_file(str(root / "systems/a100_80g.json"))
    system["mem2"]["GiB"] = 0  # no offload: the layouts both tools can express
    syst = System(system)
    gpus = CASES[name]["gpus"]

    def score(t: dict, batch: int) -> tuple[float, float] | None:
        """(Calculon's seconds, its GiB) of plan row ``t``, or None where Calculon refuses every variant."""
        sp, tpo = bool(t["sp"]), bool(t["tp_overlap"])
        base = exe(
            gpus, t["tp"], t["pp"], batch, t["mbs"], RECOMPUTE_BACK[t["recompute"]], "float16", t["v"], sp
        )
        base.update(
            optimizer_sharding=t["sharding"] == "zero1",
            data_par_overlap=bool(t["grad_overlap"]),
            activations_offload=bool(t["act_offload"]),  # refused: this system has no second tier
        )
        best = None
        for tn, pn, dn, overlap, redo in product(
            (0, 1) if t["tp"] > 1 else (0,),
            (0, 1) if t["pp"] > 1 else (0,),
            (0, 1) if t["dp"] > 1 else (0,),
            ("ring", "pipe") if tpo else ("none",),
            (True, False) if sp and t["recompute"] != "full" else (False,),
        ):
            execution = {
                **base,
                "tensor_par_net": tn,
                "pipeline_par_net": pn,
                "data_par_net": dn,
                "tensor_par_overlap": overlap,
                "seq_par_ag_redo": redo,
            }
            try:
                model = Llm(app, logging.Logger("calculon"))
                model.compile(syst, Llm.Execution.from_json(execution))
                model.run(syst)
            except Llm.Error:
                continue
            stats = model.get_stats_json(False)
            got = (stats["total_time"], stats["proc_mem_tier1_cap_req"] / 2**30)
            best = got if best is None or got[0] < best[0] else best
        return best

    return score


def switched_plan(name: str, stored: dict, first: dict) -> None:
    """This simulator's plan over Calculon's space with the switches (``calculon_space``): layouts screened, the
    rate, the wall time, and its picks scored by Calculon's own model where Calculon is installed."""
    base = scenario_of(name, first)
    t0 = time.perf_counter()
    r = plan(base, CASES[name]["gpus"], top=3, options=calculon_space(name), batch=first["batch_size"])
    wall = time.perf_counter() - t0
    best = stored["top"]["0"]["stats"]["total_time"]
    print(
        f"  this simulator's plan over Calculon's space with its switches: {r['screened']:,} layouts screened at "
        f"{r['screened_per_s']:,.0f}/s (target 50,000/s), {r['fit_in_memory']:,} fit, {wall:.1f} s end to end "
        f"(target 10 s; Calculon: {stored['executions']:,} executions, one per network assignment too)"
    )
    own = stored["top"]["0"]["stats"]
    if stored["top"]["0"]["execution"]["optimizer_sharding"]:
        # Calculon's layers.py get_weight_grad divides the 16-bit gradients by DP under optimizer sharding;
        # Megatron's distributed optimizer keeps its gradient buffer whole: 4 + 16/d bytes a parameter with fp16
        # parameters and gradients (Megatron-LM docs/user-guide/features/dist_optimizer.md), so the gradients
        # take what the 16-bit weights take
        whole = own["proc_mem_tier1_cap_req"] / 2**30 - own["weight_grad_space"] / 2**30
        whole += own["weight_space"] / 2**30
        print(
            f"  Calculon's pick needs {own['proc_mem_tier1_cap_req'] / 2**30:.1f} GiB by its own count, "
            f"{whole:.1f} GiB with the gradients whole as Megatron's distributed optimizer keeps them (4 + 16/d "
            "bytes a parameter; Calculon shards them, layers.py get_weight_grad): a plan that keeps to memory "
            "Megatron can hold cannot take it"
        )
    score = calculon_scorer(name)
    for t in r["top"]:
        sim = (
            f"{t['iteration_time_s']:.2f} s, {t['memory_gib']:.1f} GiB"
            if t["status"] == "ok"
            else t["status"]
        )
        by = score(t, first["batch_size"]) if score else None
        judged = (
            f"Calculon {by[0]:.2f} s ({by[0] / best - 1:+.1%} against its own pick), {by[1]:.1f} GiB"
            if by
            else "Calculon not installed"
            if score is None
            else "Calculon refuses it"
        )
        print(f"    {t['layout']:60s} {sim} | {judged}")


def main() -> None:
    for name, shape in CASES.items():
        path = MEASURED / f"calculon-{name}.json"
        if not path.exists():
            print(f"{name}: no stored Calculon search ({path.name})")
            continue
        stored = json.loads(path.read_text())
        calculon_top(name, stored)
        first = stored["top"]["0"]["execution"]
        base = scenario_of(name, first)
        # Calculon's space (Megatron layouts: DDP or the distributed optimizer), then this simulator's (ZeRO-2/3, FSDP)
        for space, options in (("Calculon's space", {"shardings": ("ddp", "zero1")}), ("all layouts", None)):
            t0 = time.perf_counter()
            r = plan(base, shape["gpus"], top=3, options=options, batch=first["batch_size"])
            print(
                f"  this simulator's plan, {space} ({r['screened']} layouts screened, "
                f"{time.perf_counter() - t0:.1f} s):"
            )
            for t in r["top"]:
                sim = (
                    f"{t['iteration_time_s']:.2f} s, MFU {t['mfu']:.1%}, {t['memory_gib']:.1f} GiB"
                    if t["status"] == "ok"
                    else t["status"]
                )
                print(f"    {t['layout']:40s} {sim}")
        # the same search without Calculon's second memory tier: the layouts both tools can express
        restricted = MEASURED / f"calculon-{name}-no-offload.json"
        if restricted.exists():
            no_offload = json.loads(restricted.read_text())
            calculon_top(name, no_offload, f"{name}, no offload")
            switched_plan(name, no_offload, no_offload["top"]["0"]["execution"])


if __name__ == "__main__":
    main()
