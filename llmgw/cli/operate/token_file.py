"""The auth file's ``[[tokens]]`` entries: listed, appended to and revoked in place.

Edits are made on the text, one ``[[tokens]]`` block at a time, so the operator's
comments and the rest of the file stay as written; the result is parsed again
before it replaces the file, so an edit never leaves a file the server refuses.
The server reads the file when it starts: a change applies at its next start.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from llmgw.api.guards.tokens import TokenEntry
from llmgw.api.runtime.settings import ApiSettings, SettingsError

_BLOCK = re.compile(r"^\s*\[\[tokens\]\]\s*(#.*)?$", re.MULTILINE)


def entries(path: Path) -> list[TokenEntry]:
    """The file's tokens, checked as the server checks them."""
    if not path.exists():
        return []
    return list(ApiSettings.load(path, env={}).tokens)


def append(path: Path, entry: TokenEntry) -> None:
    names = {e.name for e in entries(path)}
    if entry.name in names:
        raise SettingsError(
            f"{path}: a token named {entry.name!r} is already configured; revoke it first "
            f"(`llmgw token revoke {entry.name}`) or choose another name"
        )
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if text and not text.endswith("\n"):
        text += "\n"
    _replace(path, text + ("\n" if text else "") + entry.to_toml() + "\n")


def revoke(path: Path, name: str) -> int:
    """Drop every ``[[tokens]]`` block named ``name``; how many were dropped."""
    if not path.exists():
        raise SettingsError(f"{path}: no such auth file")
    text = path.read_text(encoding="utf-8")
    starts = [m.start() for m in _BLOCK.finditer(text)]
    if not starts:
        return 0
    kept = [text[: starts[0]]]
    dropped = 0
    for begin, end in zip(starts, [*starts[1:], len(text)], strict=True):
        block = text[begin:end]
        try:
            data = tomllib.loads(block)
        except tomllib.TOMLDecodeError:
            kept.append(block)  # not ours to judge here; the check below will name it
            continue
        if [t.get("name") for t in data.get("tokens", [])] == [name]:
            dropped += 1
        else:
            kept.append(block)
    if dropped:
        _replace(path, "".join(kept).lstrip("\n"))
    return dropped


def _replace(path: Path, text: str) -> None:
    """Write ``text`` only if the server would accept it, atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        tmp.chmod(0o600)  # hashes only, but nobody else needs to read the list of holders
        ApiSettings.load(tmp, env={})
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
