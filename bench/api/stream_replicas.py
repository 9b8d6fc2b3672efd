"""``python -m bench.api.stream_replicas``: how soon a watch on one replica sees a write made
through another.

Two real ``llmgw serve`` on one database; a watch on B (``GET /v1/events/stream``); a
model added through A (``POST /v1/catalog/models``) ``--writes`` times, one at a time.
The lag runs from A's answer (the write committed) to the event's ``data:`` line read
from B's stream. On PostgreSQL B is woken by the notification every insert into the
log sends (llmgw.api.runtime.changes); on SQLite, and with ``--no-notify`` (the
trigger dropped, as before migration 0013), by its poll (``--stream-poll``, default
500ms). ``--db`` names an empty database (default: SQLite, temporary). Prints a
markdown table: median, p90 and max.
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
import time
from functools import partial
from pathlib import Path

import httpx

from bench.shared.processes import LLMGW, free_port, wait_for
from llmgw.api.guards.tokens import issue_token


def healthy(url: str) -> bool:
    return httpx.get(url + "/healthz").status_code == 200


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.api.stream_replicas", description=__doc__)
    p.add_argument("--writes", type=int, default=50)
    p.add_argument("--db", metavar="URL", help="an empty database (default: SQLite, temporary)")
    p.add_argument("--stream-poll", default="500ms", metavar="DURATION")
    p.add_argument(
        "--no-notify",
        action="store_true",
        help="drop the PostgreSQL trigger first: the poll alone, as before",
    )
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="llmgw-stream-"))
    url = args.db or f"sqlite:///{work / 'llmgw.db'}"
    ops = issue_token("ops", "operator")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env |= {"LLMGW_DATABASE_URL": url, "LLMGW_TOKENS": ops.entry.to_env()}
    subprocess.run([LLMGW, "db", "upgrade"], env=env, check=True, capture_output=True)
    if args.no_notify:
        from sqlalchemy import text

        from events.database.connection import make_engine

        with make_engine(url).begin() as conn:
            conn.execute(text("DROP TRIGGER IF EXISTS llmgw_notify_events ON events"))
    servers, urls = [], []
    for name in ("a", "b"):
        port = free_port()
        servers.append(
            subprocess.Popen(
                [
                    LLMGW,
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--stream-poll",
                    args.stream_poll,
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=(work / f"serve-{name}.log").open("ab"),
            )
        )
        urls.append(f"http://127.0.0.1:{port}")
    lags: list[float] = []
    try:
        for u in urls:
            wait_for(partial(healthy, u))
        headers = {"Authorization": f"Bearer {ops.token}"}
        with (
            httpx.Client(headers=headers, timeout=30) as http,
            http.stream("GET", urls[1] + "/v1/events/stream") as stream,
        ):
            lines = stream.iter_lines()
            next(lines)  # retry: the stream is open
            for i in range(args.writes):
                name = f"bench-{i}"
                profile = {"name": "a", "gpu_class": "A100"}
                body = {"name": name, "source": f"org/{name}", "profiles": [profile]}
                made = http.post(urls[0] + "/v1/catalog/models", json=body)
                written = time.monotonic()
                made.raise_for_status()
                for line in lines:
                    if line.startswith("data:") and f'"{name}"' in line:
                        lags.append(time.monotonic() - written)
                        break
    finally:
        for s in servers:
            s.send_signal(signal.SIGTERM)
        for s in servers:
            s.wait(30)
    lags.sort()
    kind = url.split(":", 1)[0] + (" without the trigger" if args.no_notify else "")
    print(f"{kind}, stream poll {args.stream_poll}, {len(lags)} writes")
    print("| a write through A seen on B's stream | median ms | p90 ms | max ms |")
    print("|---|---:|---:|---:|")
    p90 = lags[min(len(lags) - 1, int(len(lags) * 0.9))]
    print(
        f"| after A's answer | {statistics.median(lags) * 1000:.1f} | {p90 * 1000:.1f} "
        f"| {lags[-1] * 1000:.1f} |"
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
