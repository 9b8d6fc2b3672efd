"""The one rule for printable text, and the API document's patterns, agree exactly.

``catalog.forms.printable`` is what every path checks (identifiers, reasons, node and
replica reports, ``shown``); ``llmgw.api.rendering.schemas`` writes the same rule into the
document. Before, the document's class refused only the common culprits, so an
unassigned (Cn), private-use (Co) or rarer format (Cf) character was valid by the
document and a 422 from the server (issue 11, item 10).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from catalog import CatalogError, parse_model
from catalog.definition import identifiers
from catalog.definition.identifiers import Grammar
from catalog.forms.durations import parse_duration
from catalog.forms.printable import (
    PRINTABLE_RANGES,
    UNICODE_VERSION,
    character_class,
    first_unprintable,
    printable,
    ranges_from_unicodedata,
)
from llmgw.api.rendering.schemas import (
    DURATION_PATTERN,
    PRINTABLE_TEXT,
    grammar_schema,
    printable_schema,
    spread_by_schema,
)
from tests.support import definition

SETTINGS = settings(max_examples=200, deadline=None)
# Thirteen grammars, each drawn from its own pattern, arbitrary text and both mixed.
PER_GRAMMAR = settings(max_examples=80, deadline=None)

# Every grammar the document states (the actor is never an input of the API).
GRAMMARS = [
    g for g in vars(identifiers).values() if isinstance(g, Grammar) and g is not identifiers.ACTOR
]

# The edges of every range, on both sides: where a wrong class would go wrong first.
_EDGES = sorted(
    {cp for first, last in PRINTABLE_RANGES for cp in (first - 1, first, last, last + 1)}
    - {-1, 0x110000}
)
edge = st.sampled_from(_EDGES).map(chr)
# Any code point, surrogates, private use and unassigned ones included.
any_character = st.characters(codec=None, exclude_categories=())
text = st.one_of(
    st.text(st.one_of(edge, any_character), max_size=12),
    st.text(max_size=12),
    st.text(st.characters(max_codepoint=0x7F), max_size=12),
)


@pytest.mark.skipif(
    unicodedata.unidata_version != UNICODE_VERSION,
    reason=f"the rule is fixed at Unicode {UNICODE_VERSION}; this Python has "
    f"{unicodedata.unidata_version}",
)
def test_the_rule_is_str_isprintable_at_its_unicode_version() -> None:
    # Code point by code point: the written ranges are exactly what isprintable says.
    assert ranges_from_unicodedata() == PRINTABLE_RANGES


@pytest.mark.parametrize(
    ("character", "category"),
    [
        ("\U0006bcc4", "Cn"),  # found by schemathesis in a ?reason=
        ("\u0378", "Cn"),
        ("\ue000", "Co"),
        ("\U000f0000", "Co"),
        ("\u0600", "Cf"),  # ARABIC NUMBER SIGN: a format character the old class missed
        ("\U000e0001", "Cf"),  # LANGUAGE TAG
        ("\u2066", "Cf"),  # LEFT-TO-RIGHT ISOLATE
        ("\u3000", "Zs"),
    ],
)
def test_a_character_of_a_refused_category_is_refused_by_the_document_too(
    character: str, category: str
) -> None:
    assert unicodedata.category(character) == category
    value = f"moved{character}"
    assert not printable(value)
    assert first_unprintable(value) == (5, character)
    assert re.search(PRINTABLE_TEXT, value) is None
    assert identifiers.REASON.problem(value) is not None


@given(value=text)
@SETTINGS
def test_the_document_pattern_and_the_rule_agree_on_any_string(value: str) -> None:
    verdict = printable(value)
    assert verdict == value.isprintable()  # Python 3.11's unicodedata is the rule's version
    assert (re.search(PRINTABLE_TEXT.removesuffix("$") + r"\Z", value) is not None) is verdict
    assert (first_unprintable(value) is None) is verdict


# The class as an ECMA-262 or Rust engine reads it: jsonschema-rs is what schemathesis
# validates with. JSON text cannot carry a lone surrogate, so none is drawn here.
_RUST = jsonschema_rs.validator_for(printable_schema(10_000))


@given(value=st.text(st.one_of(edge, st.characters(codec="utf-8")), max_size=12))
@SETTINGS
def test_a_rust_regex_engine_reads_the_document_pattern_as_the_rule(value: str) -> None:
    assert _RUST.is_valid(value) is printable(value)


# What str.strip() removes, and U+FEFF, which ECMA-262's \s has and Python's has not.
WHITESPACE = [chr(c) for c in range(0x3001) if chr(c).isspace()] + ["\ufeff"]


def _joined(pieces: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(pieces), max_size=8).map("".join)


def _documented(schema: dict[str, Any], value: str) -> bool:
    # ECMA-262's `$` is the end of the string; Python's also matches before a last "\n".
    pattern = schema["pattern"].removesuffix("$") + r"\Z"
    return (
        re.search(pattern, value) is not None
        and len(value) <= schema.get("maxLength", len(value))
        and len(value) >= schema.get("minLength", 0)
    )


@given(
    value=st.one_of(
        text,
        _joined(["1", "2.5", ".", "h", "m", "s", "ms", "us", "\u0663", *WHITESPACE]),
    )
)
@SETTINGS
def test_a_duration_is_valid_by_the_document_exactly_when_the_domain_reads_it(value: str) -> None:
    try:
        parse_duration(value)
        taken = True
    except ValueError as exc:
        # The one rule the document states in words: a sum of parts beyond a timedelta.
        assume("too large" not in str(exc))
        taken = False
    assert _documented({"pattern": DURATION_PATTERN}, value) is taken


_SCHEMAS = {g.what: grammar_schema(g) for g in GRAMMARS}


@functools.cache
def _near(grammar: Grammar) -> st.SearchStrategy[str]:
    """Values close to ``grammar``'s: built once per grammar, not at every example (where
    the regex's strategy was built and validated again each time; the same strategy)."""
    close = (
        st.from_regex(grammar.pattern, fullmatch=True)
        if grammar.pattern is not None
        else st.text(max_size=20)
    )
    return st.one_of(
        close,
        text,
        st.builds(lambda a, b, c: a + b + c, close, text, close),
        st.builds(lambda ch: ch * (grammar.max_length + 1), st.sampled_from("a\ue000 ")),
    )


@pytest.mark.parametrize("grammar", GRAMMARS, ids=lambda g: g.what)
@given(data=st.data())
@PER_GRAMMAR
def test_each_grammar_is_valid_by_the_document_exactly_when_the_domain_takes_it(
    grammar: Grammar, data: st.DataObject
) -> None:
    value = data.draw(_near(grammar))
    assert _documented(_SCHEMAS[grammar.what], value) is (grammar.problem(value) is None)


@given(
    value=st.one_of(
        text,
        _joined(["zone", "-", "\u00e9", *WHITESPACE]),
        st.builds(
            lambda pad, n: pad + "z" * n + pad, st.sampled_from(WHITESPACE), st.integers(250, 256)
        ),
    )
)
@SETTINGS
def test_spread_by_is_valid_by_the_document_exactly_when_a_definition_takes_it(
    value: str,
) -> None:
    raw = {**definition("llama"), "placement": {"spread_by": value}}
    try:
        parse_model(raw)
        taken = True
    except CatalogError as exc:
        assert exc.field == "placement.spread_by", str(exc)
        assert "llama" in str(exc) and "name the node label" in str(exc)
        taken = False
    assert _documented(spread_by_schema(), value) is taken


def test_the_class_is_compact_enough_to_generate_from() -> None:
    # 700 ranges of printable code points; the refused side is ~830,000 scattered
    # code points, which is what made schemathesis take seconds a string.
    assert len(PRINTABLE_RANGES) == 700
    assert character_class().startswith("[\\u0020-\\u007e")
