"""The sim engine's gang as a real process: its master port holds against strangers."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def test_a_stranger_on_the_master_port_cannot_stall_or_fill_the_gang(tmp_path: Path) -> None:
    """The head gathers its ranks on a port anyone can reach: a client that sends nothing,
    or a line of megabytes, is dropped, and the real worker still completes the gang (the
    head answers /health). A real head process: losing a rank ends it, as it should."""
    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    api, master = ports
    with (tmp_path / "head.log").open("wb") as head_log:  # the child keeps its own copy
        head = subprocess.Popen(
            [sys.executable, "-m", "agent.sim", "--port", str(api), "--model", "m",
             "--nnodes", "2", "--node-rank", "0", "--master-port", str(master)],
            stdout=head_log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    strangers: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                strangers.append(socket.create_connection(("127.0.0.1", master), timeout=1))
                break
            except OSError:
                assert time.monotonic() < deadline, "the head never listened"
                time.sleep(0.1)
        flood = socket.create_connection(("127.0.0.1", master))
        flood.sendall(b"x" * 1_000_000)
        strangers.append(flood)
        worker = socket.create_connection(("127.0.0.1", master))
        worker.sendall(b"rank 1\n")
        strangers.append(worker)
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "head.log").read_text()
            time.sleep(0.1)
    finally:
        for s in strangers:
            s.close()
        head.kill()
        head.wait()
