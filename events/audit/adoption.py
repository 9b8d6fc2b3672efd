"""Verifying the log, and adopting unhashed rows: an operator's explicit, recorded act.

After the chain's seal every row carries its hash (events.core.chain); one without
fails ``llmgw verify`` and stops appends. If an operator knows such a row is
genuine (an older release, still running during an upgrade, appended it), they
adopt it: ``llmgw verify --adopt-unhashed --actor NAME --reason WHY`` records
who, why and when in ``event_chain_adoptions``, with the chain's value over
the row as it is now. Never by default: a forged row is exactly a row without
a hash, and the only thing that tells the two apart is someone who knows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import structlog
from sqlalchemy import Table, insert, select

from events.core.chain import VerifyReport, verify_chain
from events.database.connection import WRITE
from events.database.tables import ChainAdoptionRow
from events.storage.chain_rows import read_chain, read_seal
from events.storage.sql_log import SqlLog

log = structlog.get_logger("llmgw.catalog")

adoptions_table: Table = ChainAdoptionRow.__table__  # type: ignore[assignment]


class AdoptionRefused(Exception):
    """Adopting needs a name and a reason, and a chain that is otherwise whole."""


def adoptions(store: SqlLog) -> dict[int, str]:
    """The recorded adoptions: position -> the chain's value over the row when adopted."""
    with store.engine.connect() as conn:
        rows = conn.execute(select(adoptions_table.c.position, adoptions_table.c.hash)).all()
    return {int(position): str(value) for position, value in rows}


def verify_log(
    store: SqlLog, expect_head: str | None = None, *, adopting: bool = False
) -> VerifyReport:
    """The whole log checked against its chain, its seal and the recorded adoptions."""
    return verify_chain(
        read_chain(store.engine),
        read_seal(store.engine),
        expect_head,
        adoptions(store),
        adopting=adopting,
    )


def adopt_unhashed(
    store: SqlLog, *, actor: str, reason: str, now: datetime | None = None
) -> tuple[VerifyReport, tuple[int, ...]]:
    """Adopt every unhashed row after the seal, if the chain is otherwise whole.

    Returns the verification after adopting and the positions adopted. A chain
    broken anywhere else adopts nothing: adopting is vouching for rows, not
    silencing ``verify``.
    """
    if not actor.strip() or not reason.strip():
        raise AdoptionRefused(
            "adopting unhashed rows is recorded with who and why: give --actor NAME and "
            "--reason WHY"
        )
    found = verify_log(store, adopting=True)
    if not found.ok or not found.to_adopt:
        return found, ()
    _record(store, found.to_adopt, actor=actor, reason=reason, now=now or datetime.now(UTC))
    return verify_log(store), tuple(position for position, _ in found.to_adopt)


def _record(
    store: SqlLog,
    rows: Sequence[tuple[int, str]],
    *,
    actor: str,
    reason: str,
    now: datetime,
) -> None:
    with store.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
        conn.execute(
            insert(adoptions_table),
            [
                {"position": p, "hash": h, "actor": actor, "reason": reason, "adopted_at": now}
                for p, h in rows
            ],
        )
    for position, value in rows:
        log.warning(
            "catalog.chain_adopted", position=position, hash=value, actor=actor, reason=reason
        )
