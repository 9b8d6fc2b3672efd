"""Where the database and the declared configuration are, from flags or the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from events.db import DEFAULT_URL

DEFAULT_CONFIG = Path("catalog.yaml")


# A snapshot key shorter than this is a placeholder, not a secret.
MIN_SNAPSHOT_KEY = 16


class SettingsError(ValueError):
    """A setting that cannot be used; the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class Settings:
    database_url: str
    # None: no declared models (no file given and no ./catalog.yaml).
    config_path: Path | None
    # LLMGW_SNAPSHOT_KEY, held outside the database: snapshots are MACed with it,
    # and one that does not match is refused at start-up (events.snapshots).
    snapshot_key_text: str | None = field(default=None, repr=False)

    @property
    def snapshot_key(self) -> bytes | None:
        text = self.snapshot_key_text
        if not text:
            return None
        if len(text) < MIN_SNAPSHOT_KEY:
            raise SettingsError(
                f"LLMGW_SNAPSHOT_KEY is {len(text)} characters: a snapshot key needs at least "
                f"{MIN_SNAPSHOT_KEY} (e.g. the output of `openssl rand -hex 32`), or unset it"
            )
        return text.encode("utf-8")

    @classmethod
    def resolve(cls, db: str | None = None, config: str | None = None) -> Settings:
        url = db or os.environ.get("LLMGW_DATABASE_URL") or DEFAULT_URL
        config_value = config or os.environ.get("LLMGW_CONFIG")
        if config_value:
            path: Path | None = Path(config_value)
        else:
            path = DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None
        key = os.environ.get("LLMGW_SNAPSHOT_KEY")
        return cls(database_url=url, config_path=path, snapshot_key_text=key)
