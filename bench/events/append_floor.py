"""Where the validated add stands against the store's own floor, in one process, interleaved.

``python -m bench.events.append_floor [--rounds R] [--batch B]``: five ways to write one
event with ``synchronous=FULL``, each on its own SQLite file holding 5,000 events
first, measured in batches of B writes taken in a shuffled order each round
(thread CPU time, ``time.thread_time``; the median of R batches):

- ``eventsourcing Application.save``: the library's own way to record a new
  model, an aggregate created and saved (bench.events.peer_app): the reference, the
  same job as our validated add;
- ``eventsourcing insert_events``: the library's recorder, one stored event
  already encoded (bench.events.peer): a bare insert, kept as context (issue 13's
  first reference);
- ``bare sqlite3 on our table``: what our store cannot do without, written
  with nothing around it: BEGIN IMMEDIATE, the last row's position and hash,
  the event hash (events.core.chain), one INSERT of our row into our table (every
  index of the migrated schema), COMMIT, on a plain ``sqlite3`` connection;
- the same without the indexes on ``model`` and ``recorded_at`` (not done: what
  dropping them would buy);
- ``CatalogService.add``: the validated add (validation, encoding, the hash
  chain, idempotency's id, applying its own event, the log call).

The second against the third says what our schema costs against theirs (their
table has two b-trees, ours four since migration 0006; the fourth row drops the
two that serve audit queries, which is not done); the third against the last is
the price of our own code. The files live on the same disk and their
fsyncs interleave, so each batch pays its own share of the journal.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sqlite3
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from bench.events import append
from bench.shared import common, gen
from events.core.chain import event_hash

INSERT = (
    "INSERT INTO events (position, event_id, command_id, type, schema_version, model, payload,"
    " actor, reason, recorded_at, prev_hash, hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)
LAST = "SELECT position, recorded_at, hash FROM events ORDER BY position DESC LIMIT 1"


class _Bare:
    """Our table, written with the bare driver and nothing else; ``lookups=False`` drops
    the indexes that serve `history --model`, `--since`/`--until` and the catalog at a
    time (what the table would be with as many b-trees as the library's)."""

    def __init__(self, lookups: bool = True) -> None:
        tag = "bare" if lookups else "bare-ids"
        url = append._sqlite_copy(f"append/floor-{tag}-{os.getpid()}.sqlite")
        self.path = url.removeprefix("sqlite:///")
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        if not lookups:
            self.conn.execute("DROP INDEX ix_events_model")
            self.conn.execute("DROP INDEX ix_events_recorded_at")
        self.payload = gen.probe().payload({"model": gen.templates()[0]})
        self.count = 0

    def one(self) -> None:
        conn = self.conn
        self.count += 1
        conn.execute("BEGIN IMMEDIATE")
        position, _, prev = conn.execute(LAST).fetchone()
        at = datetime.now(UTC)
        event_id, model = uuid.uuid4().hex, f"bare-{self.count}"
        row = (position + 1, event_id, event_id, "model.added", 2, model, self.payload)
        value = event_hash(prev, *row, "bench", "", at)
        text = at.replace(tzinfo=None).isoformat(" ", "microseconds")
        conn.execute(INSERT, (*row, "bench", "", text, prev, value))
        conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


class _Service:
    def __init__(self) -> None:
        url = append._sqlite_copy(f"append/floor-ours-{os.getpid()}.sqlite")
        self.engine = append._engine(url, "FULL")
        self.models = iter(append._definitions("floor", 100_000))
        self.service = gen.make_service(gen.log_opener()(self.engine), gen.declared_catalog())
        self.service.refresh()

    def one(self) -> None:
        self.service.add([next(self.models)], actor="bench")

    def close(self) -> None:
        self.engine.dispose()


class _Insert:
    def __init__(self) -> None:
        from bench.events.peer import peer_event, peer_recorder

        self.event = peer_event
        self.recorder = peer_recorder(common.CACHE / "append" / f"floor-es-{os.getpid()}.sqlite")
        self.payload = gen.probe().payload({"model": gen.templates()[0]}).encode()
        for _ in range(5):
            self.recorder.insert_events(
                [self.event(uuid.uuid4(), 1, "model.added", self.payload) for _ in range(1_000)]
            )

    def one(self) -> None:
        self.recorder.insert_events([self.event(uuid.uuid4(), 1, "model.added", self.payload)])

    def close(self) -> None:
        self.recorder.datastore.close()


class _Save:
    def __init__(self) -> None:
        from bench.events.peer_app import CatalogModel, peer_application

        self.model = CatalogModel
        self.app = peer_application(common.CACHE / "append" / f"floor-app-{os.getpid()}.sqlite")
        self.definition = json.loads(gen.probe().payload({"model": gen.templates()[0]}))
        for _ in range(5):
            self.app.save(*[CatalogModel(dict(self.definition)) for _ in range(1_000)])

    def one(self) -> None:
        self.app.save(self.model(dict(self.definition)))

    def close(self) -> None:
        self.app.close()


SUBJECTS: dict[str, Callable[[], Any]] = {
    # The first is the reference the last column divides by.
    "eventsourcing Application.save (an aggregate; the reference)": _Save,
    "eventsourcing insert_events (a bare insert; context)": _Insert,
    "bare sqlite3 on our table (the floor of our schema)": _Bare,
    "the same without the model and time indexes (2 b-trees)": lambda: _Bare(lookups=False),
    "CatalogService.add (validated)": _Service,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=50)
    args = parser.parse_args()
    from bench.shared.common import quiet_logs

    quiet_logs()
    scratch = common.CACHE / "append"
    scratch.mkdir(parents=True, exist_ok=True)
    common.progress("append_floor: preparing the stores")
    subjects = {name: make() for name, make in SUBJECTS.items()}
    spent: dict[str, list[float]] = {name: [] for name in subjects}
    order = list(subjects)
    shuffle = random.Random(20261203).shuffle
    try:
        gc.collect()
        for i in range(args.rounds):
            if i % 5 == 0:
                common.progress(f"append_floor: round {i + 1} of {args.rounds}")
            shuffle(order)
            for name in order:
                one = subjects[name].one
                start = time.thread_time()
                for _ in range(args.batch):
                    one()
                spent[name].append((time.thread_time() - start) / args.batch)
    finally:
        for subject in subjects.values():
            subject.close()
        for path in scratch.glob(f"floor-*-{os.getpid()}.sqlite*"):
            path.unlink(missing_ok=True)
    reference = statistics.median(spent[next(iter(SUBJECTS))])
    table = common.Table(
        f"One event written, SQLite FULL, 5,000 events before (us of thread CPU, median of "
        f"{args.rounds} batches of {args.batch})",
        ["what", "us CPU/write", "reference / this"],
    )
    for name, values in spent.items():
        median = statistics.median(values)
        table.add(name, f"{median * 1e6:.1f}", f"{reference / median:.2f}x")
    table.note(
        "interleaved in one process, batches in a shuffled order each round; above 1x is "
        "cheaper than the reference"
    )
    print(table.render())


if __name__ == "__main__":
    main()
