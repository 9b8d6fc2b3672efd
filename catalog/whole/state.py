"""The catalog as it changes: declared models plus runtime additions, checked incrementally.

Replay and the write commands both ask the same question, "may this change be
made to what is already accepted?", thousands of times in a row. Rebuilding
and revalidating the whole catalog for each would make replay quadratic, so
this keeps the indexes a check needs (every name and alias, and who falls
back to whom) and answers in time proportional to the change, not to the
catalog. The rules between models are ``Catalog.build``'s, the same code
(catalog.whole.rules), judged against these indexes instead of an empty catalog.

Configuration wins every conflict, and the direction matters: a request for
a reviewed production model must never be answered by something added from a
laptop, so a runtime model colliding with a declared name is refused, and a
declared model cannot be removed at runtime (it would return on the next
restart, leaving the cluster disagreeing with its own configuration file).
"""

from __future__ import annotations

from collections.abc import Sequence

from catalog.definition.identifiers import fold
from catalog.definition.model import Model
from catalog.errors import NotInCatalog, RuleConflict
from catalog.whole.catalog import Catalog
from catalog.whole.rules import (
    Accepted,
    check_batch,
    check_not_accepted,
    missing_fallback_of_change,
)


class CatalogState:
    """Mutable working state; ``snapshot()`` hands out an immutable ``Catalog``.

    ``check_*`` methods never mutate; ``add`` and ``remove`` apply a change that
    a check accepted. Models passed in must already be normalised and validated
    (``parse_model`` does both).
    """

    def __init__(self, declared: Catalog, *, config_path: str = "catalog.yaml") -> None:
        self._config_path = config_path
        self._declared = declared.declared_names
        self._models: dict[str, Model] = {m.name: m for m in declared.models()}
        self._index: dict[str, str] = {}
        # Every name and alias by its case-folded form, to the string as written:
        # names and aliases are unique regardless of case (catalog.definition.identifiers).
        self._folded: dict[str, str] = {}
        # canonical target -> names of the models that fall back to it; what a
        # removal must consult, kept so that consulting it is one lookup.
        self._dependents: dict[str, set[str]] = {}
        for model in self._models.values():
            self._index_model(model)
        for model in self._models.values():
            self._link_fallbacks(model)

    @property
    def config_path(self) -> str:
        return self._config_path

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __len__(self) -> int:
        return len(self._models)

    def is_declared(self, name: str) -> bool:
        return self._index.get(name) in self._declared

    def resolve(self, name: str) -> Model | None:
        canonical = self._index.get(name)
        return None if canonical is None else self._models[canonical]

    def holder(self, name: str) -> tuple[str, Model] | None:
        """The name or alias, as written, that ``name`` would collide with (regardless
        of case), and the model holding it; None if ``name`` is free."""
        written = self._folded.get(fold(name))
        return None if written is None else (written, self._models[self._index[written]])

    def snapshot(self) -> Catalog:
        """The catalog as it is now (a copy: the read model, events.read.model, caches it)."""
        return Catalog(self._models, self._index, self._declared)

    def runtime_models(self) -> tuple[Model, ...]:
        """The models added at runtime, in the order they were accepted: with the
        declared catalog, everything needed to rebuild this state (``restore``)."""
        return tuple(m for name, m in self._models.items() if name not in self._declared)

    @classmethod
    def restore(
        cls,
        declared: Catalog,
        runtime: Sequence[Model],
        *,
        config_path: str = "catalog.yaml",
    ) -> CatalogState:
        """The state holding ``declared`` and then ``runtime``, added in that order.

        For state saved earlier (a snapshot): each model is checked as an
        addition again, which is cheap, so a saved state that does not fit the
        declared catalog is refused with ``CatalogError`` rather than trusted.
        """
        state = cls(declared, config_path=config_path)
        # Judged as one batch rather than one at a time: a replacement may
        # point a model's fallback at one accepted after it (or form a cycle,
        # as declared models may), which is valid as a whole but not as a
        # sequence of additions in this order.
        state._check_batch(runtime)
        for model in runtime:
            state._models[model.name] = model
            state._index_model(model)
        for model in runtime:
            state._link_fallbacks(model)
        return state

    # -- adding -----------------------------------------------------------

    def check_add(self, models: Sequence[Model]) -> tuple[Model, ...]:
        """Refuse an addition that would leave the catalog invalid.

        A list is judged as a whole (all or nothing), and a fallback may name
        another model of the same list. Returns the models in an order in which
        each one's fallbacks are already present, so that the additions can be
        recorded, and later replayed, one model at a time.
        """
        if len(models) == 1 and self._fits(models[0]):
            return (models[0],)
        return _dependency_order(models, self._check_batch(models))

    def _fits(self, model: Model) -> bool:
        """Whether one model passes ``check_batch`` against this state: the same
        conditions, checked with a few look-ups and no bookkeeping (replay asks it
        of every stored add). False sends the model through ``check_batch``, which
        then refuses it in its usual words."""
        folded = self._folded
        name = model.name
        taken = {fold(name)}
        if fold(name) in folded:
            return False
        for alias in model.aliases:
            key = fold(alias)
            if key in taken or key in folded:
                return False
            taken.add(key)
        index = self._index
        return all(f in index or f == name or f in model.aliases for f in model.fallbacks)

    def add_if_fits(self, model: Model) -> bool:
        """``check_add([model])`` then ``add(model)`` when the model fits by look-ups
        (``_fits``'s conditions, written out); False, changing nothing, when it does
        not: the caller then asks ``check_add``, which refuses it in its usual words.
        Replay applies nearly every stored add this way, so it is one call."""
        name = model.name
        key = name.casefold()  # catalog.definition.identifiers.fold
        folded = self._folded
        if key in folded:
            return False
        aliases = model.aliases
        if aliases:
            keys = [alias.casefold() for alias in aliases]
            if key in keys or len(set(keys)) != len(keys) or any(k in folded for k in keys):
                return False
        index = self._index
        fallbacks = model.fallbacks
        for f in fallbacks:
            if f not in index and f != name and f not in aliases:
                return False
        # add(model), written out.
        self._models[name] = model
        index[name] = name
        folded[key] = name
        if aliases:
            for alias, alias_key in zip(aliases, keys, strict=True):
                index[alias] = name
                folded[alias_key] = alias
        for f in fallbacks:
            target = index[f]
            if target != name:
                self._dependents.setdefault(target, set()).add(name)
        return True

    def _check_batch(self, models: Sequence[Model]) -> dict[str, str]:
        """The names and fallbacks of ``models`` checked as one batch (catalog.whole.rules):
        the batch's names and aliases (each mapped to its model) when all is well."""
        return check_batch(models, self._accepted(), change=True)[1]

    def _accepted(self) -> Accepted:
        return Accepted(self._index, self._folded, self._declared, self._config_path)

    def add(self, model: Model) -> None:
        """Apply one addition that ``check_add`` accepted."""
        self._models[model.name] = model
        self._index_model(model)
        self._link_fallbacks(model)

    # -- replacing --------------------------------------------------------

    def check_replace(self, model: Model) -> Model:
        """Refuse a replacement that would leave the catalog invalid; returns the
        definition it replaces.

        Judged as an addition is, against the catalog as it would be after the
        change: the new aliases must be free (or already this model's), every
        fallback must resolve without the aliases the new definition drops, and
        no other model may be left falling back to a dropped alias. One event
        replaces the definition, so there is no moment at which the model is
        missing, as there is between a removal and an addition.
        """
        name = model.name
        canonical = self._index.get(name)
        if canonical is None:
            raise NotInCatalog(
                f"model {name!r} is not in the catalog; nothing to replace (add it instead)",
                model=name,
            )
        if canonical != name:
            raise RuleConflict(
                f"{name!r} is an alias of model {canonical!r}; replace the model by its name",
                model=canonical,
                field="name",
            )
        if name in self._declared:
            raise RuleConflict(
                f"model {name!r} is declared in {self._config_path} and cannot be replaced at "
                f"runtime: the declared definition would return on the next restart. Change "
                f"it in {self._config_path} instead",
                model=name,
            )
        old = self._models[name]
        for alias in model.aliases:
            found = self.holder(alias)  # regardless of case: its own alias may change case
            if found is None or found[1].name != name:
                check_not_accepted(alias, name, alias, self._accepted())
        dropped = set(old.aliases) - set(model.aliases)
        own = {name, *model.aliases}
        for fallback in model.fallbacks:
            if fallback not in own and (fallback not in self._index or fallback in dropped):
                raise RuleConflict(
                    missing_fallback_of_change(name, fallback),
                    model=name,
                    field="fallbacks",
                )
        stranded = self.alias_dependents(name, dropped)
        if stranded:
            names = ", ".join(repr(d) for d in stranded)
            gone = ", ".join(repr(a) for a in sorted(dropped))
            raise RuleConflict(
                f"model {name!r}: the new definition drops alias {gone}, but {names} "
                f"{'falls' if len(stranded) == 1 else 'fall'} back to it by that name, and a "
                "fallback pointing at nothing is discovered during the outage it was meant "
                "to cover; keep the alias, or change their fallbacks first",
                model=name,
                field="aliases",
            )
        return old

    def alias_dependents(self, name: str, aliases: set[str]) -> list[str]:
        """The other models that fall back to model ``name`` by one of ``aliases``, sorted."""
        if not aliases:
            return []
        return sorted(
            d
            for d in self._dependents.get(name, ())
            if any(f in aliases for f in self._models[d].fallbacks)
        )

    def replace(self, model: Model) -> None:
        """Apply one replacement that ``check_replace`` accepted. The model keeps its
        place in the catalog's order, and the models falling back to it stay linked."""
        old = self._models[model.name]
        self._unlink_fallbacks(old)
        for alias in old.aliases:
            del self._index[alias]
            del self._folded[fold(alias)]
        self._models[model.name] = model
        self._index_model(model)
        self._link_fallbacks(model)

    # -- removing ---------------------------------------------------------

    def check_remove(self, name: str) -> None:
        """Refuse a removal that configuration forbids or that would strand a fallback."""
        canonical = self._index.get(name)
        if canonical is None:
            raise NotInCatalog(
                f"model {name!r} is not in the catalog; nothing to remove", model=name
            )
        if canonical != name:
            # Refused, not followed: a removal takes the model and every alias it has,
            # and an alias is often a role name that `apply` may have moved to another
            # model since the operator last looked. Naming the model itself says which
            # one goes; the refusal gives the exact command.
            raise RuleConflict(
                f"{name!r} is an alias of model {canonical!r}; remove the model by its name "
                f"(`llmgw remove {canonical}`, which also removes its aliases), or move the "
                f"alias with `llmgw apply` if only the alias should go",
                model=canonical,
                field="name",
            )
        if name in self._declared:
            raise RuleConflict(
                f"model {name!r} is declared in {self._config_path} and cannot be removed at "
                f"runtime: it would return on the next restart. Remove it from "
                f"{self._config_path} instead (a running `llmgw serve` or daemon takes the "
                "edit within a second, or at once on SIGHUP)",
                model=name,
            )
        dependents = sorted(self._dependents.get(name, ()))
        if dependents:
            names = ", ".join(repr(d) for d in dependents)
            raise RuleConflict(
                f"model {name!r} cannot be removed: {names} "
                f"{'falls' if len(dependents) == 1 else 'fall'} back to it, and a fallback "
                "pointing at nothing is discovered during the outage it was meant to cover; "
                "remove those models or change their fallbacks first",
                model=name,
                field="fallbacks",
            )

    def remove_if_allowed(self, name: str) -> bool:
        """``check_remove(name)`` then ``remove(name)`` when nothing refuses it; False,
        changing nothing, when something would: the caller then asks ``check_remove``,
        which refuses it in its usual words."""
        index = self._index
        if index.get(name) != name or name in self._declared or self._dependents.get(name):
            return False
        # remove(name), written out.
        model = self._models.pop(name)
        folded = self._folded
        del index[name]
        del folded[name.casefold()]  # catalog.definition.identifiers.fold
        for alias in model.aliases:
            del index[alias]
            del folded[alias.casefold()]
        if model.fallbacks:
            self._unlink_fallbacks(model)
        self._dependents.pop(name, None)  # an empty set, if any
        return True

    def remove(self, name: str) -> None:
        """Apply one removal that ``check_remove`` accepted."""
        model = self._models.pop(name)
        del self._index[name]
        del self._folded[fold(name)]
        for alias in model.aliases:
            del self._index[alias]
            del self._folded[fold(alias)]
        self._unlink_fallbacks(model)
        self._dependents.pop(name, None)

    # -- bookkeeping ------------------------------------------------------

    def _index_model(self, model: Model) -> None:
        self._index[model.name] = model.name
        self._folded[fold(model.name)] = model.name
        for alias in model.aliases:
            self._index[alias] = model.name
            self._folded[fold(alias)] = alias

    def _unlink_fallbacks(self, model: Model) -> None:
        for fallback in model.fallbacks:
            target = self._index.get(fallback)
            if target is not None:
                self._dependents.get(target, set()).discard(model.name)

    def _link_fallbacks(self, model: Model) -> None:
        for fallback in model.fallbacks:
            target = self._index[fallback]
            # Falling back to yourself strands nothing when you are removed.
            if target != model.name:
                self._dependents.setdefault(target, set()).add(model.name)


def _dependency_order(models: Sequence[Model], batch: dict[str, str]) -> tuple[Model, ...]:
    """Order a batch so each model follows the batch members it falls back to.

    The log records one event per model and replay judges each on its own, so
    a model must never be recorded before a fallback it needs. A cycle within
    one batch cannot be written that way and is refused.
    """
    if len(models) == 1:
        # One model is its own order: a fallback to itself is no cycle. (Replay
        # checks every stored add this way, one at a time.)
        return (models[0],)
    by_name = {m.name: m for m in models}
    ordered: list[Model] = []
    done: set[str] = set()
    # Depth-first with an explicit stack (no recursion limit on long chains):
    # each frame is a model and the fallbacks of it still to visit.
    for root in models:
        if root.name in done:
            continue
        path: list[str] = [root.name]
        stack = [iter(_batch_targets(by_name[root.name], batch))]
        while stack:
            target = next(stack[-1], None)
            if target is None:
                stack.pop()
                name = path.pop()
                done.add(name)
                ordered.append(by_name[name])
            elif target in path:
                cycle = " -> ".join((*path[path.index(target) :], target))
                raise RuleConflict(
                    f"model {target!r}: fallbacks within this change form a cycle ({cycle}); "
                    "runtime additions are recorded one at a time, so add them in an order "
                    "that breaks it",
                    model=target,
                    field="fallbacks",
                )
            elif target not in done:
                path.append(target)
                stack.append(iter(_batch_targets(by_name[target], batch)))
    return tuple(ordered)


def _batch_targets(model: Model, batch: dict[str, str]) -> list[str]:
    """The other members of the batch that ``model`` falls back to, in the order written."""
    targets = (batch.get(f) for f in model.fallbacks)
    return [t for t in targets if t is not None and t != model.name]
