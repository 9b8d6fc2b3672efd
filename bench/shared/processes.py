"""What the benches that start real `llmgw` processes share: the installed command, a free
port, and a wait on a state another process sets."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

LLMGW = str(Path(sys.executable).parent / "llmgw")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(check: Callable[[], bool], timeout: float = 60) -> float:
    """Poll ``check`` every 10 ms until it is true; the monotonic time it became so."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return time.monotonic()
        except httpx.TransportError:
            pass
        time.sleep(0.01)
    raise SystemExit("timed out: see the logs in the work directory")
