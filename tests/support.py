"""Small builders shared by the tests: model definitions and raw event rows."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import yaml
from sqlalchemy import Engine, insert, select

from catalog import Model, parse_model
from events.core.chain import GENESIS, event_hash
from events.storage.chain_rows import seal_table
from events.storage.chain_rows import t as events_table


class NotUtf8(bytes):
    """Bytes to store in a SQLite TEXT column as they are (``CAST(? AS TEXT)``): text
    whose bytes are not UTF-8, which only a hand-made row can hold (events.database.sqlite_text)."""


def raw_value_mark(column: str, value: Any) -> str:
    """The placeholder for ``value`` in a raw SQLite INSERT (see ``NotUtf8``)."""
    return f"CAST(:{column} AS TEXT)" if isinstance(value, NotUtf8) else f":{column}"


def not_utf8(data: bytes = b"") -> NotUtf8:
    """``data`` made undecodable: a lone continuation byte cannot start UTF-8."""
    return NotUtf8(b"\x80" + data)


def definition(
    name: str,
    *,
    aliases: list[str] | None = None,
    fallbacks: list[str] | None = None,
    gpu_class: str = "A100",
    tp: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    """A small valid runtime definition, as an operator would write it."""
    data: dict[str, Any] = {
        "name": name,
        "source": f"org/{name}",
        "profiles": [{"name": "main", "gpu_class": gpu_class, "tp": tp}],
    }
    if aliases:
        data["aliases"] = aliases
    if fallbacks:
        data["fallbacks"] = fallbacks
    data.update(extra)
    return data


def model(name: str, **kwargs: Any) -> Model:
    return parse_model(definition(name, **kwargs))


def insert_raw_event(
    engine: Engine,
    position: int,
    *,
    type: str = "model.added",
    payload: str | dict[str, Any] | list[Any],
    schema_version: int = 1,
    model: str | None = None,
    hashed: bool = True,
) -> str:
    """Write a row straight into the table, bypassing every check but the chain: what
    an old release or a bug could have left behind. ``hashed=False`` leaves the hash
    columns NULL, as a row forged with SQL (or from before the chain) has them. A str
    ``payload`` is stored as it is (torn JSON included), anything else as its JSON."""
    event_id = uuid.uuid4().hex
    row: dict[str, Any] = {
        "position": position,
        "event_id": event_id,
        "command_id": event_id,
        "type": type,
        "schema_version": schema_version,
        "model": model,
        "payload": payload if isinstance(payload, str) else json.dumps(payload),
        "actor": "test",
        "reason": "",
        "recorded_at": datetime.now(UTC),
    }
    with engine.begin() as conn:
        if hashed:
            prev = conn.execute(
                select(events_table.c.hash).where(events_table.c.position == position - 1)
            ).scalar()
            if prev is None:
                prev = conn.execute(select(seal_table.c.hash)).scalar() or GENESIS
            row["prev_hash"] = prev
            row["hash"] = event_hash(prev, *(row[c] for c in _HASHED))
        conn.execute(insert(events_table), row)
    return event_id


_HASHED = (
    "position",
    "event_id",
    "command_id",
    "type",
    "schema_version",
    "model",
    "payload",
    "actor",
    "reason",
    "recorded_at",
)


class _PlainDumper(yaml.SafeDumper):
    """Writes a value shared by two places twice, as a person would, not as an alias
    (which every reader refuses: catalog.reading.documents)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_PlainDumper)
