"""Client tokens' shared allowances in the database: chunks granted and given back.

One call of a gateway (``POST /v1/gateway/allowances``) is one transaction: every row it
touches is locked (``SELECT ... FOR UPDATE`` on PostgreSQL, in (client, kind) order so
two calls never wait on each other in a circle; on SQLite the transaction is
``BEGIN IMMEDIATE``, the one writer), refilled to the database's clock, given back what
the gateway did not use, then granted what it asks. So a grant is atomic in the
database, whichever control-plane replica answers: two replicas can never grant the
same tokens. A missing row is made (a full bucket, an unused budget); a row whose limit
changed is resized (catalog.forms.allowance.Account.resize). Each draw's credit is lent,
renewed or returned in the same transaction (``Account.lend``); the credit's state is
kept in the row's ``slots`` JSON under ``"credit"``, and what each gateway id was granted
and has not given back (the most its give-back is taken for) under ``"held"`` (no column
of their own: a budget's slots are the numbered keys, and an older release reads only
those).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy import Connection, Engine, Table, bindparam, func, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite

from catalog.forms.allowance import MAX_AMOUNT, MAX_GATEWAY, MAX_HOLDERS, Account, Draw, Granted
from events.database.connection import WRITE, is_sqlite
from events.database.tables import AllowanceRow

log = structlog.get_logger("llmgw.catalog")

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


# The longest ``slots`` text read (a budget's 60 slots and a few credit lines are a few
# kilobytes); a longer one, like one that is not JSON or nests past the parser's depth,
# is read as no slots and no credit, and said.
MAX_SLOTS_TEXT = 1 << 20


def _account(r: Any) -> Account:
    """A row's account: its budget slots and its credit from the ``slots`` JSON. Whatever
    the text holds, it is read inside this net: a part that is not what this release
    writes (not JSON, too long or deep, a number out of range, not finite) is left out
    and the row named in the log, never an error of the call."""
    account = Account(int(r.size), float(r.level), float(r.at), r.period_s)
    text = r.slots or "{}"
    try:
        data = json.loads(text) if len(text) <= MAX_SLOTS_TEXT else None
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        log.warning("allowance.slots_unreadable", client=r.client, kind=r.kind, chars=len(text))
        return account
    for key, value in data.items():
        if (
            isinstance(key, str)
            and key.lstrip("-").isdigit()
            and len(key) <= 20
            and isinstance(value, int)
            and abs(value) <= MAX_AMOUNT
        ):
            account.slots[int(key)] = value
    _held(account, data.get("held"), r)
    credit = data.get("credit")
    if credit is None:
        return account
    pool = wanted = lent = None
    if isinstance(credit, dict):
        pool, wanted, lent = credit.get("pool"), _finite(credit.get("wanted")), credit.get("lent")
    if (
        not (isinstance(pool, int) and 0 <= pool <= MAX_AMOUNT)
        or wanted is None
        or (not isinstance(lent, dict))
    ):
        log.warning("allowance.credit_unreadable", client=r.client, kind=r.kind)
        return account
    account.pool, account.wanted = pool, wanted
    for holder, value in lent.items():
        line = value if isinstance(value, list) and len(value) == 2 else (None, None)
        held, until = _finite(line[0]), _finite(line[1])
        if isinstance(holder, str) and held is not None and until is not None:
            account.lent[holder] = [held, until]
        else:
            # (Left out: its line is lent again; what its holder owed is not charged.)
            log.warning("allowance.credit_line_unreadable", client=r.client, kind=r.kind)
    return account


def _held(account: Account, held: Any, r: Any) -> None:
    """The ``"held"`` part of a row: each gateway id's units granted and not given back.
    A part that is not what this release writes is left out (its gateway's give-back is
    then taken as nothing: the client granted less, never more) and the row named."""
    if held is None:
        return
    if not isinstance(held, dict):
        log.warning("allowance.held_unreadable", client=r.client, kind=r.kind)
        return
    skipped = 0
    for holder, value in held.items():
        line = value if isinstance(value, list) and len(value) == 2 else (None, None)
        units, at = _finite(line[0]), _finite(line[1])
        if (
            len(account.held) < MAX_HOLDERS
            and isinstance(holder, str)
            and len(holder) <= MAX_GATEWAY
            and units is not None
            and 0 < units <= MAX_AMOUNT
            and at is not None
        ):
            account.held[holder] = [units, at]
        else:
            skipped += 1
    if skipped:
        log.warning("allowance.held_line_unreadable", client=r.client, kind=r.kind, lines=skipped)


def _finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number a line can hold, else None (JSON
    read by Python takes ``NaN``, ``Infinity`` and integers past a float's range)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and abs(value) > MAX_AMOUNT * 1000:
        return None
    number = float(value)
    return number if math.isfinite(number) and abs(number) <= MAX_AMOUNT * 1000 else None


def _stored(account: Account) -> str:
    data: dict[str, Any] = {str(k): v for k, v in account.slots.items()}
    if account.pool:
        data["credit"] = {"pool": account.pool, "wanted": account.wanted, "lent": account.lent}
    if account.held:
        data["held"] = account.held
    return json.dumps(data)


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
            taken = account.take_back(d.gateway, d.give_back, now)
            if taken < d.give_back:
                log.warning(
                    "allowance.give_back_refused",
                    client=d.client,
                    kind=d.kind,
                    gateway=d.gateway,
                    given=d.give_back,
                    taken=taken,
                    reason="more than this gateway id was granted and has not given back",
                )
            granted = account.grant(d.want, now)
            account.hold(d.gateway, granted, now)
            credit, contested = account.lend(d.gateway, d.credit, d.reserve, now)
            answers.append(
                Granted(d.client, d.kind, granted, account.left(), account.size, credit, contested)
            )
        if accounts:
            # One statement for every account, executed with many parameter sets: a
            # statement each (up to MAX_DRAWS of them, under the write lock) cost a
            # round trip each on PostgreSQL, where psycopg pipelines an executemany.
            conn.execute(
                _STORE,
                [
                    {
                        "k_client": client,
                        "k_kind": kind,
                        "v_size": account.size,
                        "v_level": account.level,
                        "v_at": account.at,
                        "v_period_s": account.period_s,
                        "v_slots": _stored(account),
                    }
                    for (client, kind), account in accounts.items()
                ],
            )
    return answers


_STORE = (
    update(t)
    .where(t.c.client == bindparam("k_client"), t.c.kind == bindparam("k_kind"))
    .values(
        size=bindparam("v_size"),
        level=bindparam("v_level"),
        at=bindparam("v_at"),
        period_s=bindparam("v_period_s"),
        slots=bindparam("v_slots"),
    )
)


# Accounts one statement makes or locks at most (7 bound parameters each to make).
_PART = 1_000


def _locked(
    conn: Connection, keys: list[tuple[str, str]], asked: Sequence[Asked], now: float
) -> dict[tuple[str, str], Account]:
    """The accounts of ``keys``, made when missing, locked until the transaction ends."""
    if not keys:
        return {}
    limit = {(a.draw.client, a.draw.kind): a for a in asked}
    dialect: Any = sqlite if is_sqlite(conn.engine) else postgresql
    # Rows locked in code point order, the order ``keys`` is sorted in (PostgreSQL's
    # "C" collation; SQLite's own), whatever the database's collation: so every call,
    # whichever parts its keys fall in, takes its locks in one order.
    order = (
        (t.c.client, t.c.kind)
        if is_sqlite(conn.engine)
        else (t.c.client.collate("C"), t.c.kind.collate("C"))
    )
    found: list[Any] = []
    # In parts of ``_PART`` keys, in key order: a call's ``MAX_DRAWS`` accounts in one
    # statement were 70,000 bound parameters, past PostgreSQL's 65,535, and every such
    # call failed.
    for start in range(0, len(keys), _PART):
        part = keys[start : start + _PART]
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
            for client, kind in part
        ]
        # Rows as parameter sets, not as .values(rows): a statement of 7,000 bound
        # parameters was compiled anew for every part (most of the call's CPU), where
        # an executemany is compiled once, cached, and batched by SQLAlchemy.
        conn.execute(dialect.insert(t).on_conflict_do_nothing(), rows)
        found += conn.execute(
            select(t.c.client, t.c.kind, t.c.size, t.c.level, t.c.at, t.c.period_s, t.c.slots)
            .where(tuple_(t.c.client, t.c.kind).in_(part))
            .order_by(*order)
            .with_for_update()
        ).all()
    return {(r.client, r.kind): _account(r) for r in found}


def read_accounts(engine: Engine, client: str | None = None) -> dict[tuple[str, str], Account]:
    """Every account (or one client's), as stored (not refilled)."""
    query = select(t.c.client, t.c.kind, t.c.size, t.c.level, t.c.at, t.c.period_s, t.c.slots)
    if client is not None:
        query = query.where(t.c.client == client)
    with engine.connect() as conn:
        return {(r.client, r.kind): _account(r) for r in conn.execute(query)}
