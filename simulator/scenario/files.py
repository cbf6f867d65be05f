"""Reading the user's files (scenarios, topologies, DeepSpeed and Hugging Face configs, frameworks, case lists):
one bounded reader, so that every kind of file fails the same clear way.

A file must exist, be at most ``MAX_FILE_BYTES``, be UTF-8, and parse to a tree at most ``MAX_DEPTH`` deep with at
most ``MAX_VALUES`` values once YAML aliases are expanded (a 484-byte "billion laughs" file expands to 10^9; the
scenario is then walked by validation and error messages, so the bound is on the expanded size). A scenario is a
few hundred values and about 5 deep.
"""

from __future__ import annotations

import difflib
import json
import stat
import zlib
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from simulator import paths
from simulator.errors import ScenarioError

MAX_FILE_BYTES = 16 * 2**20
MAX_DEPTH = 32
MAX_VALUES = 200_000


def is_path(value: str) -> bool:
    """A name (``dgx-a100``) or a path (``my/dgx.yaml``, ``./fw.yaml``): nothing in between."""
    return "/" in value or "\\" in value or value.endswith((".yaml", ".yml", ".json"))


def did_you_mean(name: object, names: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``names`` to a mistyped ``name``, or nothing."""
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.8)
    return f" (did you mean '{close[0]}'?)" if close else ""


def load_named(name: str, directory: Path, field: str, noun: str, model: type[BaseModel]):
    """A shipped data file by name (``directory/NAME.yaml``) or a file by path, validated as ``model``; every
    problem is one ScenarioError that starts with ``field``."""
    if is_path(name):
        path = Path(name)
        data = read_yaml(path, field)
    else:
        path = directory / f"{name}.yaml"
        try:
            shipped = paths.is_file(path, field)
        except ScenarioError:  # a name no file can have (too long for the system): simply not a shipped one
            shipped = False
        if not shipped:
            names = sorted(p.stem for p in directory.glob("*.yaml"))
            raise ScenarioError(
                f"{field}: unknown {noun} '{name}'{did_you_mean(name, names)}; available: {', '.join(names)} "
                f"(or a path to a {noun} file)"
            )
        data = read_yaml(path, field, shipped=True)
    label = f"{field}: {path}"
    if not isinstance(data, dict):
        raise ScenarioError(
            f"{label}: expected a mapping of {model.__name__} fields, got {type(data).__name__}"
        )
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(validation_message(e, label)) from None


def validation_message(e: ValidationError, label: str) -> str:
    """A data file's validation errors on one line each, prefixed with the file (``loc: reason (got x)``)."""
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        got = f" (got {err['input']!r})" if err["type"] not in ("missing", "extra_forbidden") else ""
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        lines.append(f"{label}: {loc}: {msg}{got}")
    return "\n".join(lines)


def check_path_value(value: object, field: str) -> str:
    """A field that names a file must be a non-empty string (``deepspeed_config: 5`` is a message, not a
    TypeError)."""
    if not isinstance(value, str) or not value.strip():
        raise ScenarioError(f"{field}: expected a file path (a string), got {value!r}")
    return value


def _label(path: Path, what: str | None) -> str:
    return f"{what}: {path}" if what else str(path)


def read_bytes(path: Path, what: str | None = None, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes; ``what`` names the file's role in
    messages (e.g. ``deepspeed_config``)."""
    path, label = Path(path), _label(path, what)
    st = paths.lookup(path, label)
    if st is None:
        raise ScenarioError(f"{label}: file not found")
    if stat.S_ISDIR(st.st_mode):
        raise ScenarioError(f"{label}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise ScenarioError(f"{label}: not a regular file")
    if st.st_size > limit:
        raise ScenarioError(f"{label}: {st.st_size / 2**20:.1f} MiB; the limit is {limit / 2**20:.0f} MiB")
    try:
        return path.read_bytes()
    except OSError as e:
        raise ScenarioError(f"{label}: cannot read: {e.strerror}") from None


def decode(raw: bytes, label: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{label}: not UTF-8 text (byte {e.start}: {e.reason})") from None


def read_text(path: Path, what: str | None = None, limit: int = MAX_FILE_BYTES) -> str:
    """The text of ``path`` (UTF-8, at most ``limit`` bytes); ``what`` names the file's role in messages."""
    return decode(read_bytes(path, what, limit), _label(path, what))


# a gzip file inflating more than this many times its compressed size, past GUNZIP_RATIO_AFTER bytes, is a bomb,
# refused before it reaches the size limit in memory (profiler traces inflate 10-50 times; zeros about 1,000)
GUNZIP_MAX_RATIO = 300
GUNZIP_RATIO_AFTER = 32 * 2**20
_GUNZIP_STEP = 8 * 2**20


def gunzip(raw: bytes, label: str, limit: int) -> bytes:
    """A gzip file's content, refused past ``limit`` bytes as it inflates (a 1 MB file can inflate to 1 GiB), or as
    soon as it has inflated over ``GUNZIP_MAX_RATIO`` times what it consumed (a bomb, stopped at 32 MiB)."""
    d = zlib.decompressobj(wbits=31)
    parts: list[bytes] = []
    size, pending = 0, raw
    try:
        while pending and not d.eof:
            chunk = d.decompress(pending, _GUNZIP_STEP)
            parts.append(chunk)
            size += len(chunk)
            pending = d.unconsumed_tail
            consumed = len(raw) - len(pending)
            if size > limit:
                raise ScenarioError(f"{label}: inflates to more than {limit / 2**20:.0f} MiB (the limit)")
            if size > GUNZIP_RATIO_AFTER and size > GUNZIP_MAX_RATIO * consumed:
                raise ScenarioError(
                    f"{label}: inflates {size / max(consumed, 1):,.0f} times its compressed size (over "
                    f"{GUNZIP_MAX_RATIO}: a gzip bomb, not a trace)"
                )
    except zlib.error:
        raise ScenarioError(f"{label}: truncated or corrupt gzip file") from None
    if not d.eof:
        raise ScenarioError(f"{label}: truncated or corrupt gzip file (it ends early)")
    return b"".join(parts)


def parse_json(text: str, label: str) -> object:
    """JSON text parsed, with every way a hostile file fails as one ScenarioError: syntax (with the line),
    nesting past Python's recursion limit, an integer literal longer than any float holds (over 308 digits: a
    duration or size of 400 digits made float() raise OverflowError in the trace readers)."""
    try:
        return json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as e:
        ends = " (the file ends there: truncated?)" if e.pos >= len(e.doc.rstrip()) else ""
        raise ScenarioError(f"{label}: not valid JSON: line {e.lineno}: {e.msg}{ends}") from None
    except RecursionError:
        raise ScenarioError(f"{label}: nested too deep to read") from None
    except ValueError as e:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise ScenarioError(f"{label}: {_digits(e)}") from None


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 308:
        raise ValueError(
            f"an integer of {len(text.lstrip('-')):,} digits exceeds what a float holds (308 digits)"
        )
    return int(text)


def _digits(e: ValueError) -> str:
    text = str(e)
    if "digits" in text:
        return f"a number too long to read ({text.split(';')[0]})"
    return f"not readable ({text[:120]})"


class _TooDeep(Exception):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses nesting deeper than MAX_DEPTH while composing (before Python's
    recursion limit is reached)."""

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _TooDeep
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _yaml_error(e: yaml.YAMLError, label: str) -> ScenarioError:
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return ScenarioError(f"{label}: YAML syntax error{where}: {problem}")


# libyaml's parser where PyYAML was built with it: 5-10x faster, for the files that ship with the package (their
# size and shape are known); a user's file goes through the bounded pure-Python loader below
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_shipped_yaml(text: str) -> object:
    """A shipped data file's YAML (GPU, topology, framework, preset, table metadata), parsed by libyaml."""
    return yaml.load(text, Loader=_FAST_LOADER)


SHIPPED_YAML_CACHE = 1  # bump when what a shipped file parses to changes without the file changing


def read_shipped_yaml(path: Path, what: str | None = None) -> object:
    """A file of the package's own, parsed by libyaml (unbounded) once per version of the file and kept pickled
    between processes (``paths.pickled``, keyed by its size and modification time): the accuracy file took 8-10
    ms of every run's 0.3 s to parse, unpickling it well under 1 ms."""
    st = paths.lookup(path, _label(path, what))
    if st is None:  # no such file: read_text says so, as one ScenarioError
        return load_shipped_yaml(read_text(path, what))
    key = (SHIPPED_YAML_CACHE, str(path.resolve()), st.st_size, st.st_mtime_ns)
    return paths.pickled(
        paths.cache_root() / "yaml", path.name, key, lambda: load_shipped_yaml(read_text(path, what))
    )


def read_yaml(path: Path, what: str | None = None, shipped: bool = False) -> object:
    """A YAML file's content, bounded (see the module's docstring); every problem is one ScenarioError.
    ``shipped``: a file of the package's own (``read_shipped_yaml``)."""
    if shipped:
        return read_shipped_yaml(path, what)
    label = _label(path, what)
    text = read_text(path, what)
    try:
        loader = _BoundedLoader(text)  # its reader refuses control characters already here
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except _TooDeep:
        raise ScenarioError(f"{label}: nested deeper than {MAX_DEPTH} levels") from None
    except yaml.YAMLError as e:
        raise _yaml_error(e, label) from None
    except ValueError as e:  # an integer literal over Python's 4,300-digit limit
        raise ScenarioError(f"{label}: {_digits(e)}") from None
    check_tree(data, label)
    return data


def read_json(path: Path, what: str | None = None) -> object:
    """A JSON file's content, bounded as YAML is."""
    label = _label(path, what)
    data = parse_json(read_text(path, what), label)
    check_tree(data, label)
    return data


def check_tree(data: object, label: str) -> None:
    """Refuse a parsed tree deeper than MAX_DEPTH, larger than MAX_VALUES once shared (aliased) subtrees are
    counted each time they are used, or containing itself."""
    sizes: dict[int, int] = {}
    open_ids: set[int] = set()

    def size(node: object, depth: int) -> int:
        if not isinstance(node, dict | list):
            return 1
        if depth > MAX_DEPTH:
            raise ScenarioError(f"{label}: nested deeper than {MAX_DEPTH} levels")
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_ids:
            raise ScenarioError(f"{label}: contains itself (a YAML alias to an enclosing anchor)")
        open_ids.add(key)
        items = node.items() if isinstance(node, dict) else ((None, v) for v in node)
        total = 1
        for k, v in items:
            total += size(k, depth + 1) + size(v, depth + 1)
            if total > MAX_VALUES:
                raise ScenarioError(
                    f"{label}: expands to more than {MAX_VALUES:,} values (YAML aliases repeating aliases?)"
                )
        open_ids.discard(key)
        sizes[key] = total
        return total

    size(data, 0)


def mapping_sections(data: dict, names: tuple[str, ...], label: str) -> dict:
    """A copy of the scenario dict (``data``) whose sections are fresh dicts, for a launch file (``label``) to fill:
    one line where one of ``names`` is there but not a mapping (scenario/torchtitan.py, scenario/megatron_args.py)."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for name in names:
        if data.get(name) is not None and not isinstance(data[name], dict):
            raise ScenarioError(f"{name}: expected a mapping of its fields beside {label}")
    return data
