"""Files in the agent's state directory opened so that nothing planted there can redirect them.

The state directory holds the agent's records and its engines' logs. Whoever
could write there could otherwise plant a symbolic link (and have the agent
overwrite or truncate the link's target with its own rights), a FIFO (and have
the agent block for ever opening it), or a file of any size. So every file is
opened with ``O_NOFOLLOW`` (a link is refused, not followed) and ``O_NONBLOCK``
(opening a FIFO returns at once), then checked with ``fstat`` to be a regular
file before a byte is read or written; temporary files are created with
``O_EXCL`` under a random name and renamed into place (a rename replaces a
planted link, it never writes through it). The directories themselves are
checked once, at start-up (``check_dir``): owned by this user, writable by no
one else, and so are the parents this user owns.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeFile(OSError):
    """A path in the state directory that is not a regular file of ours; the message names it."""


class UnsafeDir(Exception):
    """The state directory (or a parent) could be changed by someone else; the message says
    which path and what to do."""


def open_regular(path: Path, flags: int, mode: int = 0o600) -> int:
    """A descriptor of ``path``, a regular file, opened without following a link or blocking.

    ``UnsafeFile`` names a link, FIFO, device or directory found there instead.
    """
    try:
        fd = os.open(path, flags | _OPEN, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a symbolic link
            raise UnsafeFile(
                f"{path} is a symbolic link; the agent does not follow links "
                "in its state directory: remove it"
            ) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(
                f"{path} is not a regular file (a FIFO, device or directory); "
                "the agent reads and writes only regular files there: remove it"
            )
        # Back to blocking for the reads and writes themselves: a regular file never blocks.
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, limit: int) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes (``ValueError`` if larger)."""
    fd = open_regular(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise ValueError(f"{path} is {size} bytes, more than the {limit} it may be")
        data = b""
        while len(data) <= limit:
            chunk = os.read(fd, limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > limit:
            raise ValueError(f"{path} is more than the {limit} bytes it may be")
        return data
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: a fresh file (``O_EXCL``) beside it, then a rename."""
    _atomically(path, lambda fd: _write_all(fd, data))


def copy_atomically(path: Path, source_fd: int, chunk: int = 1 << 20) -> None:
    """Replace ``path`` with the content of ``source_fd``, a piece at a time, as above."""

    def fill(fd: int) -> None:
        offset = 0
        while piece := os.pread(source_fd, chunk, offset):
            _write_all(fd, piece)
            offset += len(piece)

    _atomically(path, fill)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _atomically(path: Path, fill: Callable[[int], None]) -> None:
    for _ in range(8):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600)
        except FileExistsError:
            continue  # a name someone else holds, planted or not: another name
        try:
            try:
                fill(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return
    raise UnsafeFile(f"cannot create a temporary file beside {path}: every name tried was taken")


def make_private_dir(path: Path) -> None:
    """Create ``path`` (0700) if it is missing; an existing one is checked, not changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)


def check_dir(path: Path, *, own: bool = True) -> None:
    """Refuse (``UnsafeDir``) a directory someone else could change.

    ``path`` itself must be a directory (not a link to one) owned by this user and
    writable by no group or other user. Each parent must be owned by this user or by
    root, and writable by no one else, unless it is sticky (as /tmp is: there no one
    can rename or remove another user's entries).
    """
    uid = os.geteuid()
    user = _user(uid)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeDir(
            f"{path} is not a directory (a symbolic link or a file); give the agent a "
            "directory of its own as --state-dir"
        )
    if own and info.st_uid != uid:
        raise UnsafeDir(
            f"{path} is owned by uid {info.st_uid}, not by {user} who runs the agent; "
            f"`chown {user} {path}`, or give the agent a directory of its own as --state-dir"
        )
    if info.st_mode & 0o022:
        raise UnsafeDir(
            f"{path} is writable by its group or by others (mode {stat.S_IMODE(info.st_mode):o}); "
            f"`chmod go-w {path}` (the agent creates it 700)"
        )
    for parent in path.resolve().parents:
        pinfo = os.stat(parent)
        if pinfo.st_uid not in (uid, 0):
            raise UnsafeDir(
                f"{parent}, a parent of the state dir {path}, is owned by uid {pinfo.st_uid}, "
                "who could rename the state dir and put another in its place; keep the state "
                "dir under directories owned by you or root"
            )
        if pinfo.st_mode & 0o022 and not pinfo.st_mode & stat.S_ISVTX:
            raise UnsafeDir(
                f"{parent}, a parent of the state dir {path}, is writable by its group or by "
                f"others (mode {stat.S_IMODE(pinfo.st_mode):o}); `chmod go-w {parent}`, or keep "
                "the state dir elsewhere"
            )


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"
