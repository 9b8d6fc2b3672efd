"""The catalog: the set of models the cluster should serve, immutable once built."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from catalog.errors import CatalogError
from catalog.identifiers import fold
from catalog.model import Model, normalize, validate


class Catalog:
    """An immutable set of models, resolvable by name or alias.

    Models keep their order: declared models in the order of the file, then
    runtime additions in the order they were accepted. ``declared`` names the
    models that came from configuration, which is what lets every reader tell a
    reviewed model from one added to try it.
    """

    __slots__ = ("_declared", "_index", "_models")

    def __init__(
        self,
        models: Mapping[str, Model],
        index: Mapping[str, str],
        declared: frozenset[str],
    ) -> None:
        # Trusted constructor: callers are `build` and `CatalogState.snapshot`,
        # which have already enforced every rule. Copies keep it immutable.
        self._models = dict(models)
        self._index = dict(index)
        self._declared = declared

    @classmethod
    def build(cls, models: Iterable[Model], *, declared: bool = True) -> Catalog:
        """Build a catalog, refusing definitions that would fail confusingly later.

        This is the whole-catalog check the declared file goes through: each
        model is normalised and validated, names are unique, aliases share one
        namespace with names, and every fallback resolves.
        """
        by_name: dict[str, Model] = {}
        # Every name and alias by its case-folded form, to the string as written:
        # unique regardless of case (catalog.identifiers).
        folded: dict[str, str] = {}
        for raw in models:
            model = normalize(raw)
            validate(model)
            if model.name in by_name:
                raise CatalogError(
                    f"model {model.name!r} is declared twice", model=model.name, field="name"
                )
            same = folded.get(fold(model.name))
            if same is not None:
                raise CatalogError(
                    f"model {model.name!r} differs from model {same!r} only in case; names "
                    "and aliases are unique regardless of case, so rename one",
                    model=model.name,
                    field="name",
                )
            by_name[model.name] = model
            folded[fold(model.name)] = model.name
        # Aliases share a namespace with names: a collision would silently
        # shadow a model at request time, so it has to fail when loading.
        index = {name: name for name in by_name}
        for name, model in by_name.items():
            for alias in model.aliases:
                if alias in by_name:
                    raise CatalogError(
                        f"model {name!r}: alias {alias!r} collides with another model's name",
                        model=name,
                        field="aliases",
                    )
                if alias in index:
                    raise CatalogError(
                        f"alias {alias!r} is claimed by both {index[alias]!r} and {name!r}",
                        model=name,
                        field="aliases",
                    )
                same = folded.get(fold(alias))
                if same is not None:
                    raise CatalogError(
                        f"model {name!r}: alias {alias!r} differs from {same!r} (of model "
                        f"{index[same]!r}) only in case; names and aliases are unique "
                        "regardless of case, so choose another alias",
                        model=name,
                        field="aliases",
                    )
                index[alias] = name
                folded[fold(alias)] = alias
        # Fallbacks are resolved now rather than at request time: a typo in a
        # fallback should stop a deployment, not surface during an outage when
        # the fallback is finally needed.
        for name, model in by_name.items():
            for fallback in model.fallbacks:
                if fallback not in index:
                    raise CatalogError(
                        f"model {name!r}: fallback {fallback!r} is not in the catalog",
                        model=name,
                        field="fallbacks",
                    )
        return cls(by_name, index, frozenset(by_name) if declared else frozenset())

    def resolve(self, name: str) -> Model | None:
        """The model a client-supplied name or alias refers to, or None."""
        canonical = self._index.get(name)
        return None if canonical is None else self._models[canonical]

    def canonical(self, name: str) -> str | None:
        return self._index.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __len__(self) -> int:
        return len(self._models)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Catalog):
            return NotImplemented
        return (
            list(self._models.items()) == list(other._models.items())
            and self._declared == other._declared
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking equality; never a dict key

    def models(self) -> tuple[Model, ...]:
        """Every model, declared ones first in file order, then runtime ones."""
        return tuple(self._models.values())

    def names(self) -> list[str]:
        """The canonical model names, sorted."""
        return sorted(self._models)

    def aliases_of(self, name: str) -> tuple[str, ...]:
        model = self.resolve(name)
        return () if model is None else model.aliases

    def is_declared(self, name: str) -> bool:
        return self._index.get(name) in self._declared

    @property
    def declared_names(self) -> frozenset[str]:
        return self._declared

    def fallbacks_of(self, name: str) -> tuple[str, ...]:
        """A model's fallbacks as canonical names, in the order written."""
        model = self.resolve(name)
        if model is None:
            return ()
        return tuple(self._index[f] for f in model.fallbacks)
