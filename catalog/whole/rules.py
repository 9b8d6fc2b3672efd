"""The rules between models, once: names and aliases unique (regardless of case), fallbacks resolve.

Two callers judge a batch of models by them: ``Catalog.build`` (the declared
file, a whole catalog from nothing) and ``CatalogState.check_add`` (a runtime
change, against what is already accepted). They differ only in what is
already there and in the words of a refusal, which say what the operator has
to edit (the file, or the change), so the rules are one function,
``check_batch``, and the words two tables.

Names and aliases share one namespace: a collision would silently shadow a
model at request time, so it has to fail when loading. Fallbacks are resolved
now rather than at request time: a typo in a fallback should stop a
deployment, not surface during an outage when the fallback is finally needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from catalog.definition.identifiers import fold
from catalog.definition.model import Model
from catalog.errors import CatalogError, RuleConflict


@dataclass(frozen=True, slots=True)
class Accepted:
    """What a batch is judged against: every accepted name and alias (as written ->
    its model), the same by case-folded form (-> as written), and the declared models."""

    index: Mapping[str, str] = field(default_factory=dict)
    folded: Mapping[str, str] = field(default_factory=dict)
    declared: frozenset[str] = frozenset()
    config_path: str = "catalog.yaml"


NOTHING = Accepted()


def check_batch(
    models: Iterable[Model],
    accepted: Accepted,
    *,
    change: bool,
    prepare: Callable[[Model], Model] | None = None,
) -> tuple[list[Model], dict[str, str]]:
    """Refuse a batch that would leave the catalog invalid; the batch's models and
    its names and aliases (each -> its model's name) when all is well.

    ``change``: the batch is a runtime change to ``accepted`` (refused with
    ``RuleConflict``, in the words of a change); otherwise it is a declared file
    (``CatalogError``, in the words of the file). ``prepare`` (normalise and
    validate) is applied to each model as its name is checked, so the first
    problem in file order is the one reported.
    """
    words = _CHANGE if change else _FILE
    batch: dict[str, str] = {}  # name or alias within the batch -> its model
    taken: dict[str, str] = {}  # the same, case-folded -> as written
    prepared: list[Model] = []
    for raw in models:
        model = raw if prepare is None else prepare(raw)
        _check_free(model.name, model.name, None, batch, taken, accepted, words)
        prepared.append(model)
        batch[model.name] = model.name
        taken[fold(model.name)] = model.name
    for model in prepared:
        for alias in model.aliases:
            _check_free(alias, model.name, alias, batch, taken, accepted, words)
            batch[alias] = model.name
            taken[fold(alias)] = alias
    for model in prepared:
        for fallback in model.fallbacks:
            if fallback not in accepted.index and fallback not in batch:
                raise words.error(
                    words.missing_fallback(model.name, fallback),
                    model=model.name,
                    field="fallbacks",
                )
    return prepared, batch


def missing_fallback_of_change(name: str, fallback: str) -> str:
    return (
        f"model {name!r}: fallback {fallback!r} is not in the catalog; "
        "add it first or correct the name (a typo in a fallback should stop "
        "the change, not surface during an outage)"
    )


def _check_free(  # noqa: PLR0917  (the batch's bookkeeping, passed down as it is)
    name: str,
    owner: str,
    alias: str | None,
    batch: dict[str, str],
    taken: dict[str, str],
    accepted: Accepted,
    words: _Words,
) -> None:
    key = fold(name)
    if key in taken:
        raise words.error(
            words.in_batch(name, owner, alias, batch, taken[key]),
            model=owner,
            field="aliases" if alias is not None else "name",
        )
    check_not_accepted(name, owner, alias, accepted)


def check_not_accepted(name: str, owner: str, alias: str | None, accepted: Accepted) -> None:
    """Refuse ``name`` (the name of model ``owner``, or its ``alias``) if it is already
    accepted, regardless of case."""
    written = accepted.folded.get(fold(name))
    if written is not None:
        raise RuleConflict(
            _accepted_collision(name, owner, alias, written, accepted),
            model=owner,
            field="aliases" if alias is not None else "name",
        )


def _accepted_collision(
    name: str, owner: str, alias: str | None, written: str, accepted: Accepted
) -> str:
    """A change colliding with what is already accepted (a declared file has nothing accepted)."""
    what = f"alias {name!r}" if alias is not None else "the name"
    holder = accepted.index[written]
    role = "name" if holder == written else "alias"
    if written != name:
        # Unique regardless of case: `LLAMA-70B` beside `llama-70b` is one name to
        # a person and two to the router.
        role += f" (as {written!r}, differing only in case)"
    config = accepted.config_path
    if holder in accepted.declared:
        return (
            f"model {owner!r}: {what} is already the {role} of declared model {holder!r} "
            f"in {config}, and configuration wins every conflict; choose "
            f"another {'alias' if alias is not None else 'name'}, or change the declared model "
            f"in {config}"
        )
    if alias is None and holder == name == written:
        return (
            f"model {owner!r} is already in the catalog (added at runtime); apply the new "
            "definition to replace it (llmgw apply, PUT /v1/catalog/models/NAME)"
        )
    return (
        f"model {owner!r}: {what} is already the {role} of model {holder!r}; names and "
        "aliases share one namespace, so choose another"
    )


@dataclass(frozen=True, slots=True)
class _Words:
    error: type[CatalogError]
    # (name, owner, alias or None, the batch so far, the colliding name as written)
    in_batch: Callable[[str, str, str | None, dict[str, str], str], str]
    missing_fallback: Callable[[str, str], str]


def _file_in_batch(
    name: str, owner: str, alias: str | None, batch: dict[str, str], was: str
) -> str:
    if alias is None:
        if name in batch:
            return f"model {name!r} is declared twice"
        return (
            f"model {name!r} differs from model {was!r} only in case; names "
            "and aliases are unique regardless of case, so rename one"
        )
    if alias in batch and batch[alias] == alias:
        return f"model {owner!r}: alias {alias!r} collides with another model's name"
    if alias in batch:
        return f"alias {alias!r} is claimed by both {batch[alias]!r} and {owner!r}"
    return (
        f"model {owner!r}: alias {alias!r} differs from {was!r} (of model "
        f"{batch[was]!r}) only in case; names and aliases are unique "
        "regardless of case, so choose another alias"
    )


def _change_in_batch(
    name: str, owner: str, alias: str | None, batch: dict[str, str], was: str
) -> str:
    what = f"alias {name!r}" if alias is not None else "the name"
    return (
        f"model {owner!r}: {what} is used twice in this change "
        f"(also by {batch[was]!r}, regardless of case); names and aliases share one "
        "namespace"
    )


_FILE = _Words(
    CatalogError,
    _file_in_batch,
    lambda name, fallback: f"model {name!r}: fallback {fallback!r} is not in the catalog",
)
_CHANGE = _Words(RuleConflict, _change_in_batch, missing_fallback_of_change)
