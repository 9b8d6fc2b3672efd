"""The one grammar for every identifier the control plane stores, matches and prints.

Names are keys: clients request a model by name, agents report nodes by name,
the scheduler matches GPU classes and labels by string equality, and every
one of them is printed in tables an operator reads. So each kind of name has
a grammar, checked here and nowhere else, for every path (the declared file,
a runtime file, an API body, a node report, a stored event on replay):

- **Printable** (``catalog.forms.printable``: ``str.isprintable`` at a fixed Unicode
  version). No control, format, bidi, zero-width, private-use, unassigned or
  line-separator characters: a name ``x\\ny`` forged a row of ``llmgw
  history``, and a U+202E made a name read backwards.
- **ASCII for names that are matched.** ``llаma-3.1-70b`` with a Cyrillic
  ``а`` is a different model that looks the same in every font. Refusing
  mixed scripts would still let a whole-Cyrillic look-alike through, and a
  confusables table is large and changes with Unicode; every real model id
  (HuggingFace ``org/name``, an Ollama-style ``name:tag``, an OpenAI id) is
  ASCII, so ASCII is the rule. Free text (a reason) and actors (people's
  names) may be any printable Unicode.
- **Lengths that fit the columns** (events.database.tables, scheduler.persistence.tables): a name
  longer than its column was a ``StringDataRightTruncation`` on PostgreSQL and
  was stored whole on SQLite.
- **Unique regardless of case** across model names and aliases (and profile
  names within a model), checked where uniqueness is (Catalog.build,
  CatalogState): ``LLAMA-70B`` beside an alias ``llama-70b`` is one name to a
  person reading a dashboard and two to the router.

Pure: no I/O. The README's "Hostile input: identifiers" is this module as a table.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from catalog.errors import CatalogError
from catalog.forms.printable import first_unprintable, printable
from catalog.forms.text import shown

if TYPE_CHECKING:
    from catalog.definition.model import Model, Profile


class IdentifierError(CatalogError):
    """A value that breaks the identifier grammar: the request is invalid, not refused by a rule."""


@dataclass(frozen=True, slots=True)
class Grammar:
    """One kind of identifier: what it is called, its characters and its length."""

    what: str
    max_length: int
    # The characters after the first; None for printable Unicode (free text).
    pattern: re.Pattern[str] | None
    allowed: str
    example: str
    may_be_empty: bool = False
    # Free text whose spaces at the ends would make it unmatchable (an actor filter).
    trimmed: bool = False

    def problem(self, value: object) -> str | None:
        """Why ``value`` breaks this grammar, in words an operator can act on; None if not."""
        if not isinstance(value, str):
            return f"must be a string, not {type(value).__name__}"
        # The common case in one step (replay checks every name of every stored
        # add): a match of the pattern is ASCII, printable and well-formed.
        pattern = self.pattern
        if pattern is not None and len(value) <= self.max_length and pattern.fullmatch(value):
            return None
        if not value:
            if self.may_be_empty:
                return None
            return f"is empty; give one, such as {self.example}"
        if len(value) > self.max_length:
            return (
                f"is {len(value)} characters long; at most {self.max_length} are allowed, "
                "so shorten it"
            )
        culprit = first_unprintable(value)  # catalog.forms.printable: the one rule
        if culprit is not None:
            i, ch = culprit
            return (
                f"contains {_describe(ch)} at index {i}, which cannot be printed; "
                f"a {self.what} is {self.allowed}"
            )
        if self.pattern is None:
            if self.trimmed and value != value.strip():
                return "has leading or trailing spaces; nobody would type them to match it"
            return None
        if not value.isascii():
            ch = next(c for c in value if not c.isascii())
            return (
                f"contains {_describe(ch)}, which is not ASCII (a look-alike of an ASCII "
                f"letter would name a different thing that reads the same); a {self.what} "
                f"is {self.allowed}"
            )
        if self.pattern.fullmatch(value) is None:
            return f"is not {self.allowed}, such as {self.example}"
        return None


_KINDS = {
    "Cc": "a control character",
    "Cf": "a format character (bidi, zero-width or invisible)",
    "Cs": "a lone surrogate",
    "Co": "a private-use character",
    "Cn": "an unassigned code point",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
    "Zs": "a space other than the ASCII space",
}


def _describe(ch: str) -> str:
    name = unicodedata.name(ch, "") or _KINDS.get(unicodedata.category(ch), "")
    return f"U+{ord(ch):04X}" + (f" ({name})" if name else "")


def _token(extra: str) -> re.Pattern[str]:
    """Letters and digits at both ends, and ``extra`` characters between them."""
    return re.compile(rf"[A-Za-z0-9](?:[A-Za-z0-9{re.escape(extra)}]*[A-Za-z0-9])?")


# A HuggingFace id is `org/name` with at most 96 characters a part (193 in
# all); Ollama-style tags add `:`. 200 fits both and leaves the 255-character
# model columns room.
MODEL_NAME = Grammar(
    "model name",
    200,
    _token("._-:/"),
    "ASCII letters, digits and . _ - : / (starting and ending with a letter or digit)",
    "'meta-llama/Llama-3.1-70B-Instruct' or 'llama3.1:70b'",
)
ALIAS = Grammar("alias", MODEL_NAME.max_length, MODEL_NAME.pattern, MODEL_NAME.allowed, "'llama'")
PROFILE_NAME = Grammar(
    "profile name",
    63,
    _token("._-"),
    "ASCII letters, digits and . _ - (starting and ending with a letter or digit)",
    "'a100-tp4'",
)
# Matched against node reports and stored in 64-character columns.
GPU_CLASS = Grammar(
    "GPU class",
    64,
    _token("._-"),
    "ASCII letters, digits and . _ - (starting and ending with a letter or digit)",
    "'A100' or 'H100-80GB'",
)
ENGINE = Grammar("engine", 64, _token("._-"), PROFILE_NAME.allowed, "'vllm'")
ROUTING_PROFILE = Grammar(
    "routing profile", 64, _token("._-"), PROFILE_NAME.allowed, "'latency'", may_be_empty=True
)
# A host name (RFC 1123: at most 253 characters), which is what agents report.
NODE_NAME = Grammar(
    "node name",
    253,
    _token("._-"),
    "ASCII letters, digits and . _ - (starting and ending with a letter or digit), as a host name",
    "'gpu-7' or 'node01.dc1'",
)
FABRIC = Grammar("fabric", 128, _token("._-:/"), MODEL_NAME.allowed, "'ib-pod-3'")
# Kubernetes-style: an optional `prefix/` then a name; values may be empty.
LABEL_KEY = Grammar(
    "label key",
    128,
    _token("._-/"),
    "ASCII letters, digits and . _ - / (starting and ending with a letter or digit)",
    "'zone' or 'nvidia.com/gpu.product'",
)
LABEL_VALUE = Grammar(
    "label value",
    128,
    _token("._-:/"),
    MODEL_NAME.allowed,
    "'eu-west-1'",
    may_be_empty=True,
)
# People's names: any printable Unicode. 128 fits the 255-character column.
ACTOR = Grammar(
    "actor",
    128,
    None,
    "printable text on one line",
    "'alice'",
    may_be_empty=True,
    trimmed=True,
)
# `#` is reserved: the log names a keyed list's later events KEY#2, KEY#3
# (event_id, 200 characters), and a key `a#2` would collide with one of them.
KEY_PATTERN = r"^[!-\"$-~]{1,128}$"  # the API documents it as the header's pattern
IDEMPOTENCY_KEY = Grammar(
    "idempotency key",
    128,
    re.compile(r"[!-\"$-~]+"),
    "printable ASCII without spaces or '#'",
    "'deploy-2026-12-01-1' or a UUID",
)
# The API's ?reason= has the same bound.
REASON = Grammar(
    "reason", 2000, None, "printable text on one line", "'try before review'", may_be_empty=True
)
# A weights path, a URL or a HuggingFace id: no grammar of ours, but printable and bounded.
SOURCE = Grammar("source", 1024, None, "printable text on one line", "'org/name'")


def check(
    grammar: Grammar,
    value: object,
    *,
    field: str,
    model: str | None = None,
    profile: str | None = None,
    who: str | Callable[[], str] = "",
) -> None:
    """Raise ``IdentifierError`` naming ``who`` (a model, a profile), the field and the fix.

    ``who`` may be a function: replay checks every name of every stored add, and
    the words are only needed for a refusal.
    """
    problem = grammar.problem(value)
    if problem is None:
        return
    subject = who() if callable(who) else who
    subject = f"{subject}: " if subject else ""
    raise IdentifierError(
        f"{subject}{field} {_brief(value)} {problem}",
        model=model,
        profile=profile,
        field=field,
    )


def _brief(value: object) -> str:
    """The offending value, escaped and cut short: it may be a megabyte of anything."""
    text = repr(value) if isinstance(value, str) else shown(value)
    return text if len(text) <= 64 else text[:48] + "..." + text[-12:]


def fold(name: str) -> str:
    """The key under which names and aliases are unique: ``LLAMA-70B`` and ``llama-70b`` are one."""
    return name.casefold()


def check_command(*, actor: str, reason: str, key: str | None) -> None:
    """What a change records beside its events: who, why, and the command's key."""
    check(ACTOR, actor, field="actor")
    check(REASON, reason, field="reason")
    if key is not None:
        check(IDEMPOTENCY_KEY, key, field="key")


def brief(value: object) -> str:
    """A name for a message, escaped and bounded (the quotes included)."""
    return _brief(value)


def check_model_names(
    model: Model, *, profiles_valid: bool = False, fields_valid: bool = False
) -> None:
    """Every identifier of a normalised definition; called by ``validate``.

    Runs on every stored event replay reads, so a row written before this
    grammar is skipped and named like any other invalid event, and a declared
    file holding such a name is refused when it is loaded, naming the file and
    ``models[i]``.
    """
    name = model.name

    def who() -> str:
        return f"model {_brief(name)}"

    check(MODEL_NAME, name, field="name", model=name, who="a model")
    check(SOURCE, model.source, field="source", model=name, who=who)
    if not fields_valid:  # the same routing profile passed before (validate)
        check(ROUTING_PROFILE, model.routing_profile, field="routing_profile", model=name, who=who)
    taken = {fold(name): "the model's own name"}
    for alias in model.aliases:
        check(ALIAS, alias, field="aliases", model=name, who=who)
        other = taken.get(fold(alias))
        if other is not None:
            raise IdentifierError(
                f"{who()}: alias {alias!r} is {other} again, differing at most in case; names "
                "and aliases are unique regardless of case, so drop it or choose another",
                model=name,
                field="aliases",
            )
        taken[fold(alias)] = f"alias {alias!r}"
    for fallback in model.fallbacks:
        check(MODEL_NAME, fallback, field="fallbacks", model=name, who=who)
    if profiles_valid:
        # The same list of profiles passed these checks before
        # (catalog.definition.model_rules.validate).
        return
    profiles: dict[str, str] = {}
    for p in model.profiles:

        def where(p: Profile = p) -> str:
            return f"{who()} profile {_brief(p.name)}"

        check(
            PROFILE_NAME, p.name, field="profiles.name", model=name, profile=p.name[:255], who=who
        )
        earlier = profiles.get(fold(p.name))
        if earlier is not None and earlier != p.name:
            raise IdentifierError(
                f"{where()}: differs from profile {earlier!r} only in case; profile names are "
                "unique within a model regardless of case",
                model=name,
                profile=p.name,
                field="profiles.name",
            )
        profiles[fold(p.name)] = p.name
        check(ENGINE, p.engine, field="engine", model=name, profile=p.name, who=where)
        if p.gpu_class:
            check(GPU_CLASS, p.gpu_class, field="gpu_class", model=name, profile=p.name, who=where)
        for key, value in p.node_selector.items():
            check(LABEL_KEY, key, field="node_selector", model=name, profile=p.name, who=where)
            check(LABEL_VALUE, value, field="node_selector", model=name, profile=p.name, who=where)


_NAME_MATCH = MODEL_NAME.pattern.fullmatch  # type: ignore[union-attr]  # it has one
assert ALIAS.pattern is MODEL_NAME.pattern and ALIAS.max_length == MODEL_NAME.max_length


def plainly_valid(model: Model) -> bool:
    """Whether the names and source of a definition pass every check of them, in a few
    steps (``catalog.definition.model_rules.validate`` asks it of every stored add whose other
    fields passed before). Only sure answers: False runs the checks, which then
    refuse or accept as they always do.

    True only when each check would pass: the name, each alias and each fallback
    match the name grammar's pattern within its length (``Grammar.problem`` answers
    None at once then; aliases share it); the source is non-empty printable text
    within its length (SOURCE has no pattern: nothing else is checked); and the name
    and aliases differ regardless of case (so no alias is empty, spaced, the name
    itself or listed twice: ``validate``'s own checks of them pass too).
    """
    name = model.name
    source = model.source
    if not (
        type(name) is str
        and len(name) <= _NAME_MAX
        and _NAME_MATCH(name)
        and type(source) is str
        and 0 < len(source) <= _SOURCE_MAX
        # The one rule (catalog.forms.printable); printable ASCII, the common case, in C.
        and ((source.isascii() and source.isprintable()) or printable(source))
    ):
        return False
    aliases = model.aliases
    for alias in aliases:
        if not (type(alias) is str and len(alias) <= _NAME_MAX and _NAME_MATCH(alias)):
            return False
    if aliases and len({fold(name), *[fold(a) for a in aliases]}) != len(aliases) + 1:
        return False
    for fallback in model.fallbacks:
        if not (type(fallback) is str and len(fallback) <= _NAME_MAX and _NAME_MATCH(fallback)):
            return False
    return True


_NAME_MAX = MODEL_NAME.max_length
_SOURCE_MAX = SOURCE.max_length
assert SOURCE.pattern is None and not SOURCE.may_be_empty and not SOURCE.trimmed
