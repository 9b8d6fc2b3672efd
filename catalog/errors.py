"""The errors the catalog raises, carrying what an operator needs to act and what kind they are."""

from __future__ import annotations

from typing import ClassVar, Literal

# What a refusal is, for a caller that answers it (the API's status): the thing
# named does not exist; the change is valid but what is already in the catalog
# (or the log) refuses it; or the definition or request itself is malformed.
RefusalKind = Literal["not_found", "conflict", "invalid"]


class CatalogError(ValueError):
    """A definition or a change that the catalog refuses.

    The message is written for the operator who has to fix it: it names the
    model, the profile and the field, and says what to do. The structured
    attributes are there for programs (the CLI's JSON, an API's problem body);
    ``kind`` says which kind of refusal it is, so that no caller has to look at
    the catalog again to classify it.
    """

    kind: ClassVar[RefusalKind] = "invalid"

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        profile: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.model = model
        self.profile = profile
        self.field = field

    def __str__(self) -> str:
        return self.message


class NotInCatalog(CatalogError):
    """A change to a model the catalog does not hold (by name or alias)."""

    kind: ClassVar[RefusalKind] = "not_found"


class RuleConflict(CatalogError):
    """A valid definition or change refused by what the catalog already holds: a
    collision, a declared model, a fallback that does not resolve or would be stranded."""

    kind: ClassVar[RefusalKind] = "conflict"
