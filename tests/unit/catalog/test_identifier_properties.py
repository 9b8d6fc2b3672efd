"""Properties of the identifier grammar and of the escaping every printed value goes through.

Any string at all, in any field that holds a name, is either accepted and
stored unchanged, or refused with a CatalogError naming that field; and
whatever ``shown`` prints is one printable line that says exactly what the
value was.
"""

from __future__ import annotations

import ast
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import CatalogError, parse_model
from catalog.definition.identifiers import check_command
from catalog.forms.text import guard_line, shown
from scheduler.planner.fleet.inventory import NodeReportError, parse_node_report
from tests.support import definition

SETTINGS = settings(max_examples=300, deadline=None)

# Anything: every Unicode category, lone surrogates included, and long strings
# (past each grammar's limit) made of a few characters repeated.
anything = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec=None), max_size=8),
    st.builds(lambda ch, n: ch * n, st.text(min_size=1, max_size=2), st.integers(60, 300)),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,30}", fullmatch=True),
)


def _with(field: str, value: str) -> dict[str, Any]:
    raw = definition("llama")
    if field == "name":
        raw["name"] = value
    elif field == "aliases":
        raw["aliases"] = [value]
    elif field == "fallbacks":
        raw["fallbacks"] = [value, "llama"] if value != "llama" else [value]
    elif field == "source":
        raw["source"] = value
    elif field == "profiles.name":
        raw["profiles"][0]["name"] = value
    elif field == "gpu_class":
        raw["profiles"][0]["gpu_class"] = value
    elif field == "node_selector":
        raw["profiles"][0]["node_selector"] = {value: "x"}
    return raw


FIELDS = ["name", "aliases", "source", "profiles.name", "gpu_class", "node_selector"]


@pytest.mark.parametrize("field", FIELDS)
@settings(max_examples=150, deadline=None)
@given(value=anything)
def test_any_string_in_a_name_field_is_stored_unchanged_or_refused_naming_the_field(
    field: str, value: str
) -> None:
    raw = _with(field, value)
    try:
        parsed = parse_model(raw)
    except CatalogError as exc:
        # Refused for this field (an empty gpu_class is a CPU profile's, refused
        # for the engine: that names gpu_class too).
        assert exc.field == field, (exc.field, str(exc))
        assert str(exc).isprintable()
        return
    stored = json.loads(json.dumps(parsed.to_definition()))
    again = parse_model(stored)
    assert again == parsed
    assert json.dumps(_with(field, value)) == json.dumps(raw)  # nothing was rewritten
    if field == "name":
        assert again.name == value and value.isascii() and value.isprintable()
        assert len(value) <= 200


@SETTINGS
@given(value=anything)
def test_any_string_as_a_node_name_is_accepted_unchanged_or_refused_naming_the_name(
    value: str,
) -> None:
    try:
        report = parse_node_report({"name": value})
    except NodeReportError as exc:
        assert all(": name " in p for p in exc.problems), exc.problems
        assert all(p.isprintable() for p in exc.problems)
        return
    assert report.name == value and len(value) <= 253 and value.isascii()


@SETTINGS
@given(actor=anything, reason=anything, key=st.none() | anything)
def test_any_actor_reason_and_key_are_accepted_or_refused_naming_which(
    actor: str, reason: str, key: str | None
) -> None:
    try:
        check_command(actor=actor, reason=reason, key=key)
    except CatalogError as exc:
        assert exc.field in ("actor", "reason", "key")
        assert str(exc).isprintable()
        return
    for text in (actor, reason, key or ""):
        assert text.isprintable()
    assert len(actor) <= 128 and len(reason) <= 2000
    assert key is None or (0 < len(key) <= 128 and "#" not in key and key.isascii())


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.characters(codec=None)))
def test_shown_is_one_printable_line_that_says_exactly_what_the_value_was(value: str) -> None:
    out = shown(value)
    assert out.isprintable()
    if value.isprintable():
        assert out == value
    else:
        assert ast.literal_eval(out) == value


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.characters(codec=None)))
def test_guarded_output_keeps_its_lines_and_lets_nothing_else_unprintable_through(
    value: str,
) -> None:
    out = guard_line(value)
    assert out.count("\n") == value.count("\n")
    assert all(line.isprintable() for line in out.split("\n"))


def test_shown_escapes_a_forged_line_and_a_bidi_override() -> None:
    assert shown("x\ny") == "'x\\ny'"
    assert shown("abc\u202edef") == "'abc\\u202edef'"
    assert shown("\x1b[2J") == "'\\x1b[2J'"
    assert shown("llama-70b") == "llama-70b"
    assert shown("Zoë") == "Zoë"
