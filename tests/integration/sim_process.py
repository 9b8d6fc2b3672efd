"""A real sim engine process on a loopback port, for the tests that speak to one directly."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from agent.processes import free_port

BOUND = 60.0


@contextmanager
def sim_engine(*args: str, model: str = "m") -> Iterator[int]:
    """``python -m agent.sim --model MODEL ARGS`` until the block ends; yields its port
    once ``/health`` answers 200."""
    port = free_port("127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.sim", "--port", str(port), "--model", model, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + BOUND
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the sim never started"
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(BOUND)
