"""The secrets rule (catalog.secrecy.secrets), by property: which plain values are refused, what
every refusal says, and that redaction leaves no secret-looking plain value behind."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from catalog import CatalogError, parse_model
from catalog.reading.declared import load_declared
from catalog.secrecy.secret_words import (
    NOT_SECRET_NAMES,
    SECRET_NAMES_PATTERN,
    SECRET_PARTS,
    SECRET_WORDS,
)
from catalog.secrecy.secrets import (
    REDACTED,
    check_no_plain_secrets,
    env_var_for,
    looks_secret,
    redact,
    secret_name_problem,
)
from tests.support import dump_yaml

NAME_CHARS = st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
words = st.sampled_from(SECRET_WORDS)
affix = st.text(NAME_CHARS, max_size=8)


def _case(text: str, flips: list[bool]) -> str:
    return "".join(c.lower() if f else c for c, f in zip(text, flips, strict=True))


# What the composites below draw, built once (the case flips once per length): built in
# each draw, each was a new strategy that hypothesis validated again every time.
_FLIPS = {
    n: st.lists(st.booleans(), min_size=n, max_size=n)
    for n in {len(w) for w in [*SECRET_WORDS, *SECRET_PARTS]}
}
_PART = st.sampled_from(SECRET_PARTS)
_BEFORE = st.one_of(st.just(""), affix.map(lambda a: a + "_"))
_AFTER = st.one_of(st.just(""), affix.map(lambda a: "." + a))


@st.composite
def secret_names(draw: st.DrawFn) -> str:
    word = draw(words)
    flips = draw(_FLIPS[len(word)])
    return draw(affix) + _case(word, flips) + draw(affix)


@st.composite
def secret_part_names(draw: st.DrawFn) -> str:
    """A name holding a secret's word as a whole part: MYSQL_PWD, db.pass, X-CREDS."""
    part = draw(_PART)
    flips = draw(_FLIPS[len(part)])
    before = draw(_BEFORE)
    after = draw(_AFTER)
    name = before + _case(part, flips) + after
    assume(name.upper() not in NOT_SECRET_NAMES)
    return name


plain_names = st.text(NAME_CHARS, min_size=1, max_size=20).filter(lambda n: not looks_secret(n))
values = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=40)


def _model(env: dict[str, Any]) -> Any:
    return parse_model(
        {
            "name": "m",
            "source": "org/m",
            "profiles": [{"name": "p", "gpu_class": "T4", "tp": 1, "env": env}],
        }
    )


@given(secret_names(), values)
def test_a_plain_value_under_a_secrets_name_is_refused_naming_the_fix(
    name: str, value: str
) -> None:
    model = _model({name: value})
    with pytest.raises(CatalogError) as caught:
        check_no_plain_secrets(model.profiles, model.name)
    err = caught.value
    assert (err.model, err.profile, err.field) == ("m", "p", f"profiles.env.{name}")
    assert "{secret: " in err.message and "secrets_dir" in err.message
    # The message repeats the name (and a secret's name made of it), never the value: it
    # is the same whatever the value. (Looking for the value in the text is not enough: a
    # value such as "prof" stands in the fixed words "profile".)
    other = _model({name: "x" if value != "x" else "y"})
    with pytest.raises(CatalogError) as again:
        check_no_plain_secrets(other.profiles, other.name)
    assert again.value.message == err.message


@given(secret_part_names(), values)
def test_a_secret_word_as_a_part_of_the_name_is_refused_too(name: str, value: str) -> None:
    # MYSQL_PWD and DB_PASS hold passwords as surely as DB_PASSWORD does.
    model = _model({name: value})
    with pytest.raises(CatalogError) as caught:
        check_no_plain_secrets(model.profiles, model.name)
    assert caught.value.field == f"profiles.env.{name}"


@pytest.mark.parametrize(
    "name", ["PWD", "OLDPWD", "BYPASS_PROXY", "NCCL_P2P_PASSTHROUGH", "CREDSTORE_DIR", "COMPASS"]
)
def test_names_that_only_contain_a_parts_letters_are_not_secrets(name: str) -> None:
    model = _model({name: "/srv/x"})
    check_no_plain_secrets(model.profiles, model.name)


@given(
    st.one_of(secret_names(), secret_part_names(), plain_names, st.sampled_from(NOT_SECRET_NAMES))
)
def test_the_api_documents_pattern_names_exactly_the_names_the_rule_refuses(name: str) -> None:
    # Clients read the schema's patternProperties (ECMA 262, searched unanchored) to know
    # which variables take only a reference; it must say what looks_secret says.
    assert bool(re.search(SECRET_NAMES_PATTERN, name)) == looks_secret(name)


@given(plain_names, values)
def test_a_plain_value_under_any_other_name_is_accepted(name: str, value: str) -> None:
    model = _model({name: value})
    check_no_plain_secrets(model.profiles, model.name)


@given(secret_names(), st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,40}", fullmatch=True))
def test_a_secret_by_reference_is_always_accepted(name: str, secret: str) -> None:
    model = _model({name: {"secret": secret}})
    check_no_plain_secrets(model.profiles, model.name)
    assert model.to_definition()["profiles"][0]["env"] == {name: {"secret": secret}}
    assert secret_name_problem(secret) is None
    assert env_var_for(secret).startswith("LLMGW_SECRET_")


@pytest.mark.parametrize("secret", ["", "../x", "/etc/shadow", ".hidden", "a/b", "x" * 129])
def test_a_reference_that_is_not_a_file_name_is_refused(secret: str) -> None:
    with pytest.raises(CatalogError, match="secrets_dir"):
        _model({"HF_TOKEN": {"secret": secret}})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["env", "a", "profiles", "path"]), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values, st.dictionaries(st.one_of(secret_names(), plain_names), values, max_size=5))
def test_redaction_leaves_no_plain_secret_value_under_any_env(
    around: Any, env: dict[str, str]
) -> None:
    shown = redact({"x": around, "engine": {"env": env}, "list": [{"env": env}]})
    for holder in (shown["engine"]["env"], shown["list"][0]["env"]):
        for name, value in holder.items():
            assert value == (REDACTED if looks_secret(name) else env[name])
    assert redact(around) == redact(redact(around))  # idempotent


def test_a_diff_entry_of_a_secret_env_variable_is_redacted() -> None:
    change = {"path": "profiles[t4].env.HF_TOKEN", "before": "a-value", "after": "b-value"}
    assert redact(change) == {**change, "before": REDACTED, "after": REDACTED}
    dotted = {"path": 'profiles[t4].env["MY.API_KEY"]', "before": None, "after": "v"}
    assert redact(dotted)["after"] == REDACTED
    plain = {"path": "profiles[t4].env.LOG_LEVEL", "before": "a", "after": "b"}
    assert redact(plain) == plain


def test_the_declared_file_is_held_to_the_same_rule_and_says_where_to_edit(
    tmp_path: Path,
) -> None:
    path = tmp_path / "catalog.yaml"
    model: dict[str, Any] = {
        "name": "m",
        "source": "org/m",
        "profiles": [{"name": "p", "gpu_class": "T4", "env": {"HF_TOKEN": "hf_abcdefgh"}}],
    }
    path.write_text(dump_yaml({"models": [model]}))
    with pytest.raises(CatalogError) as caught:
        load_declared(path)
    assert caught.value.message.startswith(f"{path}: model 'm' profile 'p': env HF_TOKEN")
    assert "hf_abcdefgh" not in caught.value.message
    model["profiles"][0]["env"] = {"HF_TOKEN": {"secret": "hf-token"}}
    path.write_text(dump_yaml({"models": [model]}))
    found = load_declared(path).resolve("m")
    assert found is not None
    assert json.dumps(found.to_definition())
