"""Reading YAML or JSON documents from people and programs, within bounds.

Every document the control plane parses comes through here: the declared
``catalog.yaml``, a file given to ``llmgw add`` or ``llmgw nodes report``, and
the API's request bodies. Each is checked against ``Limits`` before anything
is built from it, because the parsers will happily build whatever the text
describes: a 400-byte YAML file of nine levels of nine-way aliases describes
387 million strings, and a few kilobytes of ``[[[[...`` describe a structure
deeper than Python can recurse through.

- **Anchors and aliases are refused.** No model definition or node report
  needs them, and they are how a small document becomes a huge one.
- **Size in bytes, nesting depth and node count are bounded**, and a refusal
  names the limit, the figure found and what to do.
- **A key written twice in one mapping is refused**, not silently dropped:
  in a reviewed configuration file that is a lost edit nobody sees.

YAML is checked on the parser's event stream, before it is composed into
nodes (libyaml keeps its own stack there, so even a document far too deep is
refused without recursing); JSON is checked on its brackets before
``json.loads`` recurses through them.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from catalog.errors import CatalogError

# libyaml's parser when PyYAML was built with it: several times faster on a
# catalog of thousands of models, and every command reads the declared file.
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, slots=True)
class Limits:
    """How large a document may be. A real definition is about seven levels deep
    (``models`` > list > model > ``profiles`` > list > profile > selector)."""

    max_bytes: int = 16 << 20
    max_depth: int = 32
    max_nodes: int = 1_000_000


# Files (the declared catalog may hold thousands of models) and request bodies
# (one command's worth; the byte cap is the server's --max-body-bytes).
FILE_LIMITS = Limits()
BODY_LIMITS = Limits(max_bytes=1 << 20, max_nodes=100_000)


class DocumentRefused(CatalogError):
    """A document refused before it was built: too large, too deep, or with aliases.

    ``limit`` names what was exceeded (``bytes``, ``depth``, ``nodes``,
    ``aliases``) so that callers can map it (a body too large is a 413).
    """

    def __init__(self, message: str, *, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


def read_file(path: Path, what: str, limits: Limits = FILE_LIMITS, *, regular: bool = False) -> Any:
    """Read and parse a file, never reading more than ``limits.max_bytes`` (+1) of it.

    ``regular``: for a file read by a server, which must never wait on it
    (``read_regular``); a command given ``/dev/stdin`` or ``<(...)`` may read a pipe."""
    if regular:
        raw = read_regular(path, what, limits.max_bytes)
    else:
        try:
            with path.open("rb") as f:
                raw = f.read(limits.max_bytes + 1)
        except OSError as exc:
            raise CatalogError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(raw) > limits.max_bytes:
            _too_large(str(path), limits)
        raise CatalogError(f"{path}: not UTF-8 text ({exc.reason})") from None
    return read_data(text, str(path), limits)


# What ``read_regular`` calls a file that is not a regular one.
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (a named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
)


def read_regular(path: Path, what: str, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of ``path``, which must be a regular file, read
    without ever blocking: opened ``O_NONBLOCK`` (opening a FIFO with no writer would
    wait for one for ever, and with it the thread that asked) and checked with
    ``fstat`` before a byte is read (a FIFO or a device such as ``/dev/zero`` never
    ends, a directory is not a document). A symbolic link is followed: a Kubernetes
    ConfigMap is a link to the file. ``CatalogError`` names the file and what to do."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise CatalogError(
                f"{path}: cannot read the {what}: it is {kind}, not a regular file, and "
                "reading it could wait or run for ever; put the file itself at this path"
            )
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    finally:
        os.close(fd)


class NotJSON(ValueError):
    """``read_data(json_only=True)`` was given text that is not JSON (it may be YAML)."""


def read_data(
    text: str, origin: str, limits: Limits = FILE_LIMITS, *, json_only: bool = False
) -> Any:
    """Parse YAML or JSON text within ``limits`` (JSON is YAML, but its own parser
    gives better errors). With ``json_only``, text that JSON's parser does not take
    raises ``NotJSON`` instead of being read as YAML, for a caller that must not pay
    YAML's price (it reads the text with ``json_only=False`` elsewhere)."""
    if len(text) > limits.max_bytes or len(text.encode("utf-8", "surrogatepass")) > (
        limits.max_bytes
    ):
        _too_large(origin, limits)
    stripped = text.lstrip()
    try:
        if stripped.startswith(("{", "[")):
            _check_json_depth(text, origin, limits)
            try:
                data = json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
            except json.JSONDecodeError as json_error:
                if json_only:
                    raise NotJSON(origin) from None
                # Flow-style YAML (`{name: x}`) is not JSON; if it is not YAML
                # either, the JSON parser's complaint is the more precise one.
                try:
                    return _read_yaml(text, origin, limits)
                except yaml.YAMLError:
                    raise json_error from None
            _check_json_nodes(data, origin, limits)
            return data
        if json_only:
            raise NotJSON(origin)
        return _read_yaml(text, origin, limits)
    except (yaml.YAMLError, json.JSONDecodeError, _DuplicateKey) as exc:
        raise CatalogError(f"{origin}: not valid YAML or JSON: {_short(exc)}") from None
    except RecursionError:  # pragma: no cover - the depth checks come first
        raise _deeper(origin, limits) from None


def read_json(text: str, origin: str, limits: Limits = FILE_LIMITS) -> Any:
    """Parse JSON text (what the log stores) within ``limits``; any failure is a
    ``CatalogError`` naming ``origin``, never a ``RecursionError``."""
    if len(text) > limits.max_bytes:
        _too_large(origin, limits)
    _check_json_depth(text, origin, limits)
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise CatalogError(f"{origin}: not valid JSON: {_short(exc)}") from None
    _check_json_nodes(data, origin, limits)
    return data


def _read_yaml(text: str, origin: str, limits: Limits) -> Any:
    _check_yaml_events(text, origin, limits)
    return yaml.load(text, Loader=_StrictLoader)


def _check_yaml_events(text: str, origin: str, limits: Limits) -> None:
    """Refuse aliases and anchors, and count depth and nodes, on the parser's events."""
    depth = nodes = 0
    for event in yaml.parse(text, Loader=_SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            line = event.start_mark.line + 1 if event.start_mark else "?"
            raise DocumentRefused(
                f"{origin}: line {line}: YAML anchors and aliases (&name, *name) are refused; "
                "no model definition or node report needs them: write each value out",
                limit="aliases",
            )
        if isinstance(event, yaml.ScalarEvent):
            nodes += 1
            _refuse_surrogates(event.value, origin)
        elif isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            nodes += 1
            depth += 1
            if depth > limits.max_depth:
                raise _deeper(origin, limits)
        elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            depth -= 1
        if nodes > limits.max_nodes:
            raise _more_nodes(origin, limits)


# Strings first (they may hold brackets), then the brackets themselves.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _check_json_depth(text: str, origin: str, limits: Limits) -> None:
    if text.count("[") + text.count("{") <= limits.max_depth:
        return  # too few brackets to nest that deep: the scan below could not refuse it
    depth = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limits.max_depth:
                raise _deeper(origin, limits)
        elif token in "]}":
            depth -= 1


def _check_json_nodes(data: Any, origin: str, limits: Limits) -> None:
    # Iterative: the depth is already bounded, but there is no need to recurse.
    nodes, pending = 0, [data]
    while pending:
        value = pending.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise _more_nodes(origin, limits)
        if isinstance(value, dict):
            pending.extend(value.values())
            nodes += len(value)  # the keys
            for key in value:
                _refuse_surrogates(key, origin)
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, str):
            _refuse_surrogates(value, origin)


# A JSON escape (\ud800) or a YAML one can spell half of a UTF-16 pair alone: a
# Python string then holds a code point that is not a character, which no UTF-8
# encoder accepts. Stored, it would break every later answer that prints the model.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_surrogates(text: str, origin: str) -> None:
    found = _SURROGATE.search(text)
    if found is not None:
        raise CatalogError(
            f"{origin}: the text {text[:40].encode('utf-8', 'backslashreplace').decode()!r} "
            f"holds a lone surrogate (\\u{ord(found.group()):04x}), which is not a "
            "character; write the character itself, or both halves of its UTF-16 pair"
        )


def _too_large(origin: str, limits: Limits) -> None:
    raise DocumentRefused(
        f"{origin}: larger than {limits.max_bytes} bytes, the most that is read; "
        "split it into smaller files or requests",
        limit="bytes",
    )


def _deeper(origin: str, limits: Limits) -> DocumentRefused:
    return DocumentRefused(
        f"{origin}: nested deeper than {limits.max_depth} levels, the most that is read "
        "(a model definition needs about 7); flatten the document",
        limit="depth",
    )


def _more_nodes(origin: str, limits: Limits) -> DocumentRefused:
    return DocumentRefused(
        f"{origin}: holds more than {limits.max_nodes} values, the most that is read; "
        "split it into smaller files or requests",
        limit="nodes",
    )


def _short(exc: Exception, limit: int = 500) -> str:
    # PyYAML names text it was handed as a string "<unicode string>"; the message
    # already starts with the document's own name, so only the place is kept.
    text = str(exc).replace('in "<unicode string>", ', "at ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _StrictLoader(_SafeLoader):  # type: ignore[valid-type,misc]  # chosen at import
    """A YAML loader that refuses a key written twice in one mapping."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if not isinstance(key, Hashable):
            continue  # construct_mapping refuses it, as a YAML error
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is written twice in one mapping", key_node.start_mark
            )
        seen.add(key)
    mapping: dict[Any, Any] = loader.construct_mapping(node)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class _DuplicateKey(ValueError):
    pass


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON's counterpart of ``_StrictLoader``: a key written twice is refused, not dropped."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} is written twice in one object")
        out[key] = value
    return out
