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
