"""The agent's state directory: one record per engine, so a restarted agent adopts its engines.

Engines run in sessions of their own and outlive the agent (an upgrade or a
crash of the agent must not take the node's replicas down). A restarted
agent reads these records and adopts each engine still running rather than
starting a duplicate on the same cards. A pid alone could have been reused
by an unrelated process since; the record also holds the process's start
time, its command line and a nonce the agent put in the engine's environment
(``LLMGW_ENGINE_NONCE``), and an engine is adopted only if all of them still
match (``agent.adoption``): a record forged to name an unrelated process is
refused, and that process left alone.

Records are written whole to a temporary file and renamed, so a crash never
leaves half a record; one that cannot be read is named and set aside, not
trusted. Nothing planted in the directory is followed or blocked on
(``agent.safefs``), and the directory is refused at start-up when someone
else could change it. An engine's log path is derived from its key, never read
from a record: a record naming ``/etc/passwd`` as its log cannot make the
agent send that file's end to the control plane.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import structlog

from agent.placements import Key
from agent.safefs import (
    UnsafeDir,
    UnsafeFile,
    check_dir,
    make_private_dir,
    open_regular,
    read_regular,
    write_atomically,
)

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
    # Put in the engine's environment as LLMGW_ENGINE_NONCE: what proves, at adoption,
    # that the process is the one this agent started ("" in records of older agents).
    nonce: str = ""
    # The model version the engine was started for ("" in a record from before versions).
    version: str = ""
    # What one request may use on the ready engine, as it said (agent.context), and
    # how many times it was asked (an engine that never says is not asked forever).
    context_tokens: int | None = None
    context_detail: str = ""
    context_asks: int = 0
    # The profile it was started with ("" in a record from before it was kept): reported
    # with the version, so a control plane that gave the node up can place it here again.
    profile: str = ""

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


__all__ = ["Record", "StateDir", "StateDirBusy", "UnsafeDir", "UnsafeFile"]

# The types of a record's fields, checked when it is read: a record is input too.
_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "replica": (int,),
    "fingerprint": (str,),
    "engine": (str,),
    "argv": (list,),
    "pid": (int,),
    "start_time": (int, float),
    "port": (int,),
    "endpoint": (str,),
    "devices": (list,),
    "started_at": (int, float),
    "restarts": (int,),
    "exited_at": (int, float, type(None)),
    "exit_code": (int, type(None)),
    "message": (str,),
    "ready": (bool,),
    "rank": (int,),
    "nnodes": (int,),
    "nonce": (str,),
    "version": (str,),
    "context_tokens": (int, type(None)),
    "context_detail": (str,),
    "context_asks": (int,),
    "profile": (str,),
}
_FIELDS = frozenset(f.name for f in fields(Record))
# Written by agents before the log path was derived from the key: read, never used.
_RETIRED = frozenset({"log_path"})


def record_of(raw: Any) -> Record:
    """A record from its JSON value, every field of its type (``ValueError`` otherwise)."""
    if not isinstance(raw, dict):
        raise ValueError("an engine record is a JSON object")
    unknown = sorted(set(raw) - _FIELDS - _RETIRED)
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}")
    values = {k: v for k, v in raw.items() if k in _FIELDS}
    for name, value in values.items():
        kinds = _TYPES[name]
        if isinstance(value, bool) and bool not in kinds:
            raise ValueError(f"{name} is {value!r}, not a {kinds[0].__name__}")
        if not isinstance(value, kinds):
            raise ValueError(f"{name} is {type(value).__name__}, not a {kinds[0].__name__}")
    if not all(isinstance(a, str) for a in values.get("argv", [])):
        raise ValueError("argv holds something other than strings")
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in values.get("devices", [])):
        raise ValueError("devices holds something other than card indices")
    values["argv"] = tuple(values.get("argv", ()))
    values["devices"] = tuple(values.get("devices", ()))
    try:
        return Record(**values)
    except TypeError as exc:  # a field missing
        raise ValueError(str(exc)) from None


class StateDir:
    def __init__(self, root: Path) -> None:
        self._lock_fd: int | None = None
        self.root = root
        self.engines = root / "engines"
        self.logs = root / "logs"

    def create(self) -> StateDir:
        """Create the directory (700) and its two subdirectories, and check them.

        ``UnsafeDir`` when someone else could change them: the message names the
        path and the fix.
        """
        make_private_dir(self.root)
        check_dir(self.root)
        for sub in (self.engines, self.logs):
            make_private_dir(sub)
            check_dir(sub)
        return self

    def lock(self) -> None:
        """Hold the directory for this process, or raise ``StateDirBusy``.

        Two agents on one state dir would both adopt the same engines and start
        and stop them against each other. The lock is an flock on a file: the
        system drops it when the process ends, however it ends.
        """
        if self._lock_fd is not None:
            return
        fd = open_regular(self.root / "agent.lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StateDirBusy(
                f"state dir {self.root} is used by another agent (pid {holder[:12]}); "
                "stop it, or give this one its own --state-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def log_path(self, key: Key) -> Path:
        return self.logs / f"{_slug(key)}.log"

    def record_path(self, key: Key) -> Path:
        return self.engines / f"{_slug(key)}.json"

    def save(self, record: Record) -> None:
        write_atomically(
            self.record_path(record.key), json.dumps(asdict(record), sort_keys=True).encode()
        )

    def forget(self, key: Key) -> None:
        self.record_path(key).unlink(missing_ok=True)

    def load(self) -> list[Record]:
        """Every record that can be read; each one that cannot is named and set aside.

        A record is read only from a regular file under its own name: a link, a
        FIFO, an oversized file, a record of another key's name or of the wrong
        shape is refused (``agent.record_refused``) and renamed ``*.unreadable``.
        Temporary files a crash left behind are removed.
        """
        records = []
        for entry in sorted(os.scandir(self.engines), key=lambda e: e.name):
            path = Path(entry.path)
            if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                path.unlink(missing_ok=True)  # a write a crash interrupted (or a planted link)
                continue
            if not entry.name.endswith(".json"):
                continue
            try:
                raw = json.loads(read_regular(path, MAX_RECORD_BYTES))
                record = record_of(raw)
                expected = self.record_path(record.key)
                if expected != path:
                    raise ValueError(f"it holds {record.key}, whose record is {expected.name}")
                records.append(record)
            except (OSError, ValueError, RecursionError) as exc:
                log.warning("agent.record_refused", path=str(path), reason=str(exc))
                path.replace(path.with_suffix(".unreadable"))
        return records


def _slug(key: Key) -> str:
    # Model names are printable but may hold '/' (org/name); a file name may not.
    # The digest keeps two names that differ only there ("a/b", "a_b") apart.
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key.model)[:120]
    digest = hashlib.sha256(key.model.encode()).hexdigest()[:8]
    return f"{safe}-{digest}-{key.replica}"
