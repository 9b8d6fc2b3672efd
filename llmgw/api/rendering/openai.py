"""What OpenAI's clients expect of ``/v1/models``: errors in their shape, and ``created``.

OpenAI's SDKs read an error's message from ``{"error": {"message": ...}}``; handed a
problem document they show only the status. So under ``/v1/models`` (the one
OpenAI-compatible area of this API) errors take OpenAI's shape, with the problem's
kind as ``code`` so a program can still branch on it; everywhere else they stay
problem documents.

``created`` is when the model was added: the ``recorded_at`` of the last
``model.added`` event for it. A declared model has no such event; it answers 0
("unknown") rather than the process's start time, because two replicas of the
API started at different times would then disagree about the same model, and a
restart would make an old model look new.
"""

from __future__ import annotations

import threading
from typing import Any

from events.storage.history import HistoryQuery, history
from events.storage.sql_log import SqlLog

PREFIX = "/v1/models"
# OpenAI's error types, by HTTP status; anything else is an invalid request.
TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}


OPENAI_ERROR: dict[str, Any] = {
    "title": "OpenAIError",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string"},
            },
        }
    },
}


def is_openai(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def error_body(status: int, kind: str, detail: str) -> dict[str, Any]:
    return {
        "error": {
            "message": detail,
            "type": TYPES.get(status, "invalid_request_error"),
            "param": None,
            "code": kind,
        }
    }


class CreatedIndex:
    """Each runtime model's ``created`` (Unix seconds), kept up with the log incrementally:
    one query for the ``model.added`` events appended since the last look."""

    def __init__(self, store: SqlLog) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._position = 0
        self._created: dict[str, int] = {}

    def created(self, position: int) -> dict[str, int]:
        """As of log position ``position`` (the catalog view's); read-only to callers."""
        if position <= self._position:
            return self._created
        with self._lock:
            if position > self._position:
                added = dict(self._created)
                for event in history(
                    self._store.engine, HistoryQuery(type="model.added"), after=self._position
                ):
                    if event.position > position:
                        break
                    if event.model is not None:
                        added[event.model] = int(event.recorded_at.timestamp())
                self._created = added
                self._position = position
        return self._created
