"""The node agent end to end: a real server, real agents on loopback, real sim engines.

The server runs placement rounds itself (``ROUNDS``), except in the failure test:
there `llmgw place` runs one round, so the failed state the agent reports stays
visible until the test reads it (a later round would place the replica again).
The node-loss test shortens the staleness settings; the others keep the
defaults, so a busy machine cannot make a node look lost.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import httpx
import psutil
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from agent.inventory import detect
from agent.processes import same_process
from tests.api.server import LLMGW
from tests.e2e.agents import SIM, AgentProc, cluster, eventually

pytestmark = pytest.mark.slow


ROUNDS = ["--with-scheduler", "--interval", "0.3"]


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "llmgw.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


def engine_env(pid: int) -> str:
    return psutil.Process(pid).environ()["CUDA_VISIBLE_DEVICES"]


def test_placed_replicas_become_ready_on_cards_of_their_own_serve_openai_and_outlive_the_server(
    tmp_path: Path, sqlite_url: str
) -> None:
    with cluster(tmp_path, sqlite_url, ["n1", "n2"], server_args=ROUNDS) as c:
        n1, n2 = c.agent("n1"), c.agent("n2")
        placed = eventually(lambda: c.ready("chat", 3), "3 chat replicas ready")
        on = {n: sum(p["nodes"] == [n] for p in placed) for n in ("n1", "n2")}
        assert sorted(on.values()) == [1, 2]  # best fit fills one node's two cards
        # Each engine was given cards of its own, recorded and set in its environment.
        for agent in (n1, n2):
            cards = {"0", "1"} if on[agent.node] == 2 else {"0"}
            live = agent.live_engines()
            assert {engine_env(r["pid"]) for r in live} == cards
            assert {",".join(map(str, r["devices"])) for r in live} == cards
        for p in placed:
            assert httpx.get(p["endpoint"] + "/health", timeout=10).status_code == 200

        client = OpenAI(base_url=placed[0]["endpoint"] + "/v1", api_key="unused", timeout=30)
        assert [m.id for m in client.models.list().data] == ["chat"]
        ask: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": "Where do replicas run?"}
        ]
        answer = client.chat.completions.create(model="chat", messages=ask, max_tokens=6)
        text = answer.choices[0].message.content
        assert text is not None and len(text.split()) == 6
        chunks = client.chat.completions.create(
            model="chat",
            messages=ask,
            max_tokens=6,
            stream=True,
        )
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert streamed == text  # synthetic, and the same prompt gets the same text

        # The control plane goes away: the engines keep serving.
        c.server.stop()
        eventually(lambda: len(n1.logs("agent.server_unreachable")) >= 3, "three ticks unheard")
        assert len(n1.live_engines()) + len(n2.live_engines()) == 3
        for p in placed:
            assert httpx.get(p["endpoint"] + "/health", timeout=10).status_code == 200
        assert n1.logs("agent.engine_stopped") == n2.logs("agent.engine_stopped") == []


def test_an_engine_that_dies_is_reported_failed_with_its_exit_code_and_last_log_lines(
    tmp_path: Path, sqlite_url: str
) -> None:
    crashy = {
        **SIM,
        "name": "crashy",
        "scaling": {"min": 1},
        "profiles": [
            {
                "name": "sim",
                "engine": "sim",
                "gpu_class": "SIM",
                "args": ["--exit-after", "0.5", "--exit-code", "3"],
            }
        ],
    }
    with cluster(tmp_path, sqlite_url, ["n1"], models=[crashy]) as c:
        agent = c.agent("n1")
        # "reporting to" is printed before the agent's first report: one round run before
        # the node is known places nothing, and no later round would.
        eventually(lambda: c.cli.json("nodes", "list") or None, "n1 reported")
        c.place()

        def failed() -> dict[str, object] | None:
            p = c.states().get(("crashy", 0))
            return p if p is not None and p["state"] == "failed" else None

        p = eventually(failed, "crashy[0] reported failed")
        message = str(p["message"])
        assert message.startswith("the engine exited with code 3; last log lines: ")
        assert message.endswith("sim engine: exiting with code 3 as asked (--exit-after)")
        (event,) = agent.logs("agent.engine_failed")
        assert event["exit_code"] == 3
        assert agent.live_engines() == []  # and, with a long back-off, not restarted yet


def test_a_restarted_agent_adopts_its_engines_and_a_stopped_one_stops_them(
    tmp_path: Path, sqlite_url: str
) -> None:
    with cluster(tmp_path, sqlite_url, ["n1"], server_args=ROUNDS) as c:
        first = c.agent("n1", "--leave-engines")
        eventually(lambda: c.ready("chat", 2), "2 chat replicas ready on n1's two cards")
        engines = {r["pid"] for r in first.live_engines()}
        assert len(engines) == 2

        # The agent crashes: its engines keep serving, and the next agent adopts them.
        first.stop(signal.SIGKILL)
        second = c.agent("n1", "--leave-engines")
        eventually(lambda: len(second.logs("agent.reconciled")) >= 5, "five ticks after restart")
        assert len(second.logs("agent.engine_adopted")) == 2
        assert second.logs("agent.engine_started") == []
        assert {r["pid"] for r in second.live_engines()} == engines
        assert c.ready("chat", 2)

        # SIGTERM with --leave-engines: the agent exits and leaves them running.
        assert second.stop() == 0
        assert [e["engines"] for e in second.logs("agent.engines_left")] == [2]
        assert {r["pid"] for r in second.live_engines()} == engines

        # SIGTERM without it: the engines are stopped (SIGTERM to each) and forgotten.
        third = c.agent("n1")
        eventually(lambda: len(third.logs("agent.engine_adopted")) == 2, "adopted again")
        assert third.stop() == 0
        assert third.records() == []
        records_gone = [p for p in engines if psutil.pid_exists(p) and _is_sim(p)]
        assert records_gone == []
        assert len(third.logs("agent.engine_stopped")) == 2


def _is_sim(pid: int) -> bool:
    try:
        return "agent.sim" in psutil.Process(pid).cmdline()
    except psutil.Error:
        return False


def test_a_replica_no_longer_placed_on_the_node_is_stopped(tmp_path: Path, sqlite_url: str) -> None:
    extra = {**SIM, "name": "extra", "scaling": {"min": 1}}
    with cluster(tmp_path, sqlite_url, ["n1"], models=[], server_args=ROUNDS) as c:
        agent = c.agent("n1")
        c.add(extra)
        eventually(lambda: c.ready("extra", 1), "extra[0] ready")
        (record,) = agent.live_engines()
        c.remove("extra")
        (stopped,) = eventually(lambda: agent.logs("agent.engine_stopped"), "the engine stopped")
        assert agent.records() == []
        assert not same_process(record["pid"], record["start_time"], record["argv"])
        assert stopped["reason"] == "no longer placed on this node"


def test_a_lost_node_has_its_replicas_ready_elsewhere(tmp_path: Path, sqlite_url: str) -> None:
    args = ["--with-scheduler", "--interval", "0.3", "--stale-after", "2", "--grace", "2"]
    with cluster(tmp_path, sqlite_url, ["n1", "n2", "n3"], server_args=args) as c:
        for node in ("n1", "n2", "n3"):
            c.agent(node)
        placed = eventually(lambda: c.ready("chat", 3), "3 chat replicas ready")
        busiest = max(("n1", "n2", "n3"), key=lambda n: sum(p["nodes"][0] == n for p in placed))
        # The machine goes away: its agent and its engines with it.
        c.agents[busiest].stop(signal.SIGKILL)
        c.agents[busiest].kill_engines()

        def moved() -> list[dict[str, object]] | None:
            ready = c.ready("chat", 3)
            return ready if ready and all(p["nodes"] != [busiest] for p in ready) else None

        after = eventually(moved, f"3 chat replicas ready without {busiest}")
        for p in after:
            assert httpx.get(str(p["endpoint"]) + "/health", timeout=10).status_code == 200


FAKE_NVML = '''
"""A stand-in for nvidia-ml-py: two A100 cards, for an agent on a machine without any."""
class NVMLError(Exception):
    pass
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(h): return "NVIDIA A100-SXM4-80GB"
'''


def test_cards_found_through_nvml_are_reported_and_given_to_engines(
    tmp_path: Path, sqlite_url: str
) -> None:
    big = {
        **SIM,
        "name": "big",
        "scaling": {"min": 1},
        "profiles": [{"name": "a100", "engine": "sim", "gpu_class": "A100", "tp": 2}],
    }
    fake = tmp_path / "fake-nvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text(FAKE_NVML)
    with cluster(tmp_path, sqlite_url, ["gpu", "plain"], models=[big], server_args=ROUNDS) as c:
        agent = c.agent("gpu", gpus=None, env={"PYTHONPATH": f"{fake}:{Path.cwd()}"})
        c.agent("plain", gpus=None)  # the real NVML bindings, on this machine's driver
        with c.server.client(c.tokens.reader) as http:

            def nodes() -> dict[str, dict[str, object]] | None:
                got = {n["name"]: n for n in http.get("/v1/nodes").json()}
                return got if len(got) == 2 else None

            reported = eventually(nodes, "both nodes reported")
        assert (reported["gpu"]["gpu_class"], reported["gpu"]["gpus"]) == ("A100", 2)
        # The real bindings: no cards on a machine without a driver, its cards where it has some.
        assert reported["plain"]["gpus"] == detect().gpus
        eventually(lambda: c.ready("big", 1), "big[0] ready on the A100 node")
        (record,) = agent.live_engines()
        assert engine_env(record["pid"]) == "0,1"
        assert c.states()[("big", 0)]["nodes"] == ["gpu"]


def test_a_drained_node_hands_its_replicas_over_surge_first_then_stops_its_engines(
    tmp_path: Path, sqlite_url: str
) -> None:
    """`POST /v1/nodes/NAME/drain` with real agents: every replica on the node is replaced
    elsewhere, and each old engine is stopped only once its replacement answers ready, so the
    model never has fewer ready replicas than before the drain."""
    one = {**SIM, "name": "chat", "scaling": {"min": 2}}
    with cluster(tmp_path, sqlite_url, ["n1", "n2"], models=[one], server_args=ROUNDS) as c:
        first = c.agent("n1", gpus="SIM:2")
        eventually(lambda: c.ready("chat", 2), "2 chat replicas ready on n1")
        assert {tuple(p["nodes"]) for p in c.placements()} == {("n1",)}
        c.agent("n2", gpus="SIM:2")
        with c.server.client(c.tokens.operator) as http:
            answer = http.post("/v1/nodes/n1/drain", params={"reason": "kernel update"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["replicas_left"] == 2

        # Watch the hand-over: ready replicas never drop below the two there were.
        fewest = 2

        def moved() -> list[dict[str, object]] | None:
            nonlocal fewest
            ps = [p for p in c.placements() if p["model"] == "chat"]
            fewest = min(fewest, sum(p["state"] == "ready" for p in ps))
            done = len(ps) == 2 and all(p["nodes"] == ["n2"] and p["state"] == "ready" for p in ps)
            return ps if done else None

        eventually(moved, "both chat replicas ready on n2 and none left on n1")
        assert fewest >= 2

        def both_stopped() -> list[dict[str, object]] | None:
            # (Both: the agent forgets an engine's record before it logs the stop, so a
            # look between the two saw the records gone and one line of two.)
            said = first.logs("agent.engine_stopped")
            return said if first.records() == [] and len(said) >= 2 else None

        stopped = eventually(both_stopped, "n1's engines stopped")
        assert len(stopped) == 2
        assert first.live_engines() == []
        with c.server.client(c.tokens.reader) as http:
            (node,) = [n for n in http.get("/v1/nodes").json() if n["name"] == "n1"]
        assert node["cordon"]["mode"] == "draining"
        assert node["cordon"]["reason"] == "kernel update"
        assert node["service"] == "draining (0 replicas left)"


def test_engine_logs_are_rotated_past_the_limit_while_the_engine_serves(
    tmp_path: Path, sqlite_url: str
) -> None:
    one = {**SIM, "name": "chat", "scaling": {"min": 1}}
    with cluster(tmp_path, sqlite_url, ["n1"], models=[one], server_args=ROUNDS) as c:
        # 200 bytes: the engine's start-up lines alone pass it.
        agent = c.agent("n1", "--log-max-mb", "0.0002", "--log-keep", "1")
        (placed,) = eventually(lambda: c.ready("chat", 1), "chat[0] ready")
        (event, *_) = eventually(lambda: agent.logs("agent.log_rotated"), "a rotation")
        log = Path(event["log_path"])
        assert log.with_name(log.name + ".1").exists()
        assert not log.with_name(log.name + ".2").exists()  # --log-keep 1
        assert httpx.get(placed["endpoint"] + "/health", timeout=10).status_code == 200
        assert len(agent.live_engines()) == 1


def test_an_agent_set_up_by_the_settings_file_alone_runs_its_replicas(
    tmp_path: Path, sqlite_url: str
) -> None:
    """A node configured once, in llmgw.toml's [agent] table: `llmgw agent` with no flags."""
    with cluster(tmp_path, sqlite_url, ["n1"], server_args=ROUNDS) as c:
        node = tmp_path / "node-etc"
        node.mkdir()
        (node / "agent.token").write_text(c.tokens.agents["n1"] + "\n")
        (node / "llmgw.toml").write_text(
            "[agent]\n"
            f'server = "{c.server.url}"\n'
            'token_file = "agent.token"\n'
            'node = "n1"\n'
            'interval = "200ms"\n'
            'state_dir = "state"\n'
            'gpus = "SIM:2"\n'
            'engine_host = "127.0.0.1"\n'
            'advertise = "127.0.0.1"\n'
            'stop_grace = "5s"\n'
        )
        agent = AgentProc(tmp_path, c.server.url, "n1", c.tokens.agents["n1"], gpus=None)
        agent.argv = [LLMGW, "agent"]
        agent.state_dir = node / "state"
        c.agents["n1"] = agent
        agent.start({"LLMGW_SETTINGS": str(node / "llmgw.toml")})
        eventually(lambda: c.ready("chat", 2), "2 chat replicas ready on n1's two cards")
        assert len(agent.live_engines()) == 2
        (started,) = agent.logs("agent.started")
        assert (started["node"], started["gpus"], started["state_dir"]) == (
            "n1",
            2,
            str(node / "state"),
        )


GANG = {
    **SIM,
    "name": "big",
    "scaling": {"min": 1},
    "profiles": [{"name": "two-nodes", "engine": "sim", "gpu_class": "SIM", "tp": 2, "nodes": 2}],
}


def test_a_replica_spanning_two_nodes_runs_an_engine_on_each_and_fails_as_one(
    tmp_path: Path, sqlite_url: str
) -> None:
    """vLLM's multi-node shape with sim engines: the head serves and gathers, the worker
    joins it headless at the address its agent read from the head's reported endpoint;
    one rank lost fails the replica."""
    with cluster(tmp_path, sqlite_url, ["n1", "n2"], models=[GANG], server_args=ROUNDS) as c:
        agents = {n: c.agent(n, "--fabric", "ib-1", gpus="SIM:1") for n in ("n1", "n2")}
        (placed,) = eventually(lambda: c.ready("big", 1), "big[0] ready on two nodes")
        head_node, worker_node = placed["nodes"]
        (head,) = agents[head_node].live_engines()
        (worker,) = agents[worker_node].live_engines()
        port = int(str(placed["endpoint"]).rsplit(":", 1)[1])
        assert head["argv"][-8:] == [
            "--nnodes", "2", "--node-rank", "0",
            "--master-addr", "127.0.0.1", "--master-port", str(port + 1),
        ]  # fmt: skip
        assert worker["argv"][-9:] == [
            "--nnodes", "2", "--node-rank", "1",
            "--master-addr", "127.0.0.1", "--master-port", str(port + 1), "--headless",
        ]  # fmt: skip
        assert head["endpoint"] == placed["endpoint"]
        client = OpenAI(base_url=str(placed["endpoint"]) + "/v1", api_key="unused", timeout=30)
        answer = client.chat.completions.create(
            model="big", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert answer.choices[0].message.content

        # The worker's node loses its engine: the gang cannot serve, the replica fails.
        agents[worker_node].kill_engines()

        def failed() -> list[dict[str, object]]:
            done = c.cli.json("history", "--placements", "--type", "replica.failed")
            return [e for e in done if e.get("model") == "big"]

        (event, *_) = eventually(failed, "big[0] reported failed")
        # Whichever agent spoke first names the rank: the worker's ("node n2 (rank 1): the
        # engine was killed by SIGKILL") or the head's (its engine "lost rank 1").
        assert "rank 1" in str(event["reason"]), event
        eventually(lambda: agents[head_node].live_engines() == [], "the head gave up too")


def test_a_ready_engine_is_asked_what_one_request_may_use_and_a_larger_catalog_figure_warned(
    tmp_path: Path, sqlite_url: str
) -> None:
    short = {
        **SIM,
        "name": "short",
        "context_length": 1024,
        "scaling": {"min": 1},
        "profiles": [
            {"name": "sim", "engine": "sim", "gpu_class": "SIM", "args": ["--max-model-len", "512"]}
        ],
    }
    with cluster(tmp_path, sqlite_url, ["n1"], server_args=ROUNDS, models=[short]) as c:
        agent = c.agent("n1")
        eventually(lambda: c.ready("short", 1), "short[0] ready")

        def read() -> dict[str, object] | None:
            p = c.states()[("short", 0)]
            return p if p["effective_context_length"] is not None else None

        p = eventually(read, "short[0] reported with its engine's context")
        assert (p["effective_context_length"], p["context_detail"]) == (512, "max_model_len 512")
        assert str(p["context_warning"]).startswith("max_model_len 512 < context_length 1024: ")
        (event,) = agent.logs("agent.engine_context")
        assert event["effective_context_length"] == 512
