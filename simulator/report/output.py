"""Files the CLI writes (traces, reports, images, fitted profiles): checked before any simulation runs, and
written whole or not at all (a temporary file beside the target, then a rename)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from simulator import paths
from simulator.errors import ScenarioError


def check_output_file(path: Path, option: str) -> None:
    """``path`` can be written: a regular file, a missing path, a character device or a FIFO (written through:
    ``--trace /dev/stdout``), in a directory that exists and is writable; never a directory."""
    paths.check_target(path, option)
    if paths.exists(path, option) and not os.access(path, os.W_OK):
        raise ScenarioError(f"{option} {path}: not writable")
    if paths.write_through(path):
        return
    parent = path.parent if str(path.parent) else Path(".")
    if not paths.is_dir(parent, option):
        raise ScenarioError(f"{option} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ScenarioError(f"{option} {path}: directory {parent} is not writable")


def check_output_dir(path: Path, option: str) -> None:
    """A directory that exists or can be made, and can be written to."""
    if paths.exists(path, option) and not paths.is_dir(path, option):
        raise ScenarioError(f"{option} {path}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ScenarioError(f"{option} {path}: cannot create it: {e.strerror}") from None
    if not os.access(path, os.W_OK):
        raise ScenarioError(f"{option} {path}: not writable")


def temporary_beside(path: Path) -> Path:
    """A hidden temporary name in ``path``'s directory with its suffix (exporters pick the format by it)."""
    path = Path(path)
    if paths.write_through(path):  # /dev/stdout, a FIFO: the temporary file goes where temporary files go
        return Path(tempfile.gettempdir()) / f"clustersim.{os.getpid()}.tmp{path.suffix}"
    return path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")


def write_atomic(path: Path, text: str | bytes, option: str = "") -> None:
    """Write ``text`` (or bytes) to ``path`` whole: a reader never sees half a file, a failure leaves none; a
    character device or FIFO at ``path`` is written through, never replaced."""
    path = Path(path)
    paths.check_target(path, option or "output")
    tmp = temporary_beside(path)  # for a device or FIFO, in the temporary directory; paths.install copies it
    try:
        if isinstance(text, bytes):
            tmp.write_bytes(text)
        else:
            tmp.write_text(text, encoding="utf-8")
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ScenarioError(f"{path}: cannot write: {e.strerror}") from None
    paths.install(tmp, path, option or "output")
