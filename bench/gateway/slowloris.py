"""``python -m bench.gateway.slowloris``: issue 36's connection-holding attacks on a gateway.

Starts a ``llmgw serve`` (SQLite, no model) and a ``llmgw gateway`` following it, then,
one after the other:

- **body**: ``--connections`` (810) connections each send a request head with
  ``Content-Length: 1000000`` and no token, then one byte of body every ``--drip``
  seconds (1); a connection the gateway closes is opened again.
- **heads**: as many connections each send part of a head (``GET /v1/models
  HTTP/1.1`` and one header, never the blank line), and open again every ``--renew``
  seconds (10, the header timeout) and whenever the gateway closes them.
- **pipeline**: as many attackers open a connection with a 1 KiB receive buffer every
  ``--renew`` seconds, each sending as many ``GET /v1/models`` with no token
  (``--pipeline``, 20,000) as the gateway takes at once, pipelined, and never reading
  the answers; every connection is held until the end.

for ``--duration`` seconds (75) each, while other clients are measured: one client on a
keep-alive connection asking ``GET /v1/models`` with a client token every 50 ms (a
normal request through the gateway's authentication), and a health check opening a new
connection for ``GET /healthz`` every 0.5 s (as a load balancer does). A client whose
connection is closed before any answer tries once more, as real clients do; such
retries are counted. Prints a markdown table: per attack, the requests, their statuses,
p50 and p99 of the other clients' times, the health checks answered, and how often the
gateway closed an attacker's connection.

``attack`` is the measurement itself: the tests run it, scaled down, against a real
gateway and a real ``llmgw serve`` (tests/e2e/test_gateway_slowloris.py,
tests/api/test_api_request_limits.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.shared.processes import LLMGW, free_port, wait_for

# What a client waits for one answer: far beyond any p99 this measures, short enough
# that a run with a hung gateway still ends.
ANSWER_TIMEOUT_S = 10.0


@dataclass
class Figures:
    """What the other clients saw during one attack."""

    mode: str
    attackers: int
    seconds: float
    times: list[float] = field(default_factory=list)  # the client's answers, seconds
    statuses: Counter[int] = field(default_factory=Counter)
    health: Counter[int] = field(default_factory=Counter)  # /healthz answers (0: none)
    retried: int = 0  # requests tried again after their connection closed unanswered
    closed: int = 0  # attackers' connections the server closed

    def p(self, q: float) -> float:
        ordered = sorted(self.times)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def head(mode: str, path: str) -> bytes:
    """What an attacker sends on opening a connection."""
    if mode == "body":
        return (
            f"POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000000\r\n\r\n{"
        ).encode()
    if mode == "pipeline":
        return f"GET {path} HTTP/1.1\r\nHost: gateway\r\n\r\n".encode()
    return f"GET {path} HTTP/1.1\r\nHost: gateway\r\n".encode()


async def _pipeliner(
    host: str, port: int, requests: bytes, *, renew: float, fig: Figures, stop: asyncio.Event
) -> None:
    """Connections with a 1 KiB receive buffer, a new one every ``renew`` seconds, each
    sending as much of ``requests`` as the server takes at once and never reading; all
    held open until the end (one the server closes is counted when the client can tell:
    with answers unread, its end of sending may never arrive)."""
    loop = asyncio.get_running_loop()
    held: list[socket.socket] = []
    poll = select.poll()
    try:
        while not stop.is_set():
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            sock.setblocking(False)
            held.append(sock)
            try:
                await loop.sock_connect(sock, (host, port))
                with contextlib.suppress(BlockingIOError):
                    sock.send(requests)
                poll.register(sock, select.POLLRDHUP)
            except OSError:
                fig.closed += 1
            for fd, _ in poll.poll(0):
                fig.closed += 1
                poll.unregister(fd)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), renew)
    finally:
        for sock in held:
            sock.close()


async def _attacker(
    host: str, port: int, opening: bytes, *, drip: float | None, renew: float | None,
    fig: Figures, stop: asyncio.Event,
) -> None:  # fmt: skip
    """One attacking connection, opened again when it ends. ``drip``: a byte of body
    every so many seconds, reading nothing, until the connection is gone (an answer and
    the server's end of sending do not stop it); else the head is held, and opened
    again every ``renew`` seconds or once the server answered or closed it."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.2)
            continue
        opened = time.monotonic()
        try:
            writer.write(opening)
            while not stop.is_set():
                await asyncio.sleep(drip or 0.2)
                if writer.transport.is_closing() or (drip is None and reader.at_eof()):
                    fig.closed += 1
                    break
                if drip is not None:
                    writer.write(b" ")
                elif renew is not None and time.monotonic() - opened >= renew:
                    break
        except OSError:
            fig.closed += 1
        finally:
            writer.close()
        # Not at once: a client opening connections as fast as it can is a flood of
        # connections, not this attack.
        await asyncio.sleep(0.2)


async def _request(host: str, port: int, raw: bytes, fig: Figures) -> tuple[int, float]:
    """One request on a new connection: its status and time (tried twice if closed
    unanswered)."""
    for attempt in (1, 2):
        started = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            continue
        try:
            writer.write(raw)
            status = await asyncio.wait_for(_read_answer(reader), ANSWER_TIMEOUT_S)
            return status, time.monotonic() - started
        except (OSError, asyncio.IncompleteReadError):
            if attempt == 1:
                fig.retried += 1
        except TimeoutError:
            return 0, time.monotonic() - started
        finally:
            writer.close()
    return 0, 0.0


async def _read_answer(reader: asyncio.StreamReader) -> int:
    """An answer's status, its whole body read (by its content-length)."""
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)
    return int(lines[0].split()[1])


async def _client(host: str, port: int, raw: bytes, fig: Figures, stop: asyncio.Event) -> None:
    """A keep-alive client: a request every 50 ms, a new connection when it was closed."""
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    while not stop.is_set():
        started = time.monotonic()
        try:
            if writer is None or reader is None or reader.at_eof():
                reader, writer = await asyncio.open_connection(host, port)
            writer.write(raw)
            status = await asyncio.wait_for(_read_answer(reader), ANSWER_TIMEOUT_S)
            fig.times.append(time.monotonic() - started)
        except (OSError, asyncio.IncompleteReadError):
            # Closed unanswered (an idle keep-alive connection closed as it was used):
            # once more on a new connection.
            fig.retried += 1
            if writer is not None:
                writer.close()
            reader = writer = None
            status, took = await _request(host, port, raw, fig)
            if status:
                fig.times.append(took)
        except TimeoutError:
            status = 0
        fig.statuses[status] += 1
        await asyncio.sleep(0.05)
    if writer is not None:
        writer.close()


async def _health(host: str, port: int, fig: Figures, stop: asyncio.Event) -> None:
    raw = b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n"
    while not stop.is_set():
        status, took = await _request(host, port, raw, fig)
        fig.health[status] += 1
        if status:
            fig.times.append(took)
        await asyncio.sleep(0.5)


async def attack(
    url: str,
    mode: str,
    *,
    attackers: int,
    seconds: float,
    token: str,
    client_path: str = "/v1/models",
    attack_path: str = "/v1/chat/completions",
    drip: float = 1.0,
    renew: float | None = 10.0,
    warmup: float = 1.0,
    pipeline: int = 20_000,
) -> Figures:
    """``attackers`` connections holding ``url`` (``mode``: ``body``, ``heads`` or
    ``pipeline``, ``pipeline`` requests of ``attack_path`` each) for ``warmup`` +
    ``seconds``; what the other clients saw in the last ``seconds``."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    fig = Figures(mode, attackers, seconds)
    stop = asyncio.Event()
    opening = head(mode, client_path if mode == "heads" else attack_path)
    body = mode == "body"
    holders = (
        [
            asyncio.ensure_future(
                _pipeliner(
                    host, int(port), opening * pipeline, renew=renew or 1.0, fig=fig, stop=stop
                )
            )
            for _ in range(attackers)
        ]
        if mode == "pipeline"
        else [
            asyncio.ensure_future(
                _attacker(
                    host,
                    int(port),
                    opening,
                    drip=drip if body else None,
                    renew=None if body else renew,
                    fig=fig,
                    stop=stop,
                )
            )
            for _ in range(attackers)
        ]
    )
    await asyncio.sleep(warmup)  # every attacker connected: the cap is what they hold
    raw = f"GET {client_path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {token}\r\n\r\n"
    clients = [
        asyncio.ensure_future(_client(host, int(port), raw.encode(), fig, stop)),
        asyncio.ensure_future(_health(host, int(port), fig, stop)),
    ]
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*clients)
    for holder in holders:
        holder.cancel()
    await asyncio.gather(*holders, return_exceptions=True)
    return fig


def table(runs: list[Figures]) -> str:
    rows = [
        "| attack | attackers | seconds | client requests | statuses | p50 ms | p99 ms "
        "| /healthz answered | retried | attackers' connections closed |",
        "|---|---:|---:|---:|---|---:|---:|---|---:|---:|",
    ]
    for f in runs:
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(f.statuses.items()))
        health = sum(v for k, v in f.health.items() if k == 200)
        rows.append(
            f"| {f.mode} | {f.attackers} | {f.seconds:g} | {sum(f.statuses.values())} "
            f"| {statuses} | {f.p(0.5) * 1000:.1f} | {f.p(0.99) * 1000:.1f} "
            f"| {health} of {sum(f.health.values())} | {f.retried} | {f.closed} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    from llmgw.api.guards.tokens import issue_token

    p = argparse.ArgumentParser(prog="python -m bench.gateway.slowloris", description=__doc__)
    p.add_argument("--connections", type=int, default=810)
    p.add_argument("--duration", type=float, default=75.0)
    p.add_argument("--drip", type=float, default=1.0, help="seconds between body bytes")
    p.add_argument("--renew", type=float, default=10.0, help="seconds a head is held")
    p.add_argument("--pipeline", type=int, default=20_000, help="requests a connection")
    p.add_argument("--modes", default="body,heads,pipeline")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="llmgw-slowloris-"))
    gw_token, app = issue_token("gw-1", "gateway"), issue_token("app-1", "client")
    port = free_port()
    server_url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env["LLMGW_DATABASE_URL"] = f"sqlite:///{work / 'llmgw.db'}"
    env["LLMGW_TOKENS"] = ";".join(t.entry.to_env() for t in (gw_token, app))
    subprocess.run([LLMGW, "db", "upgrade"], env=env, check=True, capture_output=True)
    server = subprocess.Popen(
        [LLMGW, "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(work / "serve.log").open("ab"),
    )
    (work / "gw.token").write_text(gw_token.token + "\n")
    gw = subprocess.Popen(
        [LLMGW, "gateway", "--server", server_url, "--token-file", str(work / "gw.token"),
         "--port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=(work / "gateway.log").open("ab"),
    )  # fmt: skip
    try:
        assert gw.stdout is not None
        gw_url = gw.stdout.readline().decode().split("listening on ", 1)[1].strip()
        auth = {"Authorization": f"Bearer {app.token}"}
        wait_for(lambda: httpx.get(gw_url + "/v1/models", headers=auth).status_code == 200)
        runs = []
        for mode in args.modes.split(","):
            print(f"slowloris: {mode}, {args.connections} connections", file=sys.stderr)
            runs.append(
                asyncio.run(
                    attack(
                        gw_url, mode, attackers=args.connections, seconds=args.duration,
                        token=app.token, drip=args.drip, renew=args.renew, warmup=3.0,
                        pipeline=args.pipeline,
                        attack_path="/v1/models" if mode == "pipeline" else "/v1/chat/completions",
                    )
                )
            )  # fmt: skip
            print(table(runs[-1:]), file=sys.stderr)
        print(table(runs))
        print(f"\nload average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        for proc in (gw, server):
            proc.send_signal(signal.SIGTERM)
        for proc in (gw, server):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
