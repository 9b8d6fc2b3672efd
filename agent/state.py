"""The agent's state directory: one record per engine, so a restarted agent adopts its engines.

Engines run in sessions of their own and outlive the agent (an upgrade or a
crash of the agent must not take the node's replicas down). A restarted
agent reads these records and adopts each engine still running rather than
starting a duplicate on the same cards. A pid alone could have been reused
by an unrelated process since; the record also holds the process's start
time and command line, and an engine is adopted only if both still match.

Records are written whole to a temporary file and renamed, so a crash never
leaves half a record; one that cannot be read is named and set aside, not
trusted.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO

import structlog

from agent.placements import Key

log = structlog.get_logger("llmgw.agent")

MAX_RECORD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Record:
    model: str
    replica: int
    fingerprint: str
    engine: str
    argv: tuple[str, ...]
    pid: int
    start_time: float  # psutil's create_time of the process
    port: int
    endpoint: str
    devices: tuple[int, ...]
    log_path: str
    started_at: float  # wall clock, for the log
    restarts: int = 0
    # Set once the engine is known to have exited.
    exited_at: float | None = None
    exit_code: int | None = None
    message: str = ""
    ready: bool = False
    # This node's rank in a replica spanning ``nnodes`` nodes (0: the head, or alone).
    rank: int = 0
    nnodes: int = 1
    # What one request may use on the ready engine, as it said (agent.context), and
    # how many times it was asked (an engine that never says is not asked forever).
    context_tokens: int | None = None
    context_detail: str = ""
    context_asks: int = 0

    @property
    def key(self) -> Key:
        return Key(self.model, self.replica)

    @property
    def worker(self) -> bool:
        return self.rank > 0

    @property
    def alive(self) -> bool:
        return self.exited_at is None

    def exited(self, when: float, code: int | None, message: str) -> Record:
        return replace(self, exited_at=when, exit_code=code, message=message, ready=False)


class StateDirBusy(Exception):
    """Another agent holds the state dir."""


class StateDir:
    def __init__(self, root: Path) -> None:
        self._lock_file: IO[str] | None = None
        self.root = root
        self.engines = root / "engines"
        self.logs = root / "logs"

    def create(self) -> StateDir:
        self.engines.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        return self

    def lock(self) -> None:
        """Hold the directory for this process, or raise ``StateDirBusy``.

        Two agents on one state dir would both adopt the same engines and start
        and stop them against each other. The lock is an flock on a file: the
        system drops it when the process ends, however it ends.
        """
        if self._lock_file is not None:
            return
        self._lock_file = (self.root / "agent.lock").open("a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.seek(0)
            holder = self._lock_file.read(32).strip() or "unknown"
            raise StateDirBusy(
                f"state dir {self.root} is used by another agent (pid {holder}); "
                "stop it, or give this one its own --state-dir"
            ) from None
        self._lock_file.truncate(0)
        self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()

    def log_path(self, key: Key) -> Path:
        return self.logs / f"{_slug(key)}.log"

    def _path(self, key: Key) -> Path:
        return self.engines / f"{_slug(key)}.json"

    def save(self, record: Record) -> None:
        path = self._path(record.key)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(record), sort_keys=True))
        os.replace(tmp, path)

    def forget(self, key: Key) -> None:
        self._path(key).unlink(missing_ok=True)

    def load(self) -> list[Record]:
        records = []
        for path in sorted(self.engines.glob("*.json")):
            try:
                if path.stat().st_size > MAX_RECORD_BYTES:
                    raise ValueError(f"{path.stat().st_size} bytes is not an engine record")
                raw = json.loads(path.read_text())
                raw["argv"] = tuple(raw["argv"])
                raw["devices"] = tuple(raw["devices"])
                records.append(Record(**raw))
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.warning("agent.record_skipped", path=str(path), reason=str(exc))
                path.replace(path.with_suffix(".unreadable"))
        return records


def _slug(key: Key) -> str:
    # Model names are printable but may hold '/' (org/name); a file name may not.
    # The digest keeps two names that differ only there ("a/b", "a_b") apart.
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key.model)[:120]
    digest = hashlib.sha256(key.model.encode()).hexdigest()[:8]
    return f"{safe}-{digest}-{key.replica}"
