"""The production logging path assembles each logger once, not on every call.

Run in a fresh interpreter: ``configure`` is process-wide, and a pytest worker that ran
it would keep cached loggers that ``structlog.testing.capture_logs`` cannot reach.
"""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, structlog
from llmgw import logs
logs.configure(default_level="INFO"{extra})
log = structlog.get_logger("llmgw.test")
log.info("first.call", n=1)
first, second = log.bind(), log.bind()
log.debug("filtered.out")
log.info("second.call", n=2)
print(json.dumps({{"same": first is second}}))
"""


def _run(extra: str = "") -> tuple[bool, list[dict[str, object]]]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(extra=extra)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "LLMGW_LOG_LEVEL": "INFO"},
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    return bool(json.loads(done.stdout)["same"]), lines


def test_a_logger_is_assembled_once_and_still_writes_json_lines_at_its_level() -> None:
    same, lines = _run()
    assert same, "each call on the proxy assembled a new logger"
    assert [(line["event"], line["n"], line["level"]) for line in lines] == [
        ("first.call", 1, "info"),
        ("second.call", 2, "info"),
    ]
    assert all(str(line["timestamp"]).endswith("Z") for line in lines)


def test_cache_false_assembles_per_call_for_a_caller_that_must_reconfigure() -> None:
    same, lines = _run(", cache=False")
    assert not same
    assert [line["event"] for line in lines] == ["first.call", "second.call"]


FAILING = """
import structlog
from llmgw import logs
logs.configure(default_level="INFO"{extra})
log = structlog.get_logger("llmgw.test")
try:
    {{}}["no-such-key"]
except KeyError:
    log.exception("request.failed", request_id="r1")
"""


def test_a_logged_exception_carries_its_traceback_in_the_json_line() -> None:
    # A gateway answers a failure with "see its log": the line must say what failed.
    for extra in ("", ", buffered=True"):
        done = subprocess.run(
            [sys.executable, "-c", FAILING.format(extra=extra)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "LLMGW_LOG_LEVEL": "INFO"},
        )
        (line,) = [json.loads(text) for text in done.stderr.splitlines()]
        assert line["event"] == "request.failed"
        assert "KeyError: 'no-such-key'" in line["exception"], extra
        assert "Traceback" in line["exception"]


BUFFERED = """
import structlog
from llmgw import logs
logs.configure(default_level="INFO", buffered=True)
log = structlog.get_logger("llmgw.test")
log.info("plain", b=2, a=1.5, c=None, d=[1, "x"], e=True)
log.info("not.ascii", text="caf\\u00e9 \\u202e \\x7f \\x1b[31m")
log.warning("surrogate", text="\\ud800")
log.warn("warned", obj=object)
"""


def test_buffered_lines_are_sorted_ascii_json_with_microsecond_utc_stamps() -> None:
    # The gateway's lines (``logs.JSONLines``, msgspec) must read as structlog's
    # JSONRenderer(sort_keys=True) wrote them, and stay printable ASCII: they go to
    # stderr without the terminal guard.
    done = subprocess.run(
        [sys.executable, "-c", BUFFERED],
        capture_output=True,
        check=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "LLMGW_LOG_LEVEL": "INFO"},
    )
    raw = done.stderr.splitlines()
    assert all(line.isascii() and b"\x7f" not in line and b"\x1b" not in line for line in raw)
    lines = [json.loads(line) for line in raw]
    assert [line["event"] for line in lines] == ["plain", "not.ascii", "surrogate", "warned"]
    for line in lines:
        assert list(line) == sorted(line)
        stamp = str(line["timestamp"])
        assert stamp.endswith("Z") and len(stamp) == len("2026-12-05T12:11:19.450437Z")
    plain, odd, surrogate, warned = lines
    assert {k: plain[k] for k in "abcde"} == {"a": 1.5, "b": 2, "c": None, "d": [1, "x"], "e": True}
    assert plain["level"] == "info"
    assert odd["text"] == "caf\u00e9 \u202e \x7f \x1b[31m"
    assert surrogate["text"] == "\ud800" and surrogate["level"] == "warning"
    assert warned["level"] == "warning" and warned["obj"] == "<class 'object'>"


ON_A_TERMINAL = """
import sys, structlog
from llmgw import logs
logs.configure(default_level="INFO")
log = structlog.get_logger("gateway")
def post(url, body, auth=b""):
    raise RuntimeError("the engine's connection broke")
try:
    post("http://10.0.0.7:8000/v1/chat/completions", b"{}",
         b"authorization: Bearer sk-engine-key-0123\\r\\n")
except RuntimeError:
    log.exception("gateway.unexpected")
"""


def test_a_traceback_on_a_terminal_shows_no_local_values() -> None:
    # Attack: a gateway run on a terminal (the README's quick start) logs an unexpected
    # exception; the console renderer's rich traceback printed every frame's locals,
    # the engine's key (``auth`` of EnginePool.post, Upstream.open) among them, though
    # Replica.auth is kept out of reprs for that very reason.
    import os
    import pty

    parent, child = pty.openpty()
    try:
        subprocess.run(
            [sys.executable, "-c", ON_A_TERMINAL],
            check=True,
            stdout=subprocess.PIPE,
            stderr=child,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "TERM": "dumb"},
        )
        os.close(child)
        child = -1
        chunks = []
        while True:
            try:
                chunk = os.read(parent, 65536)
            except OSError:  # (EIO: the pty's other end is closed and drained)
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        if child != -1:
            os.close(child)
        os.close(parent)
    out = b"".join(chunks).decode("utf-8", "replace")
    assert "gateway.unexpected" in out and "RuntimeError" in out, out
    assert "sk-engine-key-0123" not in out, out
