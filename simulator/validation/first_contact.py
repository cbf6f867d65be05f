"""First contact: how the simulator predicted each validation case before anything the case prompted was changed.

A source's first-contact errors are the honest figure for a stack, GPU or scale the code has not yet seen: once a
file is in the repository, mechanisms get tuned while looking at it, and its later errors are partly in sample.
``first_contact.yaml`` keeps, for every case of every shipped validation file, its prediction at that moment:

- for the files that arrived before this record existed, reconstructed from git history by
  ``benchmarks/first_contact_history.py`` (each case run by the code of the parent of the commit that added it);
- for a file (or cases) added from now on, recorded by this module before any change they prompt:

    python -m simulator.validation.first_contact STEM [STEM ...]   # simulator/validation/STEM.yaml's new cases

A case the code of its moment could not run keeps ``status: not stated`` (or ``failed``) and its reason: it has no
first-contact error, and its error bar comes from leave-one-source-out instead (simulator/validation/accuracy.py).
``published.yaml`` is exempt: it came with the project's brief and the simulator was built against it from its
first commit, so it has no moment before the code knew it. tests/test_accuracy.py fails when a shipped case has
no record.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
from functools import cache
from pathlib import Path

from simulator.validation.signs import kind_and_error

HERE = Path(__file__).resolve().parent
FIRST_CONTACT_FILE = HERE / "first_contact.yaml"
EXEMPT = {
    "published": "the suite the simulator was built against from its first commit (it came with the brief)",
}


@cache
def stored() -> dict[str, dict[str, dict]]:
    """{file stem: {case id: row}}, each row: commit, date, run_by, metric, published, predicted, status[, why]."""
    from simulator.scenario.files import read_yaml

    if not FIRST_CONTACT_FILE.is_file():
        return {}
    return read_yaml(FIRST_CONTACT_FILE, "first-contact file", shipped=True).get("sources", {})


def signed_error(row: dict) -> tuple[str, float] | None:
    """(kind, error %) of a first-contact row, signed as accuracy.py signs them (speed: + = simulated faster;
    memory: + = simulated larger), or None where the case was not stated then."""
    predicted = row.get("predicted")
    if predicted is None or row.get("status") in ("failed", "not stated"):
        return None
    return kind_and_error(row["metric"], row["published"], predicted)


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "simulator"],
            cwd=HERE.parents[1],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return out.stdout.strip() + ("+uncommitted" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def record(stem: str) -> list[dict]:
    """Run the cases of simulator/validation/STEM.yaml that have no first-contact row yet with the code as it
    stands and add them to first_contact.yaml; return the new rows."""
    from simulator.validation.runner import load_cases, run_cases

    if stem in EXEMPT:
        raise SystemExit(f"{stem}: exempt from first contact ({EXEMPT[stem]})")
    known = stored().get(stem, {})
    cases = [c for c in load_cases(HERE / f"{stem}.yaml") if str(c.get("id")) not in known]
    commit, date = _commit(), datetime.date.today().isoformat()
    rows = []
    for r in run_cases(cases):
        row = {
            "commit": commit,
            "date": date,
            "run_by": commit,
            "metric": r.metric,
            "published": r.published,
            "predicted": None if r.predicted is None else round(r.predicted, 6),
            "status": r.status,
        }
        if r.status == "failed":
            row["why"] = r.message[:300]
        rows.append((r.id, row))
    write({**stored(), stem: {**known, **dict(rows)}})
    return [row for _, row in rows]


def write(sources: dict[str, dict[str, dict]], path: Path = FIRST_CONTACT_FILE) -> None:
    import yaml

    header = (
        "# First contact: each validation case as the simulator predicted it before any change the case prompted\n"
        "# (simulator/validation/first_contact.py says how each row was made). commit: the commit that added the\n"
        "# case; run_by: the code that predicted it (that commit's parent, for the cases reconstructed from history).\n"
        "# Never rewrite a row: add rows for new cases with `python -m simulator.validation.first_contact STEM`.\n"
    )
    body = {"sources": {stem: dict(sorted(rows.items())) for stem, rows in sorted(sources.items())}}
    text = yaml.safe_dump(body, sort_keys=False, width=200, default_flow_style=None)
    path.write_text(header + text)
    stored.cache_clear()


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        raise SystemExit(__doc__)
    for name in sys.argv[1:]:
        if not (HERE / f"{name}.yaml").is_file():
            raise SystemExit(
                f"first_contact: no validation file simulator/validation/{name}.yaml (give its stem)"
            )
        new = record(name)
        print(f"{name}: {len(new)} new case(s) recorded at first contact")
