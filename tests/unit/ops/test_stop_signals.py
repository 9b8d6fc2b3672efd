"""A stop signal that comes while the process is writing a log line.

A Python signal handler runs on the main thread between two of its bytecodes, so it may
run while that thread holds a lock: the log's write lock (structlog's ``PrintLogger``
takes a plain lock around each line, and the agent's loop logs every tick). A handler
that logs, or sets an event, takes such a lock again and waits forever: the agent
ignored SIGTERM. Each case runs in a process of its own, with a stderr that sends the
signal from inside a write, while the lock is held.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.conftest import REPO

AGENT_CASE = textwrap.dedent(
    """
    import io, json, os, signal, sys, threading

    class Trap(io.StringIO):
        # The first line logged sends SIGTERM while it is being written.
        fired = False

        def write(self, text):
            if not Trap.fired:
                Trap.fired = True
                os.kill(os.getpid(), signal.SIGTERM)
            return super().write(text)

    trap = Trap()
    sys.stderr = trap
    from llmgw import logs
    logs.configure(default_level="INFO", cache=False)
    import structlog
    from llmgw.cli.operate.agent import _Stop

    class Looping:  # what the handler reads of the agent
        looping = True
        stopping = threading.Event()

    stop = _Stop(grace=5.0)
    stop.agent = Looping()
    signal.signal(signal.SIGTERM, stop)
    structlog.get_logger("test").info("agent.tick")  # SIGTERM comes inside this line
    asked = Looping.stopping.wait(10)
    lines = [json.loads(line) for line in trap.getvalue().splitlines()]
    print(json.dumps({"asked": asked, "events": [line["event"] for line in lines]}))
    os._exit(0)
    """
)


def test_sigterm_while_the_agent_writes_a_log_line_asks_the_loop_to_stop() -> None:
    done = subprocess.run(
        [sys.executable, "-c", AGENT_CASE],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["asked"] is True, "the loop was never asked to stop"
    assert result["events"] == ["agent.tick", "agent.stopping"]
