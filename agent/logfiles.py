"""Engine logs kept to a bounded size on disk, by copy-and-truncate.

An engine writes its log through a descriptor it inherited at spawn (opened
for appending), and it must outlive the agent, so the agent cannot rename the
file and reopen a new one for it: the engine would keep writing to the renamed
file. Instead, once a log passes its size limit, its content is copied to
``NAME.1`` (older copies shift to ``.2`` ... ``.KEEP``, the oldest dropped) and
the file is truncated in place. Because the engine appends, its next write
lands at the new end. What an engine writes between the copy and the
truncation is lost: a few lines at most, once per rotation; logrotate's
``copytruncate`` makes the same trade for the same reason.

Every file is opened without following links (``agent.safefs``): a link planted
at an engine's log must not make a rotation truncate the link's target, nor a
link at ``NAME.1`` receive the copy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import structlog

from agent.safefs import UnsafeFile, copy_atomically, open_regular

log = structlog.get_logger("llmgw.agent")


@dataclass(frozen=True, slots=True)
class LogLimits:
    """Rotate a log past ``max_bytes``; keep ``keep`` older copies (0 keeps none)."""

    max_bytes: int = 100 * 1024 * 1024
    keep: int = 3


def rotated(path: Path, index: int) -> Path:
    return path.with_name(f"{path.name}.{index}")


def rotate_if_large(path: Path, limits: LogLimits) -> bool:
    """Rotate ``path`` when it is larger than the limit; whether it was rotated.

    A log that cannot be read or written (gone, permissions) is left as it is:
    a full disk is the operator's to fix, and the next tick tries again. One
    that is not a regular file (a link, a FIFO) is refused and named.
    """
    try:
        fd = open_regular(path, os.O_RDWR)
    except UnsafeFile as exc:
        log.warning("agent.log_refused", path=str(path), reason=str(exc))
        return False
    except OSError:
        return False
    try:
        if os.fstat(fd).st_size <= limits.max_bytes:
            return False
        if limits.keep > 0:
            rotated(path, limits.keep).unlink(missing_ok=True)
            for index in range(limits.keep - 1, 0, -1):
                older = rotated(path, index)
                if os.path.lexists(older):
                    # A rename moves a link itself, never what it points to.
                    older.replace(rotated(path, index + 1))
            copy_atomically(rotated(path, 1), fd)
        # Truncated through this descriptor of our own: the engine's stays valid and,
        # opened with O_APPEND, writes at the new end.
        os.ftruncate(fd, 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
