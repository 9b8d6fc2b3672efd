"""``python -m bench.gateway.revocation``: how long a revoked client token keeps working
at a gateway.

A gateway verifies client tokens itself, from the hashes it read last. This measures, on
real processes (a ``llmgw serve`` with no model, a ``llmgw gateway`` following it), each
round revoking the client token or issuing a new one (alternately), both directions timed:

- ``--via database`` (the default): ``llmgw token revoke`` / ``llmgw token new`` on the
  database (llmgw.cli.operate.tokens). The lag runs from the event's ``recorded_at`` (taken
  in the command's transaction, just before its commit) until the gateway refuses the
  revoked token, or accepts the new one (``GET /v1/models`` polled every 5 ms, during the
  command too; a request's start is its time; one clock, the machine's). The command's
  own run, start to exit, is printed too.
- ``--via restart``: as before tokens lived in the database: the token is removed from (or
  put back into) the server's ``LLMGW_TOKENS`` and ``llmgw serve`` restarted; the restart
  (SIGTERM to ``/healthz`` answering) and the lag after it are timed.

``--db`` picks the database (default: SQLite in a temporary directory; give a
PostgreSQL URL for an empty database to see its notifications at work). Prints a markdown
table: median and max of each, over ``--rounds`` (default 10).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx

from bench.shared.processes import LLMGW, free_port, wait_for
from llmgw.api.guards.tokens import issue_token


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
    p.add_argument("--via", choices=["database", "restart"], default="database")
    p.add_argument("--db", metavar="URL", help="an empty database (default: SQLite, temporary)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="llmgw-revocation-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    base["LLMGW_DATABASE_URL"] = args.db or f"sqlite:///{work / 'llmgw.db'}"
    subprocess.run([LLMGW, "db", "upgrade"], env=base, check=True, capture_output=True)
    rows = (via_database if args.via == "database" else via_restart)(work, base, args.rounds)
    print(f"via {args.via}, {base['LLMGW_DATABASE_URL'].split(':', 1)[0]}")
    print("| measure | median s | max s | rounds |")
    print("|---|---:|---:|---:|")
    for label, values in rows:
        if values:
            print(
                f"| {label} | {statistics.median(values):.3f} | {max(values):.3f} | {len(values)} |"
            )
    shutil.rmtree(work, ignore_errors=True)
    return 0


def serve_process(work: Path, env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    log = (work / "serve.log").open("ab")
    return subprocess.Popen(
        [LLMGW, "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


class _Tokens:
    """The database's tokens, changed with the real `llmgw token`, watched at a gateway."""

    def __init__(self, base: dict[str, str], gw_url: str) -> None:
        from events.database.connection import make_engine
        from events.storage.backends import open_log

        self.base = base
        self.gw_url = gw_url
        self.log = open_log(make_engine(base["LLMGW_DATABASE_URL"]))

    def new(self, name: str) -> str:
        done = subprocess.run(
            [LLMGW, "token", "new", name, "--role", "client"],
            env=self.base,
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout.splitlines()[0]

    def revoke(self, name: str) -> str:
        subprocess.run(
            [LLMGW, "token", "revoke", name], env=self.base, check=True, capture_output=True
        )
        return ""

    def status(self, token: str) -> int:
        auth = {"Authorization": f"Bearer {token}"}
        return httpx.get(self.gw_url + "/v1/models", headers=auth, timeout=5).status_code

    def watch(self, token: str, want: int, seen: list[float]) -> None:
        """Poll until answered ``want``; the wall-clock start of that request into ``seen``."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            sent = time.time()
            try:
                if self.status(token) == want:
                    seen.append(sent)
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.005)

    def timed(self, token: str, want: int, command: Callable[[], str]) -> tuple[float, float, str]:
        """Run ``command`` while polling the gateway for ``token`` (after it, for the token
        it returns, if any): its run, and the lag from its event's ``recorded_at`` (the time
        its transaction took, just before it committed) to the first answer ``want``."""
        seen: list[float] = []
        poller = None
        if token:
            poller = threading.Thread(target=self.watch, args=(token, want, seen))
            poller.start()
        started = time.monotonic()
        made = command()
        took = time.monotonic() - started
        if poller is None:
            self.watch(made, want, seen)
        else:
            poller.join()
        if not seen:
            raise SystemExit("timed out: see the logs in the work directory")
        (event,) = self.log.read(after=self.log.head() - 1)
        return took, seen[0] - event.recorded_at.timestamp(), made or token


def via_database(work: Path, base: dict[str, str], rounds: int) -> list[tuple[str, list[float]]]:
    gw_token = issue_token("gw-1", "gateway")
    port = free_port()
    server_url = f"http://127.0.0.1:{port}"
    server = serve_process(work, {**base, "LLMGW_TOKENS": gw_token.entry.to_env()}, port)
    wait_for(lambda: httpx.get(server_url + "/healthz").status_code == 200)
    gw, gw_url = gateway(work, server_url, gw_token.token, base)
    tokens = _Tokens(base, gw_url)
    token = tokens.new("app-0")
    tokens.watch(token, 200, [])
    commands: list[float] = []
    lags: dict[bool, list[float]] = {True: [], False: []}
    try:
        for i in range(rounds):
            revoked = i % 2 == 0
            if revoked:
                took, lag, _ = tokens.timed(token, 401, partial(tokens.revoke, f"app-{i}"))
            else:
                took, lag, token = tokens.timed("", 200, partial(tokens.new, f"app-{i + 1}"))
            commands.append(took)
            # A request started a few ms before the record may be the first answered so.
            lags[revoked].append(max(lag, 0.0))
            if revoked and i + 1 < rounds:
                token = tokens.new(f"app-{i + 1}")
                tokens.watch(token, 200, [])
            print(
                f"round {i + 1}: {'revoked' if revoked else 'issued'}, command "
                f"{took:.2f} s, gateway {lag * 1000:.0f} ms after its record",
                file=sys.stderr,
            )
    finally:
        gw.send_signal(signal.SIGTERM)
        server.send_signal(signal.SIGTERM)
        gw.wait(30)
        server.wait(30)
    return [
        ("`llmgw token revoke` or `token new` (the command, start to exit)", commands),
        ("revoked token refused at the gateway, after its event's record", lags[True]),
        (
            "new token accepted at the gateway, after its event's record (polled after exit)",
            lags[False],
        ),
        ("either", lags[True] + lags[False]),
    ]


def via_restart(work: Path, base: dict[str, str], rounds: int) -> list[tuple[str, list[float]]]:
    gw_token, app = issue_token("gw-1", "gateway"), issue_token("app-1", "client")
    port = free_port()
    server_url = f"http://127.0.0.1:{port}"

    def serve(with_app: bool) -> subprocess.Popen[bytes]:
        tokens = [gw_token.entry.to_env()] + ([app.entry.to_env()] if with_app else [])
        return serve_process(work, {**base, "LLMGW_TOKENS": ";".join(tokens)}, port)

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
        for i in range(rounds):
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
    return [
        ("restart of llmgw serve (SIGTERM to healthy)", restarts),
        ("revoked token refused at the gateway, after the restart", lags[True]),
        ("restored token accepted at the gateway, after the restart", lags[False]),
        ("either", lags[True] + lags[False]),
    ]


if __name__ == "__main__":
    sys.exit(main())
