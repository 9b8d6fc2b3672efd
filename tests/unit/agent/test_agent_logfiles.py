"""Engine logs stay bounded while a real process keeps writing to them."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from agent.logfiles import LogLimits, rotate_if_large, rotated
from agent.processes import tail

# Writes numbered lines to its stdout (the log, inherited as the agent gives it) until
# killed, as an engine does: the agent never holds the only descriptor.
WRITER = """
import sys, time
i = 0
while True:
    sys.stdout.write(f"line {i:06d}\\n"); sys.stdout.flush(); i += 1
    time.sleep(0.001)
"""


def _writer(log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:  # as agent.processes.spawn opens it
        return subprocess.Popen([sys.executable, "-c", WRITER], stdout=out)


def _grow(log: Path, size: int) -> None:
    deadline = time.monotonic() + 60
    while log.stat().st_size <= size:
        assert time.monotonic() < deadline, "the writer never wrote enough"
        time.sleep(0.01)


def test_a_log_past_its_limit_is_copied_then_truncated_and_the_engine_writes_on_at_its_start(
    tmp_path: Path,
) -> None:
    log = tmp_path / "chat-0.log"
    limits = LogLimits(max_bytes=2000, keep=2)
    proc = _writer(log)
    try:
        _grow(log, limits.max_bytes)
        assert rotate_if_large(log, limits)
        first_copy = rotated(log, 1).read_bytes()
        assert len(first_copy) > limits.max_bytes
        _grow(log, 100)
        # The engine's appends land at the new end: no hole of NUL bytes where the
        # old content was, and the lines go on from where the copy stopped.
        now = log.read_bytes()
        assert b"\0" not in now
        last_copied = int(first_copy.splitlines()[-1].split()[1])
        first_new = int(now.splitlines()[0].split()[1])
        assert first_new > last_copied
        # Two more rotations: only KEEP copies remain, newest first.
        for _ in range(2):
            _grow(log, limits.max_bytes)
            assert rotate_if_large(log, limits)
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "chat-0.log",
            "chat-0.log.1",
            "chat-0.log.2",
        ]
        newest = int(rotated(log, 1).read_bytes().splitlines()[0].split()[1])
        older = int(rotated(log, 2).read_bytes().splitlines()[0].split()[1])
        assert newest > older > last_copied
    finally:
        proc.kill()
        proc.wait()


def test_a_small_or_missing_log_is_left_alone(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    assert not rotate_if_large(log, LogLimits(max_bytes=10))
    log.write_text("short\n")
    assert not rotate_if_large(log, LogLimits(max_bytes=10))
    assert log.read_text() == "short\n"
    assert not rotated(log, 1).exists()


def test_keep_zero_truncates_without_copies(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("a\n" * 100)
    assert rotate_if_large(log, LogLimits(max_bytes=10, keep=0))
    assert log.read_text() == ""
    assert list(tmp_path.iterdir()) == [log]


def test_a_failure_just_after_a_rotation_still_shows_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"loading {i}\n" for i in range(50)))
    assert rotate_if_large(log, LogLimits(max_bytes=10, keep=1))
    log.write_text("CUDA out of memory\n")
    assert tail(log, lines=3) == "loading 48 | loading 49 | CUDA out of memory"
