"""What is at a path the user gave, asked without a traceback: pathlib's ``exists`` / ``is_file`` / ``is_dir``
raise OSError for a name the system refuses (a component over 255 bytes gives ENAMETOOLONG on Linux, a name with
a NUL byte ValueError), so every probe of a user's path goes through these, which turn that into one
ScenarioError naming the field the path came from."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pickle
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from simulator.errors import ScenarioError


def _refused(path: Path, field: str, e: OSError | ValueError) -> ScenarioError:
    if isinstance(e, OSError) and e.errno == errno.ENAMETOOLONG:
        longest = max((len(os.fsencode(part)) for part in Path(path).parts), default=0)
        try:
            limit = os.pathconf("/", "PC_NAME_MAX")
        except (OSError, ValueError):
            limit = 255
        return ScenarioError(
            f"{field}: name too long ({longest} bytes in one path component, {len(os.fsencode(str(path)))} in "
            f"all; this system allows {limit} per component)"
        )
    if isinstance(e, ValueError):
        return ScenarioError(f"{field}: not a usable path ({e})")
    return ScenarioError(f"{field}: {path}: cannot look it up: {e.strerror}")


def lookup(path: Path | str, field: str) -> os.stat_result | None:
    """``stat`` of ``path`` following links, or None when nothing is there; a name the system refuses outright
    (too long, a NUL byte, permission denied on a parent) is a ScenarioError starting with ``field``."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None
        raise _refused(Path(path), field, e) from None
    except ValueError as e:
        raise _refused(Path(path), field, e) from None


def exists(path: Path | str, field: str) -> bool:
    return lookup(path, field) is not None


def is_file(path: Path | str, field: str) -> bool:
    st = lookup(path, field)
    return st is not None and stat.S_ISREG(st.st_mode)


def is_dir(path: Path | str, field: str) -> bool:
    st = lookup(path, field)
    return st is not None and stat.S_ISDIR(st.st_mode)


def write_through(path: Path | str) -> bool:
    """``path`` is a character device or a FIFO (``/dev/stdout``, ``/dev/null``, a named pipe): written through,
    never replaced (a rename onto it would turn the device into a regular file)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)


def check_target(path: Path | str, field: str) -> None:
    """What is at an output file's path may be replaced or written through: nothing, a regular file, a
    character device or a FIFO; a directory, block device or socket is refused (one ScenarioError)."""
    st = lookup(path, field)
    if st is None or stat.S_ISREG(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return
    what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file, character device or pipe"
    raise ScenarioError(f"{field} {path}: is {what}")


def install(tmp: Path, path: Path, field: str) -> None:
    """Put the finished temporary file ``tmp`` at ``path``: renamed onto a regular file or a missing path (a
    reader never sees half a file), copied through a character device or FIFO; ``tmp`` is gone afterwards."""
    try:
        check_target(path, field)
        if write_through(path):
            with open(tmp, "rb") as src, open(path, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        else:
            os.replace(tmp, path)
    except OSError as e:
        raise ScenarioError(f"{field} {path}: cannot write: {e.strerror}") from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def cache_root() -> Path:
    """Where clustersim keeps what it works out once and reads again in later runs (parsed shipped tables,
    routes inside a node): ``$CLUSTERSIM_CACHE``, else the user's cache directory (XDG), ``clustersim``."""
    root = os.environ.get("CLUSTERSIM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "clustersim"
    )
    return Path(root)


def keep(target: Path, data: bytes) -> bool:
    """Best effort, for a cache file: ``data`` written to a temporary file beside ``target`` and renamed over it
    (a reader, or a concurrent run, never sees half a file). False where the directory cannot be made or the
    file written (a read-only home): a cache that is not kept is worked out again next time, never an error."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
        return True
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return False


KEEP_PER_NAME = 4  # a few installs or checkouts in use side by side each keep theirs


def pickled(directory: Path, name: str, key: object, make: Callable[[], object]) -> object:
    """What ``make()`` returns, kept pickled between processes in ``directory``, as ``name`` with a hash
    of ``key`` (what it depends on: file sizes, modification times, a format version): unpickled where a file of
    that key is there, else made and written, removing ``name``'s least recently used files beyond KEEP_PER_NAME
    (other checkouts' or versions'). Any problem with the cache is a reason to make it again, never an error."""
    digest = hashlib.sha256(repr((name, key)).encode()).hexdigest()[:24]
    target = directory / f"{name}-{digest}.pickle"
    try:
        with open(target, "rb") as f:
            value = pickle.load(f)
        with contextlib.suppress(OSError):
            os.utime(target)  # in use: the newest are the ones kept
        return value
    except Exception:  # missing, stale format, unreadable: make it
        pass
    value = make()
    if keep(target, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)):
        _prune(target, name)
    return value


def _prune(target: Path, name: str) -> None:
    """Remove ``name``'s cache files beyond the KEEP_PER_NAME last used (each install or checkout has its own, the
    files' times being part of the key: 26 tables had piled up here from clones of the repository)."""
    mine = re.compile(re.escape(name) + r"-[0-9a-f]{24}\.pickle")
    with contextlib.suppress(OSError):
        others = [p for p in target.parent.iterdir() if p != target and mine.fullmatch(p.name)]
        others.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in others[KEEP_PER_NAME - 1 :]:
            old.unlink()
