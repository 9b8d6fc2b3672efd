"""Names on both stores through the `llmgw` command: refused before the database sees them,
and, for rows written before the grammar (or by hand), printed escaped so they cannot forge
a line of any table."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert

from events.database.connection import make_engine
from events.database.tables import EventRow
from scheduler.persistence.tables import NodeRow, PlacementRow, table
from tests.e2e.cli import Cli
from tests.support import definition, insert_raw_event

HOSTILE = "x\ny  2026-01-01T00:00:00Z  model.removed  llama  root"
BIDI = "evil\u202egnp.exe"
ESCAPE = "\x1b[2J\x1b[31mred"


@pytest.fixture
def cli(db_url: str, tmp_path: Path) -> Cli:
    return Cli(tmp_path, db_url)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


def _clean(text: str) -> None:
    """Every line of the output is printable: no control, bidi or zero-width character."""
    for line in text.split("\n"):
        assert line.isprintable(), repr(line)


def test_a_300_character_name_a_250_character_key_and_a_two_line_actor_are_refused_cleanly(
    cli: Cli,
) -> None:
    # Before the grammar: StringDataRightTruncation on PostgreSQL, stored whole on SQLite.
    cli.write("long.yaml", definition("m" * 300))
    done = cli("add", "long.yaml")
    assert done.returncode == 1, done.stderr
    assert "long.yaml: a model: name 'mmm" in done.stderr
    assert "300 characters long; at most 200 are allowed" in done.stderr
    assert "Traceback" not in done.stderr
    cli.write("ok.yaml", {"models": [definition("a"), definition("b")]})
    long = cli("add", "ok.yaml", "--key", "k" * 250)
    assert long.returncode == 1, long.stderr
    assert "key 'kkk" in long.stderr and "250 characters long" in long.stderr
    assert "Traceback" not in long.stderr
    # KEY#2 is the id of the second event of a list added under KEY: reserved.
    hashed = cli("add", "ok.yaml", "--key", "deploy#2")
    assert hashed.returncode == 1 and "'#'" in hashed.stderr, hashed.stderr
    actor = cli("add", "ok.yaml", "--actor", "alice\nroot", "--reason", "ok\u202e")
    assert actor.returncode == 1 and "actor 'alice\\nroot'" in actor.stderr
    _clean(actor.stderr)
    assert cli.json("history") == []


def test_a_look_alike_and_a_case_twin_of_a_declared_alias_are_refused(
    sqlite_url: str, tmp_path: Path
) -> None:
    cli = Cli(tmp_path, sqlite_url)
    cli.write("catalog.yaml", {"models": [definition("llama-3", aliases=["llama-70b"])]})
    cli.write("cyrillic.yaml", definition("ll\u0430ma-3"))
    done = cli("add", "cyrillic.yaml")
    assert done.returncode == 1 and "CYRILLIC SMALL LETTER A" in done.stderr
    cli.write("upper.yaml", definition("LLAMA-70B"))
    done = cli("add", "upper.yaml")
    assert done.returncode == 1
    assert "differing only in case" in done.stderr and "catalog.yaml" in done.stderr


def _hostile_rows(engine: Engine) -> None:
    """What an older release or a hand edit may have left: names that print as two lines,
    clear the screen, or read backwards."""
    insert_raw_event(engine, 1, payload={"model": definition("fine")}, model="fine")
    event_id = insert_raw_event(engine, 2, payload={"model": definition(HOSTILE)}, model=HOSTILE)
    with engine.begin() as conn:
        conn.execute(
            EventRow.__table__.update()  # type: ignore[attr-defined]
            .where(EventRow.position == 2)
            .values(actor=ESCAPE, reason=BIDI + "\nforged line")
        )
        now = datetime.now(UTC)
        conn.execute(
            insert(table(NodeRow)),
            {
                "name": HOSTILE,
                "gpu_class": ESCAPE,
                "gpus": 1,
                "gpus_reserved": 0,
                "memory_gb": None,
                "labels": json.dumps({"zone\n": BIDI}),
                "fabric": None,
                "reported_at": now,
            },
        )
        conn.execute(
            insert(table(PlacementRow)),
            {
                "model": HOSTILE,
                "replica": 0,
                "profile": BIDI,
                "nodes": json.dumps([HOSTILE]),
                "gpus_per_node": 1,
                "gpu_class": ESCAPE,
                "memory_gb_per_node": 0,
                "round_id": 1,
                "placed_at": now,
            },
        )
    assert event_id


def test_hostile_stored_rows_are_printed_escaped_one_row_per_line(cli: Cli, engine: Engine) -> None:
    _hostile_rows(engine)
    history = cli("history")
    assert history.returncode == 0, history.stderr
    _clean(history.stdout)
    lines = history.stdout.splitlines()
    assert len(lines) == 3  # the header and two events: nothing forged
    assert repr(HOSTILE) in lines[2] and repr(ESCAPE) in lines[2]
    assert "model.removed" not in lines[2].split(repr(HOSTILE))[0]

    nodes = cli("nodes", "list")
    assert nodes.returncode == 0, nodes.stderr
    _clean(nodes.stdout)
    # The header and the one node, then the line naming the policy it was judged by.
    table = nodes.stdout.splitlines()
    assert len(table) == 3 and table[-1].startswith("judged by"), table
    assert repr(HOSTILE) in table[1]

    placements = cli("placements")
    assert placements.returncode == 0, placements.stderr
    _clean(placements.stdout)
    assert len(placements.stdout.splitlines()) == 2 and repr(BIDI) in placements.stdout

    explained = cli("replay", "--explain")
    assert explained.returncode == 0, explained.stderr
    _clean(explained.stdout)
    # The hostile add is skipped and named, on one line plus its reason.
    assert "SKIPPED" in explained.stdout and "U+000A" in explained.stdout
    assert explained.stdout.count("\n") == 4

    for args in (["models"], ["diff", "0", "2"]):
        done = cli(*args)
        assert done.returncode == 0, (args, done.stderr)
        _clean(done.stdout)
        _clean(done.stderr)
    # The hostile row was edited after it was hashed, so verify names it; its refusal is
    # still one escaped line.
    verified = cli("verify")
    assert verified.returncode == 1 and "position 2" in verified.stderr
    _clean(verified.stderr)
    assert verified.stderr.count("\n") == 1
