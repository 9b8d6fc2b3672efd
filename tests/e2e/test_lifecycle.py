"""The replica lifecycle with real processes: ``llmgw serve``, ``llmgw daemon`` and a test
agent reporting over HTTP. Rollouts and drains keep ``scaling.min`` ready replicas, a replica
that never becomes ready is moved, and a daemon restarted in the middle carries on."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from catalog import parse_model
from events.core.types import MODEL_ADDED, MODEL_REMOVED, NewEvent
from events.database.connection import make_engine
from events.storage.backends import open_log
from tests import forkserver
from tests.api.server import ApiServer, Tokens, running
from tests.lifecycle_agent import NEVER_READY, OLD_AGENT, AgentNode, ReportingAgent
from tests.polling import poll_interval

pytestmark = pytest.mark.slow

NODES = ("node-a", "node-b", "node-c")
T4x4 = {"gpu_class": "T4", "gpus": 4, "memory_gb": 64}


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    started = time.monotonic()
    while (waited := time.monotonic() - started) < timeout:
        if check():
            return
        time.sleep(poll_interval(waited))
    pytest.fail(f"timed out waiting for {what}")


class Daemon:
    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.proc: forkserver.Forked | subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        log = self.server.workdir / f"daemon-{self.starts}.log"
        self.starts += 1
        with log.open("wb") as stderr:  # the child keeps its own copy
            # Forked (tests/forkserver.py), as the suite's commands are: the same
            # `llmgw daemon` without ~1 s of imports (fresh with LLMGW_TEST_FORK=0).
            self.proc = forkserver.popen(
                ["daemon", "--interval", "0.3"],
                cwd=self.server.workdir,
                env=self.server.env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)


@pytest.fixture
def cluster(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[ApiServer, Tokens, Daemon]]:
    tokens = Tokens.issue(NODES)
    server = ApiServer(tmp_path, sqlite_url, tokens=tokens, declared={"models": []})
    daemon = Daemon(server)
    with running(server):
        daemon.start()
        try:
            yield server, tokens, daemon
        finally:
            daemon.stop()


def definition(name: str, replicas: int, **profile: Any) -> dict[str, Any]:
    return {
        "name": name,
        "source": f"org/{name}",
        "scaling": {"min": replicas},
        "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 1, **profile}],
    }


def placements(server: ApiServer, tokens: Tokens, model: str) -> list[dict[str, Any]]:
    with server.client(tokens.reader) as client:
        return list(client.get("/v1/placements", params={"model": model}).json())


def nodes_known(server: ApiServer, tokens: Tokens) -> list[dict[str, Any]]:
    with server.client(tokens.reader) as client:
        return list(client.get("/v1/nodes").json())


def ready_on(rows: list[dict[str, Any]], node: str | None = None) -> int:
    return sum(r["state"] == "ready" and (node is None or node in r["nodes"]) for r in rows)


def add(server: ApiServer, tokens: Tokens, data: dict[str, Any]) -> None:
    with server.client(tokens.operator) as client:
        answer = client.post("/v1/catalog/models", json=data)
        assert answer.status_code == 201, answer.text


def replace_definition(server: ApiServer, data: dict[str, Any]) -> None:
    """One append of removal and addition: the catalog never lacks the model in between."""
    model = parse_model(data)
    store = open_log(make_engine(server.db_url))
    payload = json.dumps({"model": model.to_definition(), "declared_digest": None})
    store.append(
        [
            NewEvent(MODEL_REMOVED, model.name, json.dumps({"name": model.name})),
            NewEvent(MODEL_ADDED, model.name, payload, schema_version=2),
        ],
        expected_head=store.head(),
        actor="test",
        reason="new engine arguments",
    )


def agent_nodes(tokens: Tokens, modes: dict[str, str] | None = None) -> list[AgentNode]:
    modes = modes or {}
    return [AgentNode(n, tokens.agents[n], T4x4, modes.get(n, "normal")) for n in NODES]


def test_a_replaced_definition_rolls_out_without_dropping_below_min_ready_across_a_restart(
    cluster: tuple[ApiServer, Tokens, Daemon],
) -> None:
    server, tokens, daemon = cluster
    agent = ReportingAgent(server.url, agent_nodes(tokens), tokens.reader, ["qwen"]).start()
    try:
        add(server, tokens, definition("qwen", 3))
        wait_for(lambda: ready_on(placements(server, tokens, "qwen")) == 3, "3 ready replicas")
        before = {r["fingerprint"] for r in placements(server, tokens, "qwen")}
        watched_from = len(agent.ready["qwen"])

        replace_definition(server, definition("qwen", 3, args=["--max-model-len", "4096"]))
        wait_for(
            lambda: any(r["fingerprint"] not in before for r in placements(server, tokens, "qwen")),
            "the first surge replica",
        )
        daemon.stop()  # in the middle of the rollout
        daemon.start()
        wait_for(
            lambda: bool(
                (rows := placements(server, tokens, "qwen"))
                and all(r["fingerprint"] not in before for r in rows)
                and ready_on(rows) == 3
            ),
            "every replica replaced and ready",
        )
    finally:
        agent.stop()
    assert min(agent.ready["qwen"][watched_from:]) >= 3
    with server.client(tokens.reader) as client:
        assert client.get("/v1/placements", params={"model": "qwen"}).status_code == 200
    assert len(placements(server, tokens, "qwen")) == 3


def test_a_replica_that_never_becomes_ready_is_moved_after_its_startup_timeout(
    cluster: tuple[ApiServer, Tokens, Daemon],
) -> None:
    server, tokens, _ = cluster
    # node-a starts nothing; node-b and node-c run an agent without replica states,
    # whose replicas count as ready and never time out.
    modes = {"node-a": NEVER_READY, "node-b": OLD_AGENT, "node-c": OLD_AGENT}
    agent = ReportingAgent(server.url, agent_nodes(tokens, modes), tokens.reader).start()
    try:
        wait_for(lambda: len(nodes_known(server, tokens)) == 3, "every node's first report")
        # Equal nodes: best fit takes node-a first (by name); its agent never says ready.
        add(server, tokens, definition("slow", 1, startup_timeout="2s"))
        wait_for(
            lambda: (
                [(r["nodes"], r["state"]) for r in placements(server, tokens, "slow")]
                == [(["node-b"], "unreported")]
            ),
            "the replica moved away from node-a",
        )
    finally:
        agent.stop()
    history = forkserver.run(
        ["history", "--placements", "--model", "slow", "--json"],
        cwd=server.workdir,
        env=server.env,
        timeout=300,
    )
    assert history.returncode == 0, history.stderr
    events = [(e["type"], e["reason"]) for e in json.loads(history.stdout)]
    types = [t for t, _ in events]
    assert "replica.failed" in types
    failed = next(r for t, r in events if t == "replica.failed")
    assert failed.startswith("replica 0 (t4) on node-a: startup timeout")
    removed = next(r for t, r in events if t == "placement.removed")
    assert "startup timeout: not ready 2s after it was placed on node-a" in removed


def test_draining_a_node_with_three_replicas_moves_them_keeping_min_ready_across_a_restart(
    cluster: tuple[ApiServer, Tokens, Daemon],
) -> None:
    server, tokens, daemon = cluster
    agent = ReportingAgent(server.url, agent_nodes(tokens), tokens.reader, ["llama"]).start()
    try:
        wait_for(lambda: len(nodes_known(server, tokens)) == 3, "every node's first report")
        # Spread would put one replica on each node: cordon the others while the
        # three are placed, so that one node holds all three to drain.
        with server.client(tokens.operator) as client:
            for other in ("node-b", "node-c"):
                assert client.post(f"/v1/nodes/{other}/cordon").status_code == 200
        add(server, tokens, definition("llama", 3))
        wait_for(lambda: ready_on(placements(server, tokens, "llama")) == 3, "3 ready replicas")
        (host,) = {r["nodes"][0] for r in placements(server, tokens, "llama")}
        with server.client(tokens.operator) as client:
            for other in ("node-b", "node-c"):
                assert client.post(f"/v1/nodes/{other}/uncordon").status_code == 200
        watched_from = len(agent.ready["llama"])
        with server.client(tokens.operator) as client:
            drained = client.post(f"/v1/nodes/{host}/drain", params={"reason": "kernel update"})
        assert drained.status_code == 200, drained.text
        assert drained.json()["replicas_left"] == 3
        wait_for(
            lambda: any(host not in r["nodes"] for r in placements(server, tokens, "llama")),
            "the first replacement",
        )
        daemon.stop()  # in the middle of the drain
        daemon.start()
        wait_for(
            lambda: bool(
                (rows := placements(server, tokens, "llama"))
                and ready_on(rows, host) == 0
                and len(rows) == 3
                and ready_on(rows) == 3
            ),
            "0 replicas on the drained node and 3 ready elsewhere",
        )
    finally:
        agent.stop()
    assert min(agent.ready["llama"][watched_from:]) >= 3
    listed = forkserver.run(
        ["nodes", "list", "--json"], cwd=server.workdir, env=server.env, timeout=300
    )
    assert listed.returncode == 0, listed.stderr
    node = next(n for n in json.loads(listed.stdout) if n["name"] == host)
    assert node["service"] == "draining (0 replicas left)"
    assert node["cordon"]["actor"] == "ops" and node["cordon"]["reason"] == "kernel update"


def test_cordon_and_uncordon_over_http_need_an_operator_and_name_a_known_node(
    cluster: tuple[ApiServer, Tokens, Daemon],
) -> None:
    server, tokens, _ = cluster
    with server.client(tokens.agents["node-a"]) as agent:
        assert agent.put("/v1/nodes/node-a", json=T4x4).status_code == 200
        assert agent.post("/v1/nodes/node-a/cordon").status_code == 403
    with server.client(tokens.operator) as ops:
        assert ops.post("/v1/nodes/node-z/cordon").status_code == 404
        done = ops.post("/v1/nodes/node-a/cordon", params={"reason": "fan alarm"}).json()
        assert (done["mode"], done["changed"]) == ("cordoned", True)
        again = ops.post("/v1/nodes/node-a/cordon").json()
        assert again["changed"] is False and again["previous"]["reason"] == "fan alarm"
        back = ops.post("/v1/nodes/node-a/uncordon").json()
        assert (back["mode"], back["changed"]) == (None, True)
    with httpx.Client() as plain:
        assert plain.post(f"{server.url}/v1/nodes/node-a/drain").status_code == 401
    history = forkserver.run(
        ["history", "--placements", "--actor", "ops", "--json"],
        cwd=server.workdir,
        env=server.env,
        timeout=300,
    )
    assert history.returncode == 0, history.stderr
    assert [(e["type"], e["reason"]) for e in json.loads(history.stdout)] == [
        ("node.cordoned", "node node-a: fan alarm [round 0, catalog position 0]"),
        ("node.uncordoned", "node node-a [round 0, catalog position 0]"),
    ]
