"""The SQLite log's own write connection (events.storage.sqlite_log): kept between sections,
never stale, never shared across a fork, and a driver error still reads as SQLAlchemy's.

The log keeps one connection for its write sections instead of taking one from the
pool each time. These hold what that must not change: each section sees what any
other writer committed before it, an error in a section writes nothing and the next
section works, and a child process forked after a write can write (through a
connection of its own: the inherited one stays the parent's) and so can the parent.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from events.core.chain import verify_chain
from events.core.types import NewEvent
from events.database.connection import make_engine
from events.storage.backends import open_log
from events.storage.chain_rows import read_chain, read_seal
from events.storage.sql_log import SqlLog


def _event(name: str) -> NewEvent:
    return NewEvent(type="model.added", model=name, payload=json.dumps({"model": {"name": name}}))


@pytest.fixture
def engines(sqlite_url: str) -> Iterator[tuple[Engine, Engine]]:
    a, b = make_engine(sqlite_url), make_engine(sqlite_url)
    yield a, b
    a.dispose()
    b.dispose()


def test_two_logs_on_one_file_see_each_others_writes_and_keep_one_chain(
    engines: tuple[Engine, Engine],
) -> None:
    first, second = (open_log(e) for e in engines)
    for i in range(6):
        writer, other = (first, second) if i % 2 == 0 else (second, first)
        with writer.writing() as locked:
            # What the other log committed since this log's last section is there.
            seen = [e.model for e in locked.read(after=max(i - 1, 0))]
            assert seen == ([f"m{i - 1}"] if i else [])
            locked.append([_event(f"m{i}")], expected_head=i)
        assert other.head() == i + 1
    assert [e.model for e in first.read()] == [f"m{i}" for i in range(6)]
    report = verify_chain(read_chain(engines[0]), read_seal(engines[0]))
    assert report.ok and report.head_position == 6


def test_a_driver_error_in_a_section_is_sqlalchemys_writes_nothing_and_the_next_works(
    engines: tuple[Engine, Engine],
) -> None:
    log = open_log(engines[0])
    log.append([_event("a")], expected_head=0)
    with pytest.raises(OperationalError), log.writing() as locked:
        locked.append([_event("b")], expected_head=1)
        locked.conn.execute("INSERT INTO no_such_table VALUES (1)")
    assert [e.model for e in log.read()] == ["a"]
    assert log.append([_event("c")], expected_head=1).events[0].position == 2
    assert [e.model for e in open_log(engines[1]).read()] == ["a", "c"]


def _child_appends(url: str, log_holder: list[SqlLog]) -> None:  # pragma: no cover - child
    log = log_holder[0]
    log.append([_event("child")], expected_head=1)


def test_a_process_forked_after_a_write_can_write_and_so_can_its_parent(
    sqlite_url: str,
) -> None:
    engine = make_engine(sqlite_url)
    log = open_log(engine)
    log.append([_event("parent")], expected_head=0)  # the parent's connection is open now
    child = multiprocessing.get_context("fork").Process(
        target=_child_appends, args=(sqlite_url, [log])
    )
    child.start()
    child.join(60)
    assert child.exitcode == 0
    # The parent's connection still works, and sees the child's event.
    assert log.append([_event("parent-2")], expected_head=2).events[0].position == 3
    assert [e.model for e in log.read()] == ["parent", "child", "parent-2"]
    assert verify_chain(read_chain(engine), read_seal(engine)).ok
    engine.dispose()
