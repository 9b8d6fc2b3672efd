"""Reading scheduler rows so that one bad row is skipped and named, never a crash.

Like catalog replay, every reader of a scheduler table goes through here: a
row whose values are not what the table promises (SQLite keeps whatever it is
given; anyone with write access can store anything) is left out, and a
``scheduler.row_skipped`` event names its table, key and reason. `llmgw nodes
list`, `placements`, `explain`, the API and the daemon's rounds then go on
with the rows that can be read.

Rows are fetched with no type processing (``raw``), so that a value the
driver or a column type would choke on (a time that is not a time, a boolean
that is text) fails in its own row's decode, not in the fetch of all rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import structlog
from sqlalchemy import Connection, Select, Table, select, type_coerce
from sqlalchemy.types import NullType

from catalog.reading.documents import Limits, read_json
from events.database.tables import UTCDateTime
from scheduler.persistence.record_format import UnreadableRow

log = structlog.get_logger("llmgw.scheduler")

T = TypeVar("T")
Row = Mapping[str, Any]
# What a fetched row may be: a mapping of column names (RowMapping is one).
AnyRow = Mapping[Any, Any]

# A recorded round's JSON holds a whole inventory (a node is some 200 bytes);
# a list of node names or a node's labels is small: more than these is not one.
STORED_LIMITS = Limits(max_bytes=64 << 20, max_depth=32, max_nodes=4_000_000)
# A recorded round's columns in full hold every placement and every replica's state: at
# issue 42's 200,000 replicas some 60 MB and 5,000,000 values in its placements alone,
# past ``STORED_LIMITS`` (a full round of 170,000 replicas was unreadable: "holds more
# than 4000000 values"). Bounded all the same, at four times that.
ROUND_LIMITS = Limits(max_bytes=256 << 20, max_depth=32, max_nodes=20_000_000)
SMALL_LIMITS = Limits(max_bytes=1 << 20, max_depth=32, max_nodes=100_000)


def raw(table: Table, *columns: str) -> Select[Any]:
    """A select of ``table``'s columns (all, or those named) as stored, unconverted."""
    chosen = [table.c[name] for name in columns] if columns else list(table.c)
    labels: list[Any] = [type_coerce(c, NullType()).label(c.name) for c in chosen]
    return select(*labels)


def decode_rows(
    conn: Connection,
    query: Select[Any],
    *,
    table: str,
    key: Sequence[str],
    decode: Callable[[Row], T],
    times: Iterable[str] = (),
    nullable_times: Iterable[str] = (),
) -> list[T]:
    """Each row of ``query`` decoded, or skipped and named; ``times`` are read as UTC times."""
    return decode_each(
        conn,
        conn.execute(query).mappings().all(),
        table=table,
        key=key,
        decode=decode,
        times=times,
        nullable_times=nullable_times,
    )


def decode_each(
    conn: Connection,
    rows: Iterable[AnyRow],
    *,
    table: str,
    key: Sequence[str],
    decode: Callable[[Row], T],
    times: Iterable[str] = (),
    nullable_times: Iterable[str] = (),
) -> list[T]:
    """``decode_rows`` of rows already fetched with ``raw``."""
    convert = _time_reader(conn)
    out: list[T] = []
    for row in rows:
        decoded = _decode(
            row,
            convert,
            table=table,
            key=key,
            decode=decode,
            must=tuple(times),
            may=tuple(nullable_times),
        )
        if not isinstance(decoded, Unreadable):
            out.append(decoded)
    return out


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A row left out, and why: the reason ``scheduler.row_skipped`` gives."""

    key: tuple[Any, ...]
    reason: str


def decode_one(
    conn: Connection,
    row: AnyRow,
    *,
    table: str,
    key: Sequence[str],
    decode: Callable[[Row], T],
    times: Iterable[str] = (),
    nullable_times: Iterable[str] = (),
) -> T | Unreadable:
    """One row fetched with ``raw``, decoded; or, named as ``decode_rows`` names it, why
    not. For a reader that must say more than "not found" of a row it was asked for
    (``explain --round N``), or must step past it (a follower of the placement log)."""
    return _decode(
        row,
        _time_reader(conn),
        table=table,
        key=key,
        decode=decode,
        must=tuple(times),
        may=tuple(nullable_times),
    )


def _decode(
    row: AnyRow,
    convert: Callable[[Any, str], datetime],
    *,
    table: str,
    key: Sequence[str],
    decode: Callable[[Row], T],
    must: tuple[str, ...],
    may: tuple[str, ...],
) -> T | Unreadable:
    try:
        values = dict(row)
        for name in (*must, *may):
            if values[name] is None and name in may:
                continue
            values[name] = convert(values[name], name)
        return decode(values)
    except Exception as exc:
        shown = tuple(row[k] for k in key)
        skipped(table, shown, exc)
        return Unreadable(shown, reason_of(exc))


def skipped(table: str, key: Any, exc: BaseException) -> None:
    """Name a row that is left out (one event per row, stable fields)."""
    log.warning("scheduler.row_skipped", table=table, key=_shown(key), reason=reason_of(exc))


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, UnreadableRow):
        return str(exc)
    text = str(exc)
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def json_column(value: Any, column: str, limits: Limits = SMALL_LIMITS) -> Any:
    """A JSON column's value, within bounds: never a RecursionError, never unbounded."""
    if isinstance(value, bytes):
        raise UnreadableRow(f"{column} is bytes, not text")
    if type(value) is not str:
        raise UnreadableRow(f"{column} {_shown(value)} is not JSON text")
    return read_json(value, column, limits)


def _time_reader(conn: Connection) -> Callable[[Any, str], datetime]:
    dialect = conn.dialect
    process = UTCDateTime().dialect_impl(dialect).result_processor(dialect, None)

    def read(value: Any, name: str) -> datetime:
        try:
            result = process(value) if process is not None else value
        except Exception as exc:
            raise UnreadableRow(
                f"{name} {_shown(value)} is not a time ({type(exc).__name__})"
            ) from None
        if not isinstance(result, datetime) or result.tzinfo is None:
            raise UnreadableRow(f"{name} {_shown(value)} is not a time")
        return result

    return read


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
