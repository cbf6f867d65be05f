"""First contact, reconstructed from git history: each validation case as the simulator predicted it just before
the case arrived (the parent of the commit that added it), before any change the case prompted.

For every shipped validation file and every commit that added case ids to it (oldest first), the file as that
commit has it is run by the code of the commit's parent (a git worktree), and each new case's prediction is kept.
A case the parent's code could not run (a field that came with its own commit) is kept as not stated, with the
reason. Writes simulator/validation/first_contact.yaml (what simulator/validation/first_contact.py reads), keeping the
rows of files it does not reconstruct; rerun only to rebuild it (about 10-20 min on 2 cores):

    python benchmarks/first_contact_history.py
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = "simulator/validation"
# published.yaml is the suite the simulator was built against from its first commit (it came with the project's
# brief): it has no moment before the code knew it.
STEMS = (
    "deepspeed",
    "fp8",
    "h100-rank",
    "llm-foundry",
    "memory",
    "moe",
    "torchtitan-2024",
    "vtrain-8gpu",
    "vtrain-multi",
)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def case_ids(text: str) -> list[str]:
    data = yaml.safe_load(text) or {}
    return [str(c.get("id")) for c in data.get("cases", []) if isinstance(c, dict)]


def arrivals(stem: str) -> list[tuple[str, str, list[str]]]:
    """(commit, date, new case ids) for each commit that added cases to the file, oldest first."""
    path = f"{VALIDATION}/{stem}.yaml"
    commits = git("log", "--reverse", "--format=%H %cs", "--", path).split("\n")
    seen: set[str] = set()
    out = []
    for line in filter(None, commits):
        sha, date = line.split()
        ids = case_ids(git("show", f"{sha}:{path}"))
        new = [i for i in ids if i not in seen]
        seen.update(ids)
        if new:
            out.append((sha, date, new))
    return out


def run(tree: Path, cases: Path) -> tuple[list[dict] | None, str]:
    """The old code's validate --json rows for a cases file (None where it printed no JSON), and its last line."""
    r = subprocess.run(
        [sys.executable, "-m", "simulator", "validate", "--cases", str(cases), "--json", "--quiet"],
        cwd=tree,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
    )
    last = ((r.stderr or r.stdout).strip().splitlines() or ["no output"])[-1]
    try:
        return json.loads(r.stdout)["cases"], last
    except (json.JSONDecodeError, KeyError):
        return None, last


def kept(row: dict) -> dict:
    return {k: row.get(k) for k in ("metric", "published", "predicted", "status")}


def predict(parent: str, cases_text: str, ids: list[str]) -> dict[str, dict]:
    """Run the parent commit's validate on the cases ``ids`` (as the arriving commit's file states them)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", str(tree), parent)
        try:
            data = yaml.safe_load(cases_text)
            data["cases"] = [c for c in data["cases"] if str(c.get("id")) in ids]
            cases = Path(tmp) / "cases.yaml"
            cases.write_text(yaml.safe_dump(data, sort_keys=False))
            whole, _ = run(tree, cases)
            if whole is not None:
                return {str(row["id"]): kept(row) for row in whole}
            out: dict[str, dict] = {}
            for case in data["cases"]:  # one at a time: a case the old code rejects must not hide the others
                one = Path(tmp) / "one.yaml"
                one.write_text(
                    yaml.safe_dump({**{k: v for k, v in data.items() if k != "cases"}, "cases": [case]})
                )
                rows, last = run(tree, one)
                cid = str(case.get("id"))
                out[cid] = kept(rows[0]) if rows else {"status": "not stated", "why": last[:300]}
            return out
        finally:
            git("worktree", "remove", "--force", str(tree))


def row_of(sha: str, date: str, parent: str, r: dict) -> dict:
    row = {"commit": sha[:12], "date": date, "run_by": parent[:12]}
    if r.get("metric") is not None:
        predicted = r.get("predicted")
        row.update(
            metric=r["metric"],
            published=r["published"],
            predicted=None if predicted is None else round(predicted, 6),
        )
    row["status"] = r["status"]
    if r.get("why"):
        row["why"] = re.sub(r"/tmp/\S+?\.yaml", "the case", r["why"])
    return row


def main() -> None:
    from simulator.validation.first_contact import stored, write

    history = {stem: rows for stem, rows in stored().items() if stem not in STEMS}
    for stem in STEMS:
        path = f"{VALIDATION}/{stem}.yaml"
        for sha, date, new in arrivals(stem):
            parent = git("rev-parse", f"{sha}^").strip()
            print(f"{stem}: {len(new)} cases of {sha[:7]} ({date}) run by {parent[:7]}", flush=True)
            for cid, r in predict(parent, git("show", f"{sha}:{path}"), new).items():
                history.setdefault(stem, {})[cid] = row_of(sha, date, parent, r)
    write(history)
    print("wrote simulator/validation/first_contact.yaml")


if __name__ == "__main__":
    main()
