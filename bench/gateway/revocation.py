"""``python -m bench.gateway.revocation``: how long a revoked client token keeps working
at a gateway.

A client token is revoked by removing it from the control plane's auth settings and
restarting ``llmgw serve`` (``llmgw token revoke`` says so). A gateway verifies client
tokens itself, from the hashes it read last; it reads them again when it reconnects to
the control plane. This measures, on real processes (a ``llmgw serve`` on SQLite with no
model, a ``llmgw gateway`` following it):

- the restart: SIGTERM to the old server until the new one answers ``/healthz``;
- the lag: from the new server answering until the gateway refuses the revoked token
  (401 on ``GET /v1/models``, polled every 10 ms).

Each round revokes or restores the token (alternately), so both directions are timed.
Prints a markdown table: median and max of each, over ``--rounds`` (default 10).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx

from llmgw.api.guards.tokens import issue_token

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


def gateway(
    work: Path, server_url: str, token: str, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str]:
    """A gateway following ``server_url``; the process and its URL."""
    (work / "gw.token").write_text(token + "\n")
    argv = [LLMGW, "gateway", "--server", server_url, "--token-file", str(work / "gw.token")]
    gw = subprocess.Popen(
        [*argv, "--port", "0", "--admin-open"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=(work / "gateway.log").open("ab"),
    )
    assert gw.stdout is not None
    line = gw.stdout.readline().decode()
    return gw, line.split("listening on ", 1)[1].strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gateway.revocation", description=__doc__)
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="llmgw-revocation-"))
    gw_token, app = issue_token("gw-1", "gateway"), issue_token("app-1", "client")
    port = free_port()
    server_url = f"http://127.0.0.1:{port}"
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    base["LLMGW_DATABASE_URL"] = f"sqlite:///{work / 'llmgw.db'}"

    def serve(with_app: bool) -> subprocess.Popen[bytes]:
        tokens = [gw_token.entry.to_env()] + ([app.entry.to_env()] if with_app else [])
        env = {**base, "LLMGW_TOKENS": ";".join(tokens)}
        log = (work / "serve.log").open("ab")
        return subprocess.Popen(
            [LLMGW, "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )

    subprocess.run([LLMGW, "db", "upgrade"], env=base, check=True, capture_output=True)
    server = serve(with_app=True)
    wait_for(lambda: httpx.get(server_url + "/healthz").status_code == 200)
    gw, gw_url = gateway(work, server_url, gw_token.token, base)
    auth = {"Authorization": f"Bearer {app.token}"}

    def status() -> int:
        return httpx.get(gw_url + "/v1/models", headers=auth, timeout=5).status_code

    wait_for(lambda: status() == 200)
    restarts: list[float] = []
    lags: dict[bool, list[float]] = {True: [], False: []}
    try:
        for i in range(args.rounds):
            revoked = i % 2 == 0
            stopped = time.monotonic()
            server.send_signal(signal.SIGTERM)
            server.wait(30)
            server = serve(with_app=not revoked)
            up = wait_for(lambda: httpx.get(server_url + "/healthz").status_code == 200)
            want = 401 if revoked else 200
            seen = wait_for(partial(lambda w: status() == w, want))
            restarts.append(up - stopped)
            lags[revoked].append(seen - up)
            print(
                f"round {i + 1}: {'revoked' if revoked else 'restored'}, restart "
                f"{up - stopped:.2f} s, gateway {seen - up:.2f} s later",
                file=sys.stderr,
            )
    finally:
        gw.send_signal(signal.SIGTERM)
        server.send_signal(signal.SIGTERM)
        gw.wait(30)
        server.wait(30)
    every = lags[True] + lags[False]
    print("| measure | median s | max s | rounds |")
    print("|---|---:|---:|---:|")
    print(
        f"| restart of llmgw serve (SIGTERM to healthy) | {statistics.median(restarts):.2f} "
        f"| {max(restarts):.2f} | {len(restarts)} |"
    )
    for label, values in (
        ("revoked token refused at the gateway, after the restart", lags[True]),
        ("restored token accepted at the gateway, after the restart", lags[False]),
        ("either", every),
    ):
        if values:
            print(
                f"| {label} | {statistics.median(values):.2f} | {max(values):.2f} | {len(values)} |"
            )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
