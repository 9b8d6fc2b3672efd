"""The control plane our gateway follows during ``bench.gateway.side_by_side``: real, and
as small as it can be.

A real ``llmgw serve`` on a fresh SQLite file, with the tokens issued by the real ``llmgw
token new`` (operator, an agent for one node, the gateway's own token and a client token
for the load generator), one model added through the API with ``scaling.min: 1``, one node
reported through the agent API, one real placement round (``llmgw place``), and the replica
then reported ``ready`` with the upstream stub's address as its endpoint. A small reporter
keeps sending that node's report every few seconds, as an agent's heartbeat does.

Why not a real ``llmgw agent``: its replica endpoint is the engine it starts (the sim
engine), and every gateway in the benchmark must forward to the same upstream, the stub. The
reporter here speaks the agent's report API exactly (``PUT /v1/nodes/NAME``); only the engine
behind the endpoint is the stub instead of one the agent started.

``llmgw`` is a parameter: the one that serves must know the ``gateway`` and ``client`` roles
(a tree where the gateway has landed), so a checkout without them says so and the benchmark
measures the others.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

MODEL = "bench-model"
NODE = "bench-node"
INVENTORY = {"gpu_class": "T4", "gpus": 1, "memory_gb": 16}
HEARTBEAT = 5.0


class Unavailable(RuntimeError):
    """Our gateway cannot be measured with this ``llmgw`` (the reason says why)."""


@dataclass
class ControlPlane:
    llmgw: str
    workdir: Path
    upstream: str
    proc: subprocess.Popen[bytes] | None = None
    url: str = ""
    tokens: dict[str, str] = field(default_factory=dict)
    # `llmgw token new` flags of the load generator's client token (--rpm, --tpm, ...):
    # given, the token is issued into the database (limits live there), so the gateway
    # enforces them on every request (gateway.stages.quota) and their cost is measured.
    client_limits: tuple[str, ...] = ()
    # More stubs: the model gets one replica per stub (replica i at ``endpoints[i]``),
    # ``upstream`` first; none: one replica, at ``upstream``.
    more_upstreams: tuple[str, ...] = ()
    # The model's routing profile ("": the catalog's default, least-loaded).
    routing: str = ""
    # The model's profile ``slots`` (0: none, so the gateway never queues: its queue
    # stage is out); above the load's clients, the stage is in but never holds one.
    slots: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        # Commands run in workdir: a relative path to llmgw is made absolute first.
        found = shutil.which(self.llmgw)
        if found is None:
            raise Unavailable(f"no llmgw at {self.llmgw}")
        self.llmgw = str(Path(found).resolve())

    @property
    def endpoints(self) -> tuple[str, ...]:
        return (self.upstream, *self.more_upstreams)

    @property
    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "LLMGW_DATABASE_URL": f"sqlite:///{self.workdir / 'llmgw.db'}",
            "LLMGW_AUTH_FILE": str(self.workdir / "auth.toml"),
            "LLMGW_LOG_LEVEL": "WARNING",
        }
        for name in ("LLMGW_CONFIG", "LLMGW_TOKENS", "LLMGW_OPEN_READS", "LLMGW_SETTINGS"):
            env.pop(name, None)
        return env

    @property
    def gateway_token_file(self) -> Path:
        return self.workdir / "gateway.token"

    def _llmgw(self, *args: str) -> str:
        done = subprocess.run(
            [self.llmgw, *args],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if done.returncode != 0:
            raise Unavailable(f"`llmgw {' '.join(args)}` failed: {done.stderr.strip()[-500:]}")
        return done.stdout

    def _token(self, name: str, role: str, *extra: str) -> str:
        out = self._llmgw("token", "new", name, "--role", role, *extra, "--append-to", "auth.toml")
        return out.splitlines()[0].strip()

    def start(self) -> ControlPlane:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tokens["operator"] = self._token("bench-operator", "operator")
        self.tokens["agent"] = self._token("bench-agent", "agent", "--node", NODE)
        self.tokens["gateway"] = self._token("bench-gateway", "gateway")
        if self.client_limits:
            out = self._llmgw(
                "token", "new", "bench-client", "--role", "client", *self.client_limits
            )
            self.tokens["client"] = out.splitlines()[0].strip()
        else:
            self.tokens["client"] = self._token("bench-client", "client")
        self.gateway_token_file.write_text(self.tokens["gateway"] + "\n")
        self.gateway_token_file.chmod(0o600)
        with (self.workdir / "serve.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [self.llmgw, "serve", "--host", "127.0.0.1", "--port", "0"],
                cwd=self.workdir,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        try:
            self._started()
        except BaseException:
            self.stop()  # an error past this point (an HTTP error, ^C) leaves no server behind
            raise
        return self

    def _started(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if "listening on " not in line:
            raise Unavailable(f"llmgw serve did not start: {self._log_tail()}")
        self.url = line.split("listening on ", 1)[1].strip()
        with httpx.Client(base_url=self.url, timeout=30) as client:
            self._wait_accepting(client)
            self._add_model(client)
            self._report(client)  # the node exists before the round places on it
            self._llmgw("place")
            self._report(client)  # and now its replica is ready, at the stub
        self._thread = threading.Thread(target=self._beat, name="bench-reporter", daemon=True)
        self._thread.start()

    def _wait_accepting(self, client: httpx.Client, timeout: float = 30.0) -> None:
        """The line is printed once the port is bound; uvicorn listens a moment later, and a
        request in between is refused (seen when several control planes start at once)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.get("/healthz")
                return
            except httpx.ConnectError:
                if time.monotonic() > deadline:
                    raise Unavailable(f"llmgw serve never accepted: {self._log_tail()}") from None
                time.sleep(0.1)

    def _add_model(self, client: httpx.Client) -> None:
        definition = {
            "name": MODEL,
            "source": f"org/{MODEL}",
            "context_length": 32768,
            "max_output": 4096,
            "scaling": {"min": len(self.endpoints)},
            "profiles": [
                {
                    "name": "t4",
                    "gpu_class": "T4",
                    "tp": 1,
                    **({"slots": self.slots} if self.slots else {}),
                }
            ],
        }
        if self.routing:
            definition["routing_profile"] = self.routing
        answer = client.post("/v1/catalog/models", json=definition, headers=self._auth("operator"))
        if answer.status_code != 201:
            raise Unavailable(f"adding {MODEL}: {answer.status_code} {answer.text[:300]}")

    def _report(self, client: httpx.Client) -> None:
        placed = client.get(
            "/v1/placements", params={"node": NODE}, headers=self._auth("agent")
        ).json()
        # Replica i at stub i, in the order of their ids (the same at every beat).
        endpoints = self.endpoints
        replicas = [
            {
                "model": p["model"],
                "replica": p["replica"],
                "state": "ready",
                "endpoint": endpoints[i % len(endpoints)],
            }
            for i, p in enumerate(sorted(placed, key=lambda p: str(p["replica"])))
        ]
        answer = client.put(
            f"/v1/nodes/{NODE}",
            # The node's address, as a current agent registers it: the control plane
            # takes a replica's endpoint only at its node's own address.
            json={
                **INVENTORY,
                "gpus": len(endpoints),
                "address": "127.0.0.1",
                "replicas": replicas,
            },
            headers=self._auth("agent"),
        )
        if answer.status_code != 200:
            raise Unavailable(f"reporting {NODE}: {answer.status_code} {answer.text[:300]}")

    def ready_replicas(self) -> list[dict[str, Any]]:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            rows = client.get(
                "/v1/placements", params={"model": MODEL}, headers=self._auth("operator")
            ).json()
        return [r for r in rows if r.get("state") == "ready"]

    def _beat(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.wait(HEARTBEAT):
                try:
                    self._report(client)
                except (httpx.HTTPError, Unavailable, json.JSONDecodeError):
                    continue  # the next beat tries again; the gateway keeps its table

    def _auth(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    def _log_tail(self) -> str:
        path = self.workdir / "serve.log"
        return path.read_text(errors="replace")[-800:] if path.exists() else ""

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self.proc is not None:
            stop_process(self.proc)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL if it has not ended 20 s later."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
