"""The autoscaler's storage: windows in, rounds and events out. The I/O edge of ``autoscale``.

Every reader skips a row it cannot read and names it (``autoscale.row_skipped``:
table, key, reason), as the catalog's and the scheduler's readers do: SQLite keeps
whatever it is given, and one bad row must not stop the autoscaler, a history or a
backtest. Rows are fetched unconverted and decoded one by one for that reason.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import structlog
from sqlalchemy import Connection, Engine, Select, Table, delete, func, insert, select, type_coerce
from sqlalchemy.types import NullType

from autoscale.backtest import Recorded, Tick
from autoscale.decide import Limits
from autoscale.policy import Policy, PolicyError, parse_policy
from autoscale.rounds import ModelState
from autoscale.tables import DocumentRow, EventRow, ReportRow, RoundRow, WindowRow, table
from autoscale.windows import ReplicaLoad, Window

log = structlog.get_logger("llmgw.autoscale")

reports_t = table(ReportRow)
windows_t = table(WindowRow)
rounds_t = table(RoundRow)
documents_t = table(DocumentRow)
events_t = table(EventRow)

DECISION = "autoscale.decision"
HOLD = "autoscale.hold"
CAPACITY = "autoscale.capacity"
EVENT_TYPES = (DECISION, HOLD, CAPACITY)
# A stored JSON body larger than this is not one we wrote.
MAX_BODY = 1 << 20

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoredEvent:
    position: int
    type: str
    model: str
    recorded_at: datetime
    actor: str
    body: Mapping[str, Any]


class Unreadable(ValueError):
    pass


def _raw(t: Table, *where: Any) -> Select[Any]:
    labels: list[Any] = [type_coerce(c, NullType()).label(c.name) for c in t.c]
    return select(*labels).where(*where)


def _time(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, str) and len(value) <= 64:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    raise Unreadable(f"{str(value)[:40]!r} is not a time")


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Unreadable(f"{name} {str(value)[:40]!r} is not a whole number")
    return value


def _float(value: Any, name: str, *, null: bool = False) -> Any:
    if value is None and null:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Unreadable(f"{name} {str(value)[:40]!r} is not a finite number")
    return float(value)


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise Unreadable(f"{name} is not text")
    return value


def _json(value: Any, name: str) -> Any:
    text = _text(value, name)
    if len(text) > MAX_BODY:
        raise Unreadable(f"{name} is {len(text)} characters, more than this release writes")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Unreadable(f"{name} is not JSON ({exc})") from None
    except RecursionError:
        # (Nested deeper than the parser goes: not one this release writes.)
        raise Unreadable(f"{name} is JSON nested deeper than this release writes") from None


def _each(
    rows: Iterable[Mapping[Any, Any]], name: str, key: str, decode: Callable[[Any], T]
) -> list[T]:
    out = []
    for row in rows:
        try:
            out.append(decode(row))
        except (
            Unreadable,
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            ArithmeticError,
            RecursionError,
        ) as exc:
            log.warning(
                "autoscale.row_skipped", table=name, key=str(row.get(key))[:60], reason=str(exc)
            )
    return out


def digest_of(document: Any) -> tuple[str, str]:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest(), text


def _window(row: Mapping[str, Any], *, with_replicas: bool = False) -> Window:
    """A stored window; its per-replica loads only when asked (a decision reads their count)."""
    replicas_raw = _json(row["replicas"], "replicas") if with_replicas else {}
    if not isinstance(replicas_raw, dict):
        raise Unreadable("replicas is not a JSON object")
    count = _int(row["replica_count"], "replica_count")
    if count < 0:
        raise Unreadable(f"replica_count {count} is negative")
    return Window(
        gateway=_text(row["gateway"], "gateway"),
        model=_text(row["model"], "model"),
        start=_time(row["start"]),
        end=_time(row["end"]),
        received_at=_time(row["received_at"]),
        requests=_int(row["requests"], "requests"),
        errors=_int(row["errors"], "errors"),
        waiting=_int(row["waiting"], "waiting"),
        inflight_mean=_float(row["inflight_mean"], "inflight_mean"),
        inflight_max=_int(row["inflight_max"], "inflight_max"),
        queue_wait_p99_s=_float(row["queue_wait_p99_s"], "queue_wait_p99_s", null=True),
        ttft_p99_s=_float(row["ttft_p99_s"], "ttft_p99_s", null=True),
        tpot_p99_s=_float(row["tpot_p99_s"], "tpot_p99_s", null=True),
        replicas={
            str(k): ReplicaLoad(
                _int(v["requests"], "requests"),
                _float(v["inflight_mean"], "inflight_mean"),
                _int(v["inflight_max"], "inflight_max"),
            )
            for k, v in replicas_raw.items()
        },
        replica_count=count,
    )


def _event(row: Mapping[str, Any]) -> StoredEvent:
    body = _json(row["body"], "body")
    if not isinstance(body, dict):
        raise Unreadable("body is not a JSON object")
    kind = _text(row["type"], "type")
    if kind not in EVENT_TYPES:
        raise Unreadable(f"type {kind[:40]!r} is not one this release writes")
    return StoredEvent(
        position=_int(row["position"], "position"),
        type=kind,
        model=_text(row["model"], "model"),
        recorded_at=_time(row["recorded_at"]),
        actor=_text(row["actor"], "actor"),
        body=body,
    )


class AutoscaleStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- signals -----------------------------------------------------------------------

    def record_signals(self, gateway: str, windows: Sequence[Window], received_at: datetime) -> int:
        """One gateway's report, in one transaction: its row and one row per window."""
        with self.engine.begin() as conn:
            report_id = conn.execute(
                insert(reports_t).values(
                    gateway=gateway, received_at=received_at, windows=len(windows)
                )
            ).inserted_primary_key
            assert report_id is not None
            report_id = report_id[0]
            if windows:
                conn.execute(
                    insert(windows_t),
                    [
                        {
                            "report_id": report_id,
                            "gateway": gateway,
                            "model": w.model,
                            "start": w.start,
                            "end": w.end,
                            "received_at": received_at,
                            "requests": w.requests,
                            "errors": w.errors,
                            "waiting": w.waiting,
                            "inflight_mean": w.inflight_mean,
                            "inflight_max": w.inflight_max,
                            "queue_wait_p99_s": w.queue_wait_p99_s,
                            "ttft_p99_s": w.ttft_p99_s,
                            "tpot_p99_s": w.tpot_p99_s,
                            "replica_count": len(w.replicas),
                            "replicas": json.dumps(
                                {
                                    k: {
                                        "requests": r.requests,
                                        "inflight_mean": r.inflight_mean,
                                        "inflight_max": r.inflight_max,
                                    }
                                    for k, r in w.replicas.items()
                                },
                                sort_keys=True,
                            ),
                        }
                        for w in windows
                    ],
                )
        return int(report_id)

    def windows(self, after: datetime, upto: datetime, model: str | None = None) -> list[Window]:
        """Windows received in ``(after, upto]``, oldest first."""
        where = [windows_t.c.received_at > after, windows_t.c.received_at <= upto]
        if model is not None:
            where.append(windows_t.c.model == model)
        with self.engine.connect() as conn:
            rows = conn.execute(_raw(windows_t, *where).order_by(windows_t.c.id)).mappings().all()
        return _each(rows, "autoscale_windows", "id", _window)

    def heard(self, after: datetime, upto: datetime) -> list[datetime]:
        """When any gateway reported in ``(after, upto]``."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                _raw(reports_t, reports_t.c.received_at > after, reports_t.c.received_at <= upto)
            ).mappings()
            return _each(rows, "autoscale_reports", "id", lambda r: _time(r["received_at"]))

    def posters(self, after: datetime, upto: datetime) -> list[str]:
        """The gateways (``signals.identity``) that reported in ``(after, upto]``, sorted.
        ``upto`` (now): a row stamped later (the clock set back since, or a hostile row)
        would count its gateway live until then, every gateway's deal the smaller."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(reports_t.c.gateway)
                .where(reports_t.c.received_at > after, reports_t.c.received_at <= upto)
                .distinct()
            ).all()
        return sorted({r[0] for r in rows if isinstance(r[0], str)})

    def waiting_since(self, after: datetime) -> set[str]:
        """Models a gateway held a request for (no ready replica) in a window received since."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(windows_t.c.model)
                .where(windows_t.c.received_at > after, windows_t.c.waiting > 0)
                .distinct()
            ).all()
        return {r[0] for r in rows if isinstance(r[0], str)}

    # -- rounds ------------------------------------------------------------------------

    def record_round(
        self,
        conn: Connection,
        at: datetime,
        policy: Policy,
        limits: Mapping[str, Limits],
        *,
        changes: int,
        limits_digest: tuple[str, str] | None = None,
    ) -> None:
        policy_digest, policy_text = digest_of(policy.to_json())
        limits_key, limits_text = limits_digest or digest_of(
            {m: lim.to_json() for m, lim in limits.items()}
        )
        for digest, kind, body in (
            (policy_digest, "policy", policy_text),
            (limits_key, "limits", limits_text),
        ):
            found = conn.execute(
                select(documents_t.c.digest).where(documents_t.c.digest == digest)
            ).first()
            if found is None:
                conn.execute(insert(documents_t).values(digest=digest, kind=kind, body=body))
        conn.execute(
            insert(rounds_t).values(
                at=at, policy_digest=policy_digest, limits_digest=limits_key, changes=changes
            )
        )

    def ticks(self, after: datetime, upto: datetime) -> list[Tick]:
        """The recorded rounds in ``[after, upto]``, with their policies and limits."""
        with self.engine.connect() as conn:
            rows = (
                conn.execute(
                    _raw(rounds_t, rounds_t.c.at >= after, rounds_t.c.at <= upto).order_by(
                        rounds_t.c.id
                    )
                )
                .mappings()
                .all()
            )
            wanted = {r["policy_digest"] for r in rows} | {r["limits_digest"] for r in rows}
            docs = {
                r["digest"]: r
                for r in conn.execute(
                    _raw(documents_t, documents_t.c.digest.in_([str(w) for w in wanted]))
                ).mappings()
            }
        policies: dict[str, Policy] = {}
        limits: dict[str, dict[str, Limits]] = {}

        def decode(row: Mapping[str, Any]) -> Tick:
            p, lim = str(row["policy_digest"]), str(row["limits_digest"])
            if p not in policies:
                if p not in docs:
                    raise Unreadable(f"its policy {p[:12]} is not stored")
                try:
                    policies[p] = parse_policy(_json(docs[p]["body"], "policy"), "stored policy")
                except PolicyError as exc:
                    raise Unreadable(str(exc)) from None
            if lim not in limits:
                if lim not in docs:
                    raise Unreadable(f"its limits {lim[:12]} are not stored")
                body = _json(docs[lim]["body"], "limits")
                limits[lim] = {str(m): Limits.from_json(v) for m, v in body.items()}
            return Tick(_time(row["at"]), policies[p], limits[lim])

        return _each(rows, "autoscale_rounds", "id", decode)

    def prune(self, before: datetime) -> int:
        """Delete windows, reports and rounds older than ``before`` (the retention)."""
        with self.engine.begin() as conn:
            gone = 0
            for t, column in (
                (windows_t, windows_t.c.received_at),
                (reports_t, reports_t.c.received_at),
                (rounds_t, rounds_t.c.at),
            ):
                gone += conn.execute(delete(t).where(column < before)).rowcount or 0
        return gone

    # -- events ------------------------------------------------------------------------

    def append(
        self,
        conn: Connection,
        kind: str,
        model: str,
        body: Mapping[str, Any],
        *,
        at: datetime,
        actor: str = "autoscaler",
    ) -> None:
        conn.execute(
            insert(events_t).values(
                type=kind,
                model=model,
                recorded_at=at,
                actor=actor,
                body=json.dumps(body, sort_keys=True, allow_nan=False),
            )
        )

    def events(
        self,
        *,
        model: str | None = None,
        kinds: Sequence[str] = (DECISION, HOLD),
        after: datetime | None = None,
        upto: datetime | None = None,
        limit: int | None = None,
    ) -> list[StoredEvent]:
        """Events oldest first (the last ``limit`` of them, when given)."""
        where: list[Any] = [events_t.c.type.in_(list(kinds))]
        if model is not None:
            where.append(events_t.c.model == model)
        if after is not None:
            where.append(events_t.c.recorded_at >= after)
        if upto is not None:
            where.append(events_t.c.recorded_at <= upto)
        query = _raw(events_t, *where).order_by(events_t.c.position.desc())
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return list(reversed(_each(rows, "autoscale_events", "position", _event)))

    def latest(self, kind: str, upto: datetime | None = None) -> dict[str, StoredEvent]:
        """Each model's last event of ``kind`` (at or before ``upto``)."""
        where: list[Any] = [events_t.c.type == kind]
        if upto is not None:
            where.append(events_t.c.recorded_at <= upto)
        last = (
            select(func.max(events_t.c.position).label("position"))
            .where(*where)
            .group_by(events_t.c.model)
        )
        with self.engine.connect() as conn:
            rows = (
                conn.execute(_raw(events_t, events_t.c.position.in_(last.scalar_subquery())))
                .mappings()
                .all()
            )
        return {e.model: e for e in _each(rows, "autoscale_events", "position", _event)}

    def state(self, upto: datetime | None = None) -> dict[str, ModelState]:
        """What the recorded decisions leave: each model's wanted count and when it changed."""
        out = {}
        for model, e in self.latest(DECISION, upto).items():
            wanted = e.body.get("wanted")
            if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted >= 0:
                out[model] = ModelState(wanted, e.recorded_at)
            else:
                log.warning(
                    "autoscale.row_skipped",
                    table="autoscale_events",
                    key=str(e.position),
                    reason="its wanted count is not a whole number",
                )
        return out

    def recorded(self, after: datetime, upto: datetime) -> list[Recorded]:
        out = []
        for e in self.events(kinds=(DECISION,), after=after, upto=upto):
            try:
                out.append(
                    Recorded(
                        e.model,
                        e.recorded_at,
                        int(e.body["current"]),
                        int(e.body["wanted"]),
                        str(e.body["code"]),
                    )
                )
            except (KeyError, TypeError, ValueError):
                log.warning(
                    "autoscale.row_skipped",
                    table="autoscale_events",
                    key=str(e.position),
                    reason="a decision without current, wanted and code",
                )
        return out

    def capacities(self) -> dict[tuple[str, str], float]:
        """The last measured capacity of each (model, profile)."""
        out: dict[tuple[str, str], float] = {}
        for e in self.events(kinds=(CAPACITY,)):
            value, profile = e.body.get("capacity"), e.body.get("profile")
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                out[(e.model, str(profile))] = float(value)
        return out

    def capacity_position(self) -> int:
        """The position of the last capacity event (0: none): what the limits cache keys on."""
        with self.engine.connect() as conn:
            found = conn.execute(
                select(func.max(events_t.c.position)).where(events_t.c.type == CAPACITY)
            ).scalar()
        return int(found or 0)
