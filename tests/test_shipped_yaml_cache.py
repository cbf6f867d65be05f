"""Shipped YAML files (the accuracy file, NCCL's constants, model presets, GPU and topology files) are parsed once
per version of the file and kept pickled between processes (scenario/files.py read_shipped_yaml,
paths.pickled)."""

from __future__ import annotations

import os

import yaml

from simulator.metrics.error_bar import ACCURACY_FILE
from simulator.scenario.files import read_shipped_yaml


def test_a_shipped_file_is_parsed_once_then_read_back_and_again_when_it_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERSIM_CACHE", str(tmp_path / "cache"))
    first = read_shipped_yaml(ACCURACY_FILE)
    assert first == yaml.safe_load(ACCURACY_FILE.read_text())  # what libyaml parses, as the safe loader does
    (kept,) = (tmp_path / "cache" / "yaml").glob("accuracy.yaml-*.pickle")
    assert read_shipped_yaml(ACCURACY_FILE) == first  # read back from the pickle

    own = tmp_path / "own.yaml"
    own.write_text("a: 1\n")
    assert read_shipped_yaml(own) == {"a": 1}
    own.write_text("a: 22\n")  # another size: parsed again
    assert read_shipped_yaml(own) == {"a": 22}
    own.write_text("a: 33\n")  # the same size, a later time: parsed again
    st = own.stat()
    os.utime(own, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert read_shipped_yaml(own) == {"a": 33}


def test_an_unusable_cache_is_parsed_around(tmp_path, monkeypatch):
    """A cache directory that cannot be made (a file in its place) or a damaged cache file is a reason to parse,
    never an error."""
    blocked = tmp_path / "blocked"
    blocked.write_text("not a directory")
    monkeypatch.setenv("CLUSTERSIM_CACHE", str(blocked))
    own = tmp_path / "own.yaml"
    own.write_text("b: [1, 2]\n")
    assert read_shipped_yaml(own) == {"b": [1, 2]}

    monkeypatch.setenv("CLUSTERSIM_CACHE", str(tmp_path / "cache"))
    assert read_shipped_yaml(own) == {"b": [1, 2]}
    (kept,) = (tmp_path / "cache" / "yaml").glob("own.yaml-*.pickle")
    kept.write_bytes(b"damaged")
    assert read_shipped_yaml(own) == {"b": [1, 2]}


def test_a_missing_shipped_file_is_one_scenario_error(tmp_path, monkeypatch):
    """As every file read: a ScenarioError naming the file, not an OSError from looking it up for the cache."""
    import pytest

    from simulator.errors import ScenarioError

    monkeypatch.setenv("CLUSTERSIM_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ScenarioError, match="gone.yaml"):
        read_shipped_yaml(tmp_path / "gone.yaml", "a shipped file")
