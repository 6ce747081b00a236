"""Reading the files users give: text, JSON and YAML, each failure one PipeplanError naming
the file (and the line where the parser knows it).

Only regular files are read (a FIFO or a device is refused before it is opened), of at
most ``limits.MAX_FILE_BYTES``. Text is UTF-8 (a leading byte-order mark is dropped); JSON
objects and YAML mappings may not repeat a key; a file nested deeper than the parsers'
recursion allows is refused, not a crash.
"""

from __future__ import annotations

import json
import math
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from .errors import PipeplanError
from .limits import MAX_FILE_BYTES


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def regular_file(path: str | Path, what: str = "file", max_bytes: int = MAX_FILE_BYTES) -> Path:
    """``path`` if it names a regular file (links followed) of at most ``max_bytes``; one line
    otherwise, before anything opens it: reading a FIFO blocks until a writer comes, a device
    never ends."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise PipeplanError(f"{what} {str(path)!r}: no such file") from None
    except OSError as e:
        raise PipeplanError(f"{what} {str(path)!r}: cannot read it ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise PipeplanError(f"{what} {str(path)!r}: is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise PipeplanError(f"{what} {str(path)!r}: is {_kind(st.st_mode)}, not a regular file")
    if st.st_size > max_bytes:
        raise PipeplanError(f"{what} {str(path)!r}: {st.st_size:,} bytes; pipeplan reads files of at most "
                            f"{max_bytes:,}")
    return p


def read_text(path: str | Path, what: str = "file") -> str:
    """The file's text; anything but a regular file (a FIFO, a device such as /dev/zero) is
    refused before reading, as reading it could block or never end."""
    p = regular_file(path, what)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise PipeplanError(f"{what} {str(path)!r}: cannot read it ({e.strerror})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise PipeplanError(f"{path}:{line}: not UTF-8 text (byte {e.start}); is this the right file?") from None


def check_keys(d: Any, allowed: set[str], where: str) -> dict:
    """``d`` when it is a mapping whose keys are all ``allowed``; else PipeplanError naming
    the first unknown key (a misspelt key is never silently ignored)."""
    if not isinstance(d, dict):
        raise PipeplanError(f"{where}: expected a mapping, got {type(d).__name__}")
    extra = sorted(set(map(str, d)) - allowed)
    if extra:
        raise PipeplanError(f"{where}: unknown key {extra[0]!r} (allowed: {', '.join(sorted(allowed))})")
    return d


def name_field(d: dict, key: str, default: str, where: str) -> str:
    """``d[key]`` as a name: text or an integer (YAML reads ``name: 0`` as one), ``default``
    when absent; anything else (a number such as NaN, a list) is refused."""
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise PipeplanError(f"{where}: {key!r} must be a name (text), got {v!r}")
    return str(v)


def parse_query(query: str, where: str, strict: bool = True) -> dict[str, str]:
    """The ``key=value&...`` after a spec's ``?`` (``zoo:``, ``hf:``) as a dict; one line for a
    query that does not parse or a key given twice (never silently the last)."""
    from urllib.parse import parse_qsl

    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=strict and bool(query))
    except ValueError:
        raise PipeplanError(f"{where}: cannot read the options after '?' (expected key=value&...)") from None
    out: dict[str, str] = {}
    for key, value in pairs:
        if key in out:
            raise PipeplanError(f"{where}: key {key!r} is given twice; give it once")
        out[key] = value
    return out


def _no_duplicates(where: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        out: dict = {}
        for k, v in pairs:
            if k in out:
                raise PipeplanError(f"{where}: key {k!r} appears twice in one object")
            out[k] = v
        return out
    return hook


def parse_json(text: str, where: str) -> Any:
    import gc

    was_enabled = gc.isenabled()
    gc.disable()  # JSON builds no cycles: collecting while millions of objects are made is wasted time
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates(where))
    except json.JSONDecodeError as e:
        raise PipeplanError(f"{where}:{e.lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise PipeplanError(f"{where}: nested too deeply; not a pipeplan file") from None
    except PipeplanError:
        raise
    except ValueError:  # an integer of more digits than Python converts
        raise PipeplanError(f"{where}: a number has too many digits; not a pipeplan file") from None
    finally:
        if was_enabled:
            gc.enable()


#: Values a YAML document's aliases may add once expanded: far more than any cluster file
#: shares, far less than an alias bomb ("billion laughs") would build.
MAX_YAML_ALIAS_VALUES = 100_000


def _expanded_size(node: yaml.Node, memo: dict[int, float]) -> float:
    """Values under ``node`` with every alias expanded, counted without expanding them (each
    shared node once, in ``memo``); a node that contains itself counts as infinite."""
    key = id(node)
    if key in memo:
        return math.inf if memo[key] < 0 else memo[key]
    memo[key] = -1
    children = node.value if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)) else []
    flat = [c for pair in children for c in pair] if isinstance(node, yaml.MappingNode) else children
    memo[key] = 1 + sum(_expanded_size(c, memo) for c in flat)
    return memo[key]


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser where built
    """YAML's safe loader that refuses a key repeated in one mapping, a mapping or list used
    as a key, and aliases that add more than ``MAX_YAML_ALIAS_VALUES`` values once expanded
    (checked before anything is built)."""

    def construct_document(self, node):
        memo: dict[int, float] = {}
        if _expanded_size(node, memo) - len(memo) > MAX_YAML_ALIAS_VALUES:
            raise yaml.constructor.ConstructorError(
                None, None, f"its aliases expand to more than {MAX_YAML_ALIAS_VALUES:,} values", node.start_mark)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        """Each key once among the mapping's own (a merge ``<<: *anchor`` supplies defaults
        that its own keys override, as YAML means)."""
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(None, None, "a mapping or list used as a key",
                                                        key_node.start_mark)
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice in one mapping",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 reads 1e9 as a string; a cluster file means the number (YAML 1.2 reads it so)
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def parse_yaml(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as e:
        line = f":{e.problem_mark.line + 1}" if e.problem_mark is not None else ""
        raise PipeplanError(f"{where}{line}: not valid YAML ({e.problem or e.context})") from None
    except yaml.YAMLError as e:
        raise PipeplanError(f"{where}: not valid YAML ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise PipeplanError(f"{where}: nested too deeply; not a pipeplan file") from None
    except PipeplanError:
        raise
    except ValueError:  # an integer of more digits than Python converts
        raise PipeplanError(f"{where}: a number has too many digits; not a pipeplan file") from None


def load_json(path: str | Path, what: str = "file") -> Any:
    return parse_json(read_text(path, what), str(path))


def load_json_or_yaml(path: str | Path, what: str = "file") -> Any:
    """By extension: ``.json`` as JSON, anything else as YAML."""
    text = read_text(path, what)
    return parse_json(text, str(path)) if Path(path).suffix.lower() == ".json" else parse_yaml(text, str(path))
