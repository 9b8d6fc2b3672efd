"""The one error the catalog raises, carrying what an operator needs to act."""

from __future__ import annotations


class CatalogError(ValueError):
    """A definition or a change that the catalog refuses.

    The message is written for the operator who has to fix it: it names the
    model, the profile and the field, and says what to do. The structured
    attributes are there for programs (the CLI's JSON, an API's problem body).
    """

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
