"""The catalog: the set of models the cluster should serve, immutable once built."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from catalog.definition.model import Model
from catalog.definition.model_rules import normalize, validate
from catalog.whole.rules import NOTHING, check_batch


def _prepared(raw: Model) -> Model:
    model = normalize(raw)
    validate(model)
    return model


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
        model is normalised and validated, then the rules between models
        (catalog.whole.rules, the same ones a runtime change is judged by): names
        are unique, aliases share one namespace with names, and every
        fallback resolves.
        """
        checked, index = check_batch(models, NOTHING, change=False, prepare=_prepared)
        by_name = {m.name: m for m in checked}
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
