"""A real `llmgw gateway` process beside a real cluster (tests.e2e.agents): tokens of the
gateway and client roles, and the official OpenAI client pointed at it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

from llmgw.api.guards.tokens import issue_token
from tests import forkserver
from tests.api.server import LLMGW, ApiServer, Tokens, _readline
from tests.e2e.agents import Cluster


@dataclass
class GatewayTokens:
    gateway: str
    client: str  # every model
    limited: str  # only "backup"
    env: str
    # A second gateway's token ("gw-2"): its signals count as another gateway's.
    gateway_b: str = ""

    @classmethod
    def issue(cls) -> GatewayTokens:
        gw = issue_token("gw-1", "gateway")
        gw_b = issue_token("gw-2", "gateway")
        app = issue_token("app-1", "client")
        limited = issue_token("app-b", "client", models=["backup"])
        return cls(
            gw.token,
            app.token,
            limited.token,
            ";".join(t.entry.to_env() for t in (gw, gw_b, app, limited)),
            gw_b.token,
        )


class GatewayProc:
    def __init__(
        self, workdir: Path, server_url: str, token: str, *args: str, admin: str = ""
    ) -> None:
        # A reader token of the cluster: /metrics and /routing take one.
        self.admin = admin
        self.token_file = workdir / "gateway.token"
        self.token_file.write_text(token + "\n")
        self.log_path = workdir / f"gateway-{time.monotonic_ns()}.log"
        self.argv = [
            LLMGW, "gateway", "--server", server_url, "--token-file", str(self.token_file),
            "--port", "0", "--gateway-id", "gw-test", *args,
        ]  # fmt: skip
        self.proc: forkserver.Forked | subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, *, synced: bool = True) -> GatewayProc:
        """Started, and (``synced``) with its first routing table: /healthz answers 200,
        as a readiness probe would wait for."""
        assert self.argv[0] == LLMGW, self.argv
        with self.log_path.open("wb") as stderr:
            # Forked from an interpreter that has llmgw and the gateway's modules imported
            # (tests/forkserver.py), as the suite's commands and servers are: the same
            # `llmgw gateway`, without ~0.5 s of CPU of imports (a fresh process with
            # LLMGW_TEST_FORK=0).
            self.proc = forkserver.popen(
                self.argv[1:],
                cwd=os.getcwd(),
                env={**os.environ, "LLMGW_LOG_LEVEL": "INFO"},
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        assert self.proc.stdout is not None
        line = _readline(self.proc.stdout, 60)
        assert "listening on " in line, f"the gateway did not start: {line!r}\n{self.log_text()}"
        self.url = line.split("listening on ", 1)[1].strip()
        if synced:
            deadline = time.monotonic() + 60
            while httpx.get(self.url + "/healthz", timeout=30).status_code != 200:
                assert time.monotonic() < deadline, f"never synced:\n{self.log_text()}"
                time.sleep(0.05)
        return self

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()

    def openai(self, token: str) -> OpenAI:
        return OpenAI(base_url=self.url + "/v1", api_key=token, timeout=60, max_retries=0)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        """GET with the reader token (if any) unless ``headers`` say otherwise."""
        kwargs.setdefault(
            "headers", {"Authorization": f"Bearer {self.admin}"} if self.admin else {}
        )
        return httpx.get(self.url + path, timeout=30, **kwargs)

    def routing(self) -> dict[str, Any]:
        answer = self.get("/routing")
        assert answer.status_code == 200, answer.text
        data: dict[str, Any] = answer.json()
        return data

    def _model_table(self, model: str) -> dict[str, Any] | None:
        """The model's entry in the table; None before there is one. A worker (re)started
        and still fetching its first table answers 503 `gateway_starting`, its documented
        answer until then: no table yet, not a failure."""
        answer = self.get("/routing")
        if answer.status_code == 503 and "gateway_starting" in answer.text:
            return None
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] | None = answer.json()["models"].get(model)
        return found

    def replicas(self, model: str) -> list[str]:
        """The keys of the model's replicas in the gateway's table."""
        found = self._model_table(model)
        return [] if found is None else [r["replica"] for r in found["replicas"]]

    def ready(self, model: str, count: int) -> bool:
        found = self._model_table(model)
        return found is not None and len(found["replicas"]) == count

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def logs(self, event: str | None = None) -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in self.log_text().splitlines() if x.startswith("{")]
        return [x for x in lines if event is None or x.get("event") == event]


@contextmanager
def gateway_cluster(
    workdir: Path,
    sqlite_url: str,
    nodes: list[str],
    models: list[dict[str, Any]],
    server_args: list[str],
    *,
    gateway_args: tuple[str, ...] = (),
) -> Iterator[tuple[Cluster, GatewayProc, GatewayTokens]]:
    tokens = Tokens.issue(agent_nodes=nodes)
    extra = GatewayTokens.issue()
    server = ApiServer(
        workdir,
        sqlite_url,
        tokens=tokens,
        args=server_args,
        declared={"models": models},
        env={"LLMGW_TOKENS": tokens.env + ";" + extra.env},
    )
    server.start()
    c = Cluster(workdir, server, tokens)
    gw = GatewayProc(workdir, server.url, extra.gateway, *gateway_args, admin=tokens.reader)
    try:
        gw.start()
        yield c, gw, extra
    finally:
        gw.stop()
        c.close()
