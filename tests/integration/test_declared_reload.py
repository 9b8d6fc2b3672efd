"""The declared file's reloader on SQLite and PostgreSQL: two watchers of one file (a
server and a daemon) record one event per change; a comment changes nothing; a file
that disappears is refused and the catalog in force stays."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from catalog import load_declared
from declared.reload import APPLIED, REFUSED, UNCHANGED, DeclaredReloader
from declared.status import read_status
from events.catalog_service import CatalogService
from events.core.types import DECLARED_CHANGED
from events.storage.backends import open_log
from tests.support import dump_yaml


def write(path: Path, arg: str, comment: str = "") -> None:
    text = dump_yaml(
        {
            "models": [
                {
                    "name": "chat",
                    "source": "org/chat",
                    "profiles": [{"name": "a100", "gpu_class": "A100", "args": [arg]}],
                }
            ]
        }
    )
    path.write_text(text + comment)


def watcher(engine: Engine, path: Path, role: str) -> tuple[DeclaredReloader, CatalogService]:
    declared = load_declared(path)
    service = CatalogService(open_log(engine), declared, str(path))
    reloader = DeclaredReloader(
        path, declared, [service], service, engine=engine, by=f"llmgw {role}"
    )
    reloader.start()
    return reloader, service


def test_two_watchers_record_one_event_and_a_comment_changes_nothing(
    engine: Engine, tmp_path: Path
) -> None:
    path = tmp_path / "catalog.yaml"
    write(path, "--a")
    server, api = watcher(engine, path, "serve")
    daemon, placer = watcher(engine, path, "daemon")

    write(path, "--b")
    one, two = server.check(), daemon.check()
    assert one is not None and two is not None
    assert (one.result, two.result) == (APPLIED, APPLIED)
    events = [e for e in api.store.read() if e.type == DECLARED_CHANGED]
    assert len(events) == 1  # the same change, noticed twice
    for service in (api, placer):
        chat = service.catalog().resolve("chat")
        assert chat is not None and chat.profiles[0].args == ("--b",)

    write(path, "--b", comment="# reviewed by alice\n")
    third = server.check()
    assert third is not None and third.result == UNCHANGED
    assert len([e for e in api.store.read() if e.type == DECLARED_CHANGED]) == 1

    path.unlink()
    gone = server.check()
    assert gone is not None and gone.result == REFUSED and gone.refusal is not None
    assert "cannot read" in gone.refusal.message
    chat = api.catalog().resolve("chat")
    assert chat is not None and chat.profiles[0].args == ("--b",)  # the catalog in force
    (status,) = read_status(engine, str(path))
    assert status.state == "refused" and status.digest == gone.digest
    assert status.catalog().resolve("chat") is not None


def test_a_change_made_while_nothing_ran_is_recorded_at_start(
    engine: Engine, tmp_path: Path
) -> None:
    path = tmp_path / "catalog.yaml"
    write(path, "--a")
    _, service = watcher(engine, path, "serve")
    assert not [e for e in service.store.read() if e.type == DECLARED_CHANGED]
    write(path, "--b")  # edited while the server was down
    _, again = watcher(engine, path, "serve")
    (event,) = [e for e in again.store.read() if e.type == DECLARED_CHANGED]
    assert event.model == "chat"


def test_a_hostile_status_row_is_skipped_and_named(engine: Engine, tmp_path: Path) -> None:
    from sqlalchemy import update

    from declared.status import declared_t

    path = tmp_path / "catalog.yaml"
    write(path, "--a")
    watcher(engine, path, "serve")
    hostile = [
        ("definitions", "[" * 100_000),
        ("definitions", '[{"name": "x"}]'),
        ("refusal", '{"file": 1}'),
    ]
    if engine.dialect.name == "sqlite":  # SQLite stores whatever it is given
        hostile.append(("models", "many"))
    for column, value in hostile:
        with engine.begin() as conn:
            conn.execute(update(declared_t).values({column: value}))
        assert read_status(engine) == []  # skipped (and named in the log), not a crash
        watcher(engine, path, "serve")  # a watcher's start writes a good row again
        assert len(read_status(engine)) == 1
