"""Client tokens' shared allowances in the database: chunks granted and given back.

One call of a gateway (``POST /v1/gateway/allowances``) is one transaction: every row it
touches is locked (``SELECT ... FOR UPDATE`` on PostgreSQL, in (client, kind) order so
two calls never wait on each other in a circle; on SQLite the transaction is
``BEGIN IMMEDIATE``, the one writer), refilled to the database's clock, given back what
the gateway did not use, then granted what it asks. So a grant is atomic in the
database, whichever control-plane replica answers: two replicas can never grant the
same tokens. A missing row is made (a full bucket, an unused budget); a row whose limit
changed is resized (catalog.forms.allowance.Account.resize).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Table, func, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite

from catalog.forms.allowance import Account, Draw, Granted
from events.database.connection import WRITE, is_sqlite
from events.database.tables import AllowanceRow

t: Table = AllowanceRow.__table__  # type: ignore[assignment]  # declarative tables are Tables


@dataclass(frozen=True, slots=True)
class Asked:
    """A draw and its limit as the control plane's book has it now (None: no such
    limit, or no such client: nothing is granted, and the answer says so)."""

    draw: Draw
    size: int | None
    period_s: int | None = None


def _now(conn: Connection) -> float:
    if conn.dialect.name == "postgresql":
        return float(
            conn.execute(select(func.extract("epoch", func.clock_timestamp()))).scalar_one()
        )
    return time.time()


def _slots(text: str) -> dict[int, int]:
    try:
        data = json.loads(text or "{}")
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    out: dict[int, int] = {}
    for key, value in data.items():
        if isinstance(key, str) and key.lstrip("-").isdigit() and isinstance(value, int):
            out[int(key)] = value
    return out


def exchange(engine: Engine, asked: Sequence[Asked]) -> list[Granted]:
    """Give back and grant every draw of one call, in one transaction; the answers in
    the order asked."""
    keys = sorted({(a.draw.client, a.draw.kind) for a in asked if a.size is not None})
    answers: list[Granted] = []
    with engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
        now = _now(conn)
        accounts = _locked(conn, keys, asked, now)
        for a in asked:
            d = a.draw
            if a.size is None:
                answers.append(Granted(d.client, d.kind, 0, 0, None))
                continue
            account = accounts[(d.client, d.kind)]
            account.resize(a.size, a.period_s, now)
            account.give_back(d.give_back, now)
            granted = account.grant(d.want, now)
            answers.append(Granted(d.client, d.kind, granted, account.left(), account.size))
        for (client, kind), account in accounts.items():
            conn.execute(
                update(t)
                .where(t.c.client == client, t.c.kind == kind)
                .values(
                    size=account.size,
                    level=account.level,
                    at=account.at,
                    period_s=account.period_s,
                    slots=json.dumps({str(k): v for k, v in account.slots.items()}),
                )
            )
    return answers


def _locked(
    conn: Connection, keys: list[tuple[str, str]], asked: Sequence[Asked], now: float
) -> dict[tuple[str, str], Account]:
    """The accounts of ``keys``, made when missing, locked until the transaction ends."""
    if not keys:
        return {}
    limit = {(a.draw.client, a.draw.kind): a for a in asked}
    rows = [
        {
            "client": client,
            "kind": kind,
            "size": limit[(client, kind)].size,
            "level": float(limit[(client, kind)].size or 0),
            "at": now,
            "period_s": limit[(client, kind)].period_s,
            "slots": "{}",
        }
        for client, kind in keys
    ]
    dialect: Any = sqlite if is_sqlite(conn.engine) else postgresql
    conn.execute(dialect.insert(t).values(rows).on_conflict_do_nothing())
    found = conn.execute(
        select(t.c.client, t.c.kind, t.c.size, t.c.level, t.c.at, t.c.period_s, t.c.slots)
        .where(tuple_(t.c.client, t.c.kind).in_(keys))
        .order_by(t.c.client, t.c.kind)
        .with_for_update()
    ).all()
    return {
        (r.client, r.kind): Account(
            int(r.size), float(r.level), float(r.at), r.period_s, _slots(r.slots)
        )
        for r in found
    }


def read_accounts(engine: Engine, client: str | None = None) -> dict[tuple[str, str], Account]:
    """Every account (or one client's), as stored (not refilled)."""
    query = select(t.c.client, t.c.kind, t.c.size, t.c.level, t.c.at, t.c.period_s, t.c.slots)
    if client is not None:
        query = query.where(t.c.client == client)
    with engine.connect() as conn:
        return {
            (r.client, r.kind): Account(
                int(r.size), float(r.level), float(r.at), r.period_s, _slots(r.slots)
            )
            for r in conn.execute(query)
        }
