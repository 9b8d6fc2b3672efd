"""The command handlers against the in-memory log: the write side's rules without a database.

What the handlers own is checked here: validation against the catalog as of
the head (catching up on other writers inside the write section), idempotency
by key (once, and refused for another change), the kind of each refusal, and
nothing written when a command is refused. The log's own behaviour is its
contract suite's (tests/integration/test_store_contract.py), which runs the
in-memory log beside SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import Catalog, CatalogError, Model
from events.core.types import MODEL_ADDED, MODEL_REMOVED, MODEL_REPLACED
from events.read.model import CatalogReadModel
from events.read.replay import replay
from events.storage.memory_log import MemoryLog
from events.write.commands import CatalogCommands, KeyReused
from tests.support import model

DECLARED = Catalog.build([model("decl", aliases=["d"])])


def _commands(log: MemoryLog) -> CatalogCommands:
    return CatalogCommands(log, CatalogReadModel(log, DECLARED, "catalog.yaml"))


def test_an_add_appends_in_dependency_order_and_the_read_model_sees_it() -> None:
    log = MemoryLog()
    commands = _commands(log)
    result = commands.add([model("top", fallbacks=["low"]), model("low")], actor="alice")
    assert [e.model for e in result.events] == ["low", "top"]
    assert (result.positions, result.already_recorded, result.attempts) == ([1, 2], False, 1)
    assert [e.type for e in log.read()] == [MODEL_ADDED, MODEL_ADDED]
    assert commands.model.catalog().fallbacks_of("top") == ("low",)
    assert commands.model.position == 2


def test_a_refused_add_writes_nothing_and_says_it_is_a_conflict() -> None:
    log = MemoryLog()
    commands = _commands(log)
    with pytest.raises(CatalogError, match="declared model 'decl'") as caught:
        commands.add([model("d")])
    assert caught.value.kind == "conflict"
    with pytest.raises(CatalogError, match="fallback 'nope' is not in the catalog") as caught:
        commands.add([model("ok"), model("dangling", fallbacks=["nope"])])
    assert caught.value.kind == "conflict"
    assert log.head() == 0


def test_an_empty_add_is_invalid() -> None:
    with pytest.raises(CatalogError, match="the change: holds no model definitions") as caught:
        _commands(MemoryLog()).add([])
    assert caught.value.kind == "invalid"


def test_removing_a_model_that_is_not_there_is_not_found() -> None:
    log = MemoryLog()
    with pytest.raises(CatalogError, match="'ghost' is not in the catalog") as caught:
        _commands(log).remove("ghost")
    assert caught.value.kind == "not_found"
    assert log.head() == 0


def test_removing_a_declared_model_or_by_alias_is_a_conflict() -> None:
    log = MemoryLog()
    commands = _commands(log)
    commands.add([model("trial", aliases=["t"])])
    for name in ("decl", "t"):
        with pytest.raises(CatalogError) as caught:
            commands.remove(name)
        assert caught.value.kind == "conflict"
    assert commands.remove("trial").events[0].type == MODEL_REMOVED
    assert "trial" not in commands.model.catalog()


def test_the_same_key_is_recorded_once_and_refused_for_another_change() -> None:
    log = MemoryLog()
    commands = _commands(log)
    first = commands.add([model("a")], key="k-1", actor="alice")
    again = commands.add([model("a")], key="k-1", actor="alice")
    assert again.already_recorded and again.attempts == 0
    assert again.events == first.events
    assert log.head() == 1
    with pytest.raises(KeyReused, match="already used for a different change") as caught:
        commands.add([model("a", tp=2)], key="k-1")
    assert caught.value.kind == "conflict"
    assert log.head() == 1


def test_a_command_validates_against_what_another_writer_appended() -> None:
    log = MemoryLog()
    mine, theirs = _commands(log), _commands(log)
    mine.model.catalog()  # caught up at the empty log
    theirs.add([model("shared")])
    with pytest.raises(CatalogError, match="already in the catalog") as caught:
        mine.add([model("shared")])
    assert caught.value.kind == "conflict"
    assert mine.model.position == 1
    assert [e.model for e in log.read()] == ["shared"]


def test_apply_adds_replaces_and_writes_nothing_when_unchanged() -> None:
    log = MemoryLog()
    commands = _commands(log)
    assert commands.apply(model("m")).outcome == "added"
    unchanged = commands.apply(model("m"))
    assert (unchanged.outcome, unchanged.events) == ("unchanged", ())
    replaced = commands.apply(model("m", tp=2), key="k-r")
    assert replaced.outcome == "replaced" and replaced.changes
    assert [e.type for e in log.read()] == [MODEL_ADDED, MODEL_REPLACED]
    # A repeat of the key answers the first outcome, its changes read from the log.
    repeated = commands.apply(model("m", tp=2), key="k-r")
    assert repeated.already_recorded
    assert (repeated.outcome, repeated.changes) == ("replaced", replaced.changes)
    assert log.head() == 2


def test_applying_a_declared_model_is_a_conflict() -> None:
    with pytest.raises(CatalogError, match="declared") as caught:
        _commands(MemoryLog()).apply(model("decl"))
    assert caught.value.kind == "conflict"


def test_the_read_model_caches_the_catalog_until_the_log_moves() -> None:
    log = MemoryLog()
    commands = _commands(log)
    read_model = commands.model
    first = read_model.view()
    assert read_model.view() is first
    assert read_model.catalog() is first.catalog
    commands.add([model("a")])
    after = read_model.view()
    assert (after.position, "a" in after.catalog) == (1, True)
    assert read_model.view() is after


def test_the_writers_catalog_is_the_one_a_replay_of_its_log_gives() -> None:
    """A command applies what it appended without reading it back or decoding it
    again (events.read.model.wrote): the result must be what every other reader
    of the log replays, model for model."""
    log = MemoryLog()
    commands = _commands(log)
    commands.add([model("top", fallbacks=["low"], aliases=["t"]), model("low")], actor="a")
    commands.add([model("solo", tp=2, aliases=["s", "solo-latest"])], actor="a")
    commands.apply(model("low", gpu_class="H100", aliases=["l"]), actor="a")
    commands.apply(model("fresh", fallbacks=["solo-latest"]), actor="a")
    commands.remove("top", actor="a")
    written = commands.model.catalog()
    replayed = replay(DECLARED, log.read())
    assert replayed.skipped == ()
    assert written == replayed.catalog
    assert [m.model_dump() for m in written.models()] == [
        m.model_dump() for m in replayed.catalog.models()
    ]


NAMES = ["a", "b", "c", "d", "decl", "d-alias"]


# What `_commands_to_run` draws, built once: built in the composite, each was a new
# strategy that hypothesis validated again on every draw.
_COMMANDS = st.integers(min_value=1, max_value=12)
_KIND = st.sampled_from(["add", "add", "apply", "remove"])
_BATCH = st.integers(min_value=1, max_value=3)
_NAME = st.sampled_from(NAMES)
_SOME_NAMES = st.lists(st.sampled_from(NAMES), max_size=2, unique=True)


@st.composite
def _commands_to_run(draw: st.DrawFn) -> list[tuple[str, list[Model]]]:
    out: list[tuple[str, list[Model]]] = []
    for _ in range(draw(_COMMANDS)):
        kind = draw(_KIND)
        count = draw(_BATCH) if kind == "add" else 1
        batch = []
        for _ in range(count):
            name = draw(_NAME)
            aliases = draw(_SOME_NAMES)
            fallbacks = draw(_SOME_NAMES)
            batch.append(model(name, aliases=[f"{a}-x" for a in aliases], fallbacks=fallbacks))
        out.append((kind, batch))
    return out


@given(_commands_to_run())
@settings(max_examples=150, deadline=None)
def test_any_commands_leave_the_writer_with_the_catalog_a_replay_gives(
    commands_to_run: list[tuple[str, list[Model]]],
) -> None:
    """A command's own definitions are applied without judging them again
    (``Replayer.apply_accepted``): whatever commands are accepted or refused, in
    batches with fallbacks within the batch, the writer's catalog is the one a
    fresh replay of its log gives, with nothing skipped."""
    log = MemoryLog()
    commands = _commands(log)
    for kind, batch in commands_to_run:
        try:
            if kind == "add":
                commands.add(batch, actor="a")
            elif kind == "apply":
                commands.apply(batch[0], actor="a")
            else:
                commands.remove(batch[0].name, actor="a")
        except CatalogError:
            pass  # refused: nothing written, as other tests hold
    written = commands.model.catalog()
    replayed = replay(DECLARED, log.read())
    assert replayed.skipped == ()
    assert [m.model_dump() for m in written.models()] == [
        m.model_dump() for m in replayed.catalog.models()
    ]
    assert commands.model.position == replayed.position
