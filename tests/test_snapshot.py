"""Every shipped scenario and every published validation case prints what it printed when the snapshot was
taken (tests/snapshot.py says how to regenerate it when a change is meant to move results)."""

import json

from snapshot import STORED, collect, differences


def test_every_shipped_scenario_and_validation_case_matches_the_stored_snapshot():
    stored = json.loads(STORED.read_text())
    new = collect()
    diffs = differences(stored, new)
    shown = "\n".join(diffs[:40]) + (f"\n... and {len(diffs) - 40} more" if len(diffs) > 40 else "")
    assert not diffs, (
        f"{len(diffs)} differences from {STORED.name} (python tests/snapshot.py regenerates it):\n{shown}"
    )


def test_the_snapshot_covers_every_shipped_scenario_and_case():
    stored = json.loads(STORED.read_text())
    assert sum(k.startswith("scenario:") for k in stored) >= 60
    assert sum(k.startswith("case:") for k in stored) == 44
    assert all("error" not in v for v in stored.values())


def test_differences_sees_a_moved_number_and_ignores_rounding():
    a = {"x": [1.0, {"y": 2.0}], "z": "s"}
    assert differences(a, {"x": [1.0, {"y": 2.0 * (1 + 1e-12)}], "z": "s"}) == []
    assert differences(a, {"x": [1.0, {"y": 2.001}], "z": "s"}) == [".x[1].y: 2.0 -> 2.001"]
    assert differences(a, {"x": [1.0], "z": "t"}) == [".x: 2 items -> 1", ".z: 's' -> 't'"]
    assert differences(a, {"x": [1.0, {"y": 2.0}]}) == [".z: missing"]
