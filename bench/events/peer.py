"""The peer: the ``eventsourcing`` library storing and reading the same events, side by side.

Both stores are SQLite files with the same settings: WAL and
``synchronous=FULL`` (the library turns WAL on itself and leaves
``synchronous`` at SQLite's default, so it is set here on each of its
connections). The events are the generated log's own rows: each model is an
aggregate (``originator_id`` from its name), each event its next version, the
type the topic and the payload text the state.

Each pair is measured in the same run, interleaved, best of the repeats.
"""

from __future__ import annotations

import json
import shutil
import uuid
from functools import partial
from pathlib import Path
from typing import Any

from bench.shared import common, gen
from events.core.types import NewEvent
from events.database.connection import make_engine
from events.database.migrate import upgrade
from events.read.replay import replay
from events.storage.backends import open_log

EVENTS = 100_000
QUICK_EVENTS = 10_000
SINGLES = 300
QUICK_SINGLES = 60
BULK = 1_000


def peer_recorder(path: Path, synchronous: str = "FULL") -> Any:
    """An ``eventsourcing`` application recorder on ``path`` with WAL and synchronous=FULL
    (``NORMAL`` only for bench.events.append_phases' comparison without an fsync per commit)."""
    from eventsourcing.sqlite import (
        SQLiteApplicationRecorder,
        SQLiteConnection,
        SQLiteConnectionPool,
        SQLiteDatastore,
    )

    class FullSyncPool(SQLiteConnectionPool):
        def _create_connection(self) -> SQLiteConnection:
            connection = super()._create_connection()
            cursor = connection.cursor()
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA synchronous")
            if cursor.fetchone()[0] != {"FULL": 2, "NORMAL": 1}[synchronous]:
                raise AssertionError(f"synchronous is not {synchronous} on the peer's connection")
            return connection

    datastore = SQLiteDatastore(str(path))
    datastore.pool.close()
    datastore.pool = FullSyncPool(db_name=str(path))
    recorder = SQLiteApplicationRecorder(datastore)
    recorder.create_table()
    return recorder


def peer_event(originator_id: uuid.UUID, version: int, topic: str, state: bytes) -> Any:
    from eventsourcing.persistence import StoredEvent

    return StoredEvent(
        originator_id=originator_id, originator_version=version, topic=topic, state=state
    )


def _rows(count: int) -> list[dict[str, Any]]:
    url, _ = gen.sqlite_log(count)
    engine = make_engine(url)
    try:
        return [
            {"type": e.type, "model": e.model, "payload": e.payload}
            for e in open_log(engine).read(until=count)
        ]
    finally:
        engine.dispose()


def _peer_events(rows: list[dict[str, Any]]) -> list[Any]:
    versions: dict[str, int] = {}
    out = []
    for row in rows:
        name = row["model"] or ""
        versions[name] = versions.get(name, 0) + 1
        out.append(
            peer_event(
                uuid.uuid5(uuid.NAMESPACE_URL, name),
                versions[name],
                row["type"],
                row["payload"].encode(),
            )
        )
    return out


def _fresh(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


class Ours:
    def __init__(self, path: Path) -> None:
        _fresh(path)
        self.engine = make_engine(f"sqlite:///{path}")
        upgrade(self.engine)
        self.store = open_log(self.engine)

    def store_bulk(self, rows: list[dict[str, Any]]) -> None:
        for i in range(0, len(rows), BULK):
            chunk = rows[i : i + BULK]
            events = [NewEvent(r["type"], r["model"], r["payload"]) for r in chunk]
            self.store.append(events, expected_head=None)

    def store_singles(self, rows: list[dict[str, Any]]) -> None:
        head = self.store.head()
        for r in rows:
            self.store.append([NewEvent(r["type"], r["model"], r["payload"])], expected_head=head)
            head += 1

    def read_decode(self) -> int:
        count = 0
        for e in self.store.read():
            try:  # noqa: SIM105 - suppress() would cost more than the decoding
                json.loads(e.payload)
            except ValueError:
                pass
            count += 1
        return count

    def close(self) -> None:
        self.engine.dispose()


class Peer:
    def __init__(self, path: Path) -> None:
        _fresh(path)
        self.recorder = peer_recorder(path)

    def store_bulk(self, events: list[Any]) -> None:
        for i in range(0, len(events), BULK):
            self.recorder.insert_events(events[i : i + BULK])

    def store_singles(self, events: list[Any]) -> None:
        for e in events:
            self.recorder.insert_events([e])

    def read_decode(self) -> int:
        count = 0
        start = 1
        while True:
            batch = self.recorder.select_notifications(start, 5_000)
            for n in batch:
                try:  # noqa: SIM105 - suppress() would cost more than the decoding
                    json.loads(n.state)
                except ValueError:
                    pass
            count += len(batch)
            if len(batch) < 5_000:
                return count
            start = batch[-1].id + 1

    def close(self) -> None:
        self.recorder.datastore.close()


def run(quick: bool) -> list[common.Table]:
    count = QUICK_EVENTS if quick else EVENTS
    singles = QUICK_SINGLES if quick else SINGLES
    rows = _rows(count)
    peer_events = _peer_events(rows)
    scratch = common.CACHE / "peer"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    table = common.Table(
        "The peer: eventsourcing (SQLite recorder) vs ours, same events, same SQLite settings",
        ["operation", "events", "ours ev/s", "eventsourcing ev/s", "ours / theirs"],
    )
    best: dict[str, list[float]] = {}

    def keep(key: str, seconds: float) -> None:
        best.setdefault(key, []).append(seconds)

    declared = gen.declared_catalog()
    for attempt in range(2):
        common.progress(f"peer: round {attempt + 1} of 2 ({count:,} events)")
        ours = Ours(scratch / "ours.sqlite")
        theirs = Peer(scratch / "theirs.sqlite")
        keep("bulk ours", common.timed(partial(ours.store_bulk, rows))[0])
        keep("bulk theirs", common.timed(partial(theirs.store_bulk, peer_events))[0])
        keep("read ours", common.timed(ours.read_decode)[0])
        keep("read theirs", common.timed(theirs.read_decode)[0])
        seconds, result = common.timed(partial(replay, declared, ours.store.read()))
        if len(result.catalog) < len(declared):
            raise AssertionError("replay lost the declared models")
        keep("replay ours", seconds)
        extra = [{**r, "model": f"single-{i}"} for i, r in enumerate(rows[:singles])]
        keep("single ours", common.timed(partial(ours.store_singles, extra))[0])
        extra_peer = [peer_event(uuid.uuid4(), 1, e.topic, e.state) for e in peer_events[:singles]]
        keep("single theirs", common.timed(partial(theirs.store_singles, extra_peer))[0])
        ours.close()
        theirs.close()

    def line(label: str, key: str, n: int) -> None:
        o, t = min(best[f"{key} ours"]), min(best[f"{key} theirs"])
        table.add(label, f"{n:,}", common.rate(n, o), common.rate(n, t), f"{t / o:.2f}")

    line(f"store, {BULK:,} events per transaction", "bulk", count)
    line("store, 1 event per transaction (fsync each)", "single", singles)
    line("read all + json.loads each payload", "read", count)
    replay_s = min(best["replay ours"])
    table.add(
        "read all + replay (every event validated)",
        f"{count:,}",
        common.rate(count, replay_s),
        "n/a",
        "",
    )
    shutil.rmtree(scratch, ignore_errors=True)
    table.note(
        "ours: `SqlLog.append` (gapless positions, event ids, hash chain, under "
        "`BEGIN IMMEDIATE`) and `SqlLog.read`; theirs: `SQLiteApplicationRecorder."
        "insert_events` and `select_notifications` (5,000 per call)"
    )
    table.note(
        "store rows hold no validation on either side (the validated add is in the Append "
        "table); `ours / theirs` above 1 means ours is faster; best of 2 interleaved rounds"
    )
    return [table]
