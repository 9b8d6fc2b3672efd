"""Where the database and the declared configuration are, from flags or the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from events.db import DEFAULT_URL

DEFAULT_CONFIG = Path("catalog.yaml")


@dataclass(frozen=True, slots=True)
class Settings:
    database_url: str
    # None: no declared models (no file given and no ./catalog.yaml).
    config_path: Path | None

    @classmethod
    def resolve(cls, db: str | None = None, config: str | None = None) -> Settings:
        url = db or os.environ.get("LLMGW_DATABASE_URL") or DEFAULT_URL
        config_value = config or os.environ.get("LLMGW_CONFIG")
        if config_value:
            path: Path | None = Path(config_value)
        else:
            path = DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None
        return cls(database_url=url, config_path=path)
