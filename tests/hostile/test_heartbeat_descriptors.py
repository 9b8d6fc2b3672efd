"""Idle connections to the heartbeat port cannot take the API's descriptors.

``heartbeat_connections`` (10,000 by default) was never held against the process's
descriptor limit: with a soft ``RLIMIT_NOFILE`` of 1,024 (systemd's default), 1,100
connections to the heartbeat port, no token and no byte sent, took every descriptor of
``llmgw serve`` and ``/healthz`` answered 0 of 5. Now the soft limit is raised toward the
hard one and the heartbeat connections are held to what is left beside the API's own
``max_connections`` and ``RESERVED`` (llmgw.api.runtime.descriptors). Scaled down here:
a hard limit of 600 and an API of 100 connections leave 600 - 100 - 256 = 244.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from llmgw.api.runtime.descriptors import RESERVED
from tests.api.server import LLMGW, ApiServer, Tokens

pytestmark = pytest.mark.slow

LIMIT = 600
API_CONNECTIONS = 100
ROOM = LIMIT - API_CONNECTIONS - RESERVED


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def _healthy(url: str) -> bool:
    with contextlib.suppress(httpx.TransportError):
        return httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    return False


def test_idle_heartbeat_connections_leave_the_api_its_descriptors(
    tmp_path: Path, sqlite_url: str
) -> None:
    hb, api = _free_port(), _free_port()
    settings = tmp_path / "llmgw.toml"
    settings.write_text(f"[server]\nheartbeat_port = {hb}\nmax_connections = {API_CONNECTIONS}\n")
    env = ApiServer(tmp_path, sqlite_url, tokens=Tokens.issue()).env
    env["LLMGW_SETTINGS"] = str(settings)
    log_path = tmp_path / "serve.log"
    socks: list[socket.socket] = []
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [LLMGW, "serve", "--host", "127.0.0.1", "--port", str(api)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=log,
            preexec_fn=_limited,  # noqa: PLW1509 (no threads in the child yet)
        )
        try:
            url = f"http://127.0.0.1:{api}"
            deadline = time.monotonic() + 60
            while not _healthy(url):
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.1)
            text = log_path.read_text()
            assert "api.heartbeat_connections_clamped" in text
            assert f'"heartbeat_connections": {ROOM},' in text
            # More idle connections than the whole limit: ROOM are kept, each new one
            # taking the place of the oldest (no heartbeat on either), answered BUSY
            # and closed.
            for _ in range(LIMIT + 50):
                socks.append(socket.create_connection(("127.0.0.1", hb), timeout=30))
            busy = 0
            for s in socks[: LIMIT + 50 - ROOM]:
                s.settimeout(30)
                busy += s.recv(100).startswith(b"BUSY ")
            assert busy == LIMIT + 50 - ROOM
            assert [_healthy(url) for _ in range(5)] == [True] * 5
        finally:
            for s in socks:
                s.close()
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
