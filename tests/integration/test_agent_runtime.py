"""The agent's loop in process, against a stand-in control plane, with real engine processes.

The stand-in replaces only the HTTP seam (``ControlPlane``): it records reports
and answers placements, so these tests look at what the agent sends and does
tick by tick. The real server is in tests/e2e/test_agent_cluster.py.
"""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from structlog.testing import capture_logs

from agent import processes
from agent.client import ControlPlane, Refused, Unreachable
from agent.inventory import Inventory
from agent.liveness import Liveness
from agent.runtime import Agent, AgentConfig


class StandIn:
    """What the agent calls on the control plane; ``refuse_replicas`` and ``refuse_switches``
    play older servers."""

    url = "http://stand-in"

    def __init__(
        self,
        placements: list[dict[str, Any]],
        refuse_replicas: bool = False,
        refuse_switches: bool = False,
    ) -> None:
        self.answer = placements
        self.reports: list[dict[str, Any]] = []
        self.refuse_replicas = refuse_replicas
        self.refuse_switches = refuse_switches
        # Whether each report was asked to say the client's server switches.
        self.switches: list[bool] = []
        self.down = False

    def report(self, node: str, body: dict[str, Any], *, switches: bool = False) -> Any:
        if self.down:
            raise Unreachable("connection refused")
        self.switches.append(switches)
        if self.refuse_switches and switches:
            # What a server of before the count answers: its fields, "address" among them.
            raise Refused(
                422,
                f'node "{node}": server_switches is not a field of a node report; the fields '
                "are name, gpu_class, gpus, gpus_reserved, memory_gb, labels, fabric, "
                "address, replicas",
            )
        if self.refuse_replicas and "replicas" in body:
            raise Refused(422, f'node "{node}": replicas is not a field of a node report')
        self.reports.append(body)
        return {}

    def placements(self, node: str) -> Any:
        if self.down:
            raise Unreachable("connection refused")
        return self.answer


def placement(model: str, args: list[str], gpus: int = 1) -> dict[str, Any]:
    return {
        "model": model,
        "replica": 0,
        "profile": "sim",
        "nodes": ["n1"],
        "gpus_per_node": gpus,
        "engine": {
            "name": "sim",
            "engine": "sim",
            "tp": max(gpus, 1),
            "gpus_per_node": gpus,
            "args": args,
            "model_path": "sim",
            "served_model_name": model,
        },
    }


@pytest.fixture
def make_agent(tmp_path: Path) -> Iterator[Any]:
    agents: list[Agent] = []

    def make(
        server: StandIn,
        devices: tuple[int, ...] = (0, 1),
        clock: Callable[[], float] = time.time,
        **more: Any,
    ) -> Agent:
        config = AgentConfig(
            node="n1",
            state_dir=tmp_path / "state",
            **{"engine_host": "127.0.0.1", "stop_grace": 5, **more},
        )
        inventory = Inventory(gpu_class="SIM", devices=devices, memory_gb=64.0, cpus=2)
        # StandIn plays the ControlPlane client, a class (not a Protocol) it does not subclass.
        agent = Agent(config, inventory, server, clock)  # type: ignore[arg-type]
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        agent.shutdown()


def tick_until(agent: Agent, server: StandIn, state: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent.tick()
        replicas = server.reports[-1].get("replicas") if server.reports else None
        if replicas and replicas[0]["state"] == state:
            return dict(replicas[0])
        time.sleep(0.1)
    raise AssertionError(f"never {state}: {server.reports[-1:]}")


def test_the_report_carries_the_inventory_and_each_replica_state(make_agent: Any) -> None:
    server = StandIn([placement("chat", [])])
    agent = make_agent(server)
    agent.tick()
    first = server.reports[0]
    assert first == {
        "gpu_class": "SIM",
        "gpus": 2,
        "memory_gb": 64.0,
        "labels": {},
        "fabric": None,
        "address": "127.0.0.1",
        "replicas": [],
    }
    ready = tick_until(agent, server, "ready")
    assert ready["endpoint"].startswith("http://127.0.0.1:")


def test_an_older_control_plane_gets_the_node_without_replica_states(make_agent: Any) -> None:
    server = StandIn([], refuse_replicas=True)
    agent = make_agent(server)
    agent.tick()
    agent.tick()
    assert (
        server.reports
        == [
            {
                "gpu_class": "SIM",
                "gpus": 2,
                "memory_gb": 64.0,
                "labels": {},
                "fabric": None,
                "address": "127.0.0.1",
            }
        ]
        * 2
    )


def test_an_older_control_plane_gets_the_report_without_server_switches_and_keeps_the_rest(
    make_agent: Any,
) -> None:
    server = StandIn([], refuse_switches=True)
    agent = make_agent(server)
    agent.tick()
    agent.tick()
    # Asked once with the count, refused, then never again; the address is still sent.
    assert server.switches == [True, False, False]
    assert [r["address"] for r in server.reports] == ["127.0.0.1"] * 2
    assert "replicas" in server.reports[0]


def test_a_replica_without_enough_free_cards_is_reported_starting_with_why(
    make_agent: Any,
) -> None:
    server = StandIn([placement("wide", [], gpus=4)])
    agent = make_agent(server)
    agent.tick()
    agent.tick()
    (state,) = server.reports[-1]["replicas"]
    assert state == {
        "model": "wide",
        "replica": 0,
        "state": "starting",
        "message": "waiting for 4 free GPU(s): 2 of the node's 2 are free",
    }


def test_a_failed_engine_message_is_bounded_and_printable(make_agent: Any) -> None:
    noisy = ["--model-path-note", "\x1b[31m" + "x" * 3000]  # sim refuses the unknown flag
    server = StandIn([placement("noisy", noisy)])
    agent = make_agent(server)
    failed = tick_until(agent, server, "failed")
    assert failed["message"].startswith("the engine exited with code 2; last log lines: ")
    assert len(failed["message"]) <= 1000 and failed["message"].isprintable()


def test_an_unreachable_control_plane_stops_nothing(make_agent: Any) -> None:
    server = StandIn([placement("chat", [])])
    agent = make_agent(server)
    tick_until(agent, server, "ready")
    server.down = True
    for _ in range(3):
        agent.tick()
    assert len(agent.procs) == 1 and all(r.alive for r in agent.records.values())


class ThawClock:
    """The wall clock, with the time a frozen agent did not see pass added at its thaw."""

    def __init__(self) -> None:
        self.frozen_for = 0.0

    def __call__(self) -> float:
        return time.time() + self.frozen_for


class FreezingStandIn(StandIn):
    """Freezes the agent once inside the call named, for a time in which the control
    plane gives the node up: from then on nothing is placed on it. ``slow``: the call
    takes as long but the agent's process runs throughout (its liveness thread beats:
    here, by hand every half second), as on a slow control plane."""

    def __init__(self, placements: list[dict[str, Any]], clock: ThawClock) -> None:
        super().__init__(placements)
        self.clock = clock
        self.freeze_in: str | None = None
        self.slow = False
        self.liveness: Liveness | None = None

    def _maybe_freeze(self, call: str) -> None:
        if self.freeze_in == call:
            self.freeze_in = None
            assert self.liveness is not None
            self.liveness.beat()  # the last beat before the freeze
            for _ in range(120):
                self.clock.frozen_for += 0.5
                if self.slow:
                    self.liveness.beat()
            self.answer = []

    def report(self, node: str, body: dict[str, Any], *, switches: bool = False) -> Any:
        self._maybe_freeze("report")  # frozen before sending: the server hears it after
        return super().report(node, body, switches=switches)

    def placements(self, node: str) -> Any:
        self._maybe_freeze("placements")
        return super().placements(node)


@pytest.mark.parametrize("call", ["report", "placements"])
def test_an_agent_frozen_halfway_through_a_tick_holds_its_engine_when_it_thaws(
    make_agent: Any, call: str
) -> None:
    # The freeze (SIGSTOP, a paused VM) lands inside a tick, not between two: the tick
    # finishes after the thaw, and the placements it reads may be a control plane's
    # that gave the node up meanwhile. The engine is held (``readopt_grace``), not
    # stopped, for the control plane to place the replica again where it runs.
    clock = ThawClock()
    server = FreezingStandIn([placement("chat", [])], clock)
    agent = make_agent(server, clock=clock)
    server.liveness = agent.liveness
    tick_until(agent, server, "ready")
    ((key, engine),) = agent.procs.items()
    server.freeze_in = call
    for _ in range(3):
        agent.tick()
    assert server.freeze_in is None and server.answer == []
    assert list(agent.procs) == [key] and agent.procs[key].pid == engine.pid
    assert agent.procs[key].exit_status() == (False, None)
    assert set(agent.held) == {key}
    # The report after the thaw goes in full and names the running engine.
    assert [r["replica"] for r in server.reports[-1]["replicas"]] == [0]


@pytest.mark.parametrize("call", ["report", "placements"])
def test_a_slow_control_plane_is_no_time_away_and_an_unplaced_engine_stops(
    make_agent: Any, call: str
) -> None:
    # The same minute inside a call, but waited, not frozen (a report that took its
    # time and went through): the control plane never gave the node up, the replica
    # was removed meanwhile, and its engine stops as any other (not held 30 s).
    clock = ThawClock()
    server = FreezingStandIn([placement("chat", [])], clock)
    agent = make_agent(server, clock=clock)
    server.liveness, server.slow = agent.liveness, True
    tick_until(agent, server, "ready")
    server.freeze_in = call
    for _ in range(3):
        agent.tick()
    assert server.freeze_in is None and server.answer == []
    assert agent.held == {} and list(agent.procs) == []


class LateBeatStandIn(FreezingStandIn):
    """The liveness thread beating as it does (here: at every placements read), its first
    beat after a thaw coming only once the main thread has handled the report's answer:
    which of the two threads runs first after a SIGCONT is the scheduler's choice."""

    def placements(self, node: str) -> Any:
        assert self.liveness is not None
        self.liveness.beat()
        return super().placements(node)


def test_one_freeze_is_one_time_away_whichever_thread_sees_it_first(make_agent: Any) -> None:
    # Frozen inside the report; after the thaw the main thread sees the stall first (no
    # beat for that long) and the report ends the time away (``agent.back``: the engines
    # held). The liveness thread's late beat then saw the same stall as a new one, after
    # the contact: the tick applied nothing, and the next one reported "back" again and
    # held every engine anew.
    clock = ThawClock()
    server = LateBeatStandIn([placement("chat", [])], clock)
    agent = make_agent(server, clock=clock)
    server.liveness = agent.liveness
    tick_until(agent, server, "ready")
    ((key, _engine),) = agent.procs.items()
    server.freeze_in = "report"
    with capture_logs() as logs:
        agent.tick()
        assert agent.placed == []  # the thawed tick applied what it read
        held = dict(agent.held)
        for _ in range(2):
            agent.tick()
    assert [e["event"] for e in logs].count("agent.back") == 1, logs
    assert set(held) == {key} and agent.held == held


class _Huge(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"[" + b" " * (9 << 20) + b"]")

    def log_message(self, *args: Any) -> None:
        pass


def test_the_client_reads_an_answer_only_up_to_its_bound() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Huge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = ControlPlane(f"http://127.0.0.1:{server.server_address[1]}", "t")
        with pytest.raises(Unreachable, match="longer than 8388608 bytes"):
            client.placements("n1")
    finally:
        server.shutdown()


class BeatingStandIn(StandIn):
    """A control plane that takes heartbeats, at ``heartbeat_port`` on 127.0.0.1."""

    token = "llmgw_test-token"

    def __init__(self, url: str, heartbeat_port: int) -> None:
        super().__init__([])
        self.url = url
        self.heartbeat_port = heartbeat_port

    def report(self, node: str, body: dict[str, Any], *, switches: bool = False) -> Any:
        super().report(node, body, switches=switches)
        return {"report_id": f"x.{len(self.reports)}", "heartbeat_port": self.heartbeat_port}


@pytest.mark.parametrize(("scheme", "beats"), [("http", True), ("https", False)])
def test_heartbeats_go_only_beside_a_server_reached_by_plain_http(
    make_agent: Any, scheme: str, beats: bool
) -> None:
    # A heartbeat carries the token in the clear: an https server's agent reports in full.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        server = BeatingStandIn(f"{scheme}://127.0.0.1:1", listener.getsockname()[1])
        agent = make_agent(server)
        agent.tick()
        assert len(server.reports) == 1
        # Nothing changed: a heartbeat (nobody answers it: the full report follows), or not.
        agent.tick()
        assert len(server.reports) == 2
        try:
            listener.accept()[0].close()  # the agent's connection, if it made one
            connected = True
        except BlockingIOError:
            connected = False
        assert connected is beats


def test_a_signal_during_adoption_asks_for_a_clean_stop(
    make_agent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``llmgw agent``'s handler ends an agent at once only while it is not ``looping``:
    # once its state dir is locked the engines it adopts are its to stop, so a signal
    # during adoption must ask for a clean stop (the loop ends at once, shutdown stops
    # them), not exit with them running and their records kept.
    agent = make_agent(StandIn([]))
    seen: list[bool] = []

    def adopt() -> None:
        seen.append(agent.looping)
        agent.stopping.set()  # the signal, as the handler sets it

    monkeypatch.setattr(agent, "adopt", adopt)
    agent.run()
    assert seen == [True]


class _Healthy(http.server.BaseHTTPRequestHandler):
    """Another process's engine: answers any health check."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


def test_a_port_taken_between_its_pick_and_the_engines_start_is_a_failed_start(
    make_agent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race on any shared host (and in CI, between two agents' engines): the port the
    # agent picked free is taken before its engine binds it. The taker answers /health;
    # the engine cannot bind and exits. The replica is never ready at an endpoint that
    # serves another model: its start fails, naming the engine's exit.
    taker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=taker.serve_forever, daemon=True).start()
    try:
        port = taker.server_address[1]
        monkeypatch.setattr("agent.processes.free_port", lambda host: port)
        server = StandIn([placement("chat", [])])
        agent = make_agent(server)
        failed = tick_until(agent, server, "failed")
        states = [r["state"] for b in server.reports for r in b.get("replicas", [])]
        assert "ready" not in states, states
        assert failed["message"].startswith("the engine exited with code"), failed
    finally:
        taker.shutdown()
        taker.server_close()


def test_an_engine_is_ready_once_it_answers_on_its_own_port(make_agent: Any) -> None:
    server = StandIn([placement("chat", [])])
    agent = make_agent(server)
    ready = tick_until(agent, server, "ready")
    port = int(ready["endpoint"].rsplit(":", 1)[1].split("/")[0])
    (proc,) = agent.procs.values()
    assert processes.listens_on(proc.pid, port) is True
    assert processes.listens_on(proc.pid, port + 1) is False


# A llama-server as far as the agent can tell: its flags, /health, and the socket option
# llama.cpp's HTTP server (cpp-httplib) and vLLM's (create_server_socket) both set:
# SO_REUSEPORT, with which a second process of the same user binds a port already bound.
_REUSEPORT_SERVER = """\
import http.server, socket, socketserver, sys
argv = sys.argv
host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass

class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    allow_reuse_port = True

Server((host, port), Health).serve_forever()
"""


class _ReusePortTaker(http.server.ThreadingHTTPServer):
    allow_reuse_port = True


def test_a_port_shared_by_so_reuseport_is_not_reported_ready(
    make_agent: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race the listener check is for, with the engines that run in production:
    # vLLM and llama.cpp bind their port with SO_REUSEPORT, so an engine whose port was
    # taken between its pick and its start (another agent's engine, of the same user)
    # binds it anyway and does not exit. Both listen; the kernel hands each connection to
    # one or the other, the health check's and the gateway's alike. The engine's own
    # tree listens on its port, but so does another process: it is never ready there.
    script = tmp_path / "llama-server"
    script.write_text(f"#!{sys.executable}\n{_REUSEPORT_SERVER}")
    script.chmod(0o755)
    taker = _ReusePortTaker(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=taker.serve_forever, daemon=True).start()
    try:
        port = taker.server_address[1]
        monkeypatch.setattr("agent.processes.free_port", lambda host: port)
        server = StandIn([llamacpp_placement("chat")])
        agent = make_agent(server)
        agent.config = replace(agent.config, llamacpp_server=str(script))
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            agent.tick()
            time.sleep(0.1)
        (proc,) = agent.procs.values()
        # (The engine did bind: SO_REUSEPORT let it.)
        assert proc.exit_status() == (False, None)
        assert processes.listens_on(proc.pid, port) is False
        states = [r["state"] for b in server.reports for r in b.get("replicas", [])]
        assert "ready" not in states, states
        # The other listener gone, the port is the engine's alone: ready.
        taker.shutdown()
        taker.server_close()
        assert processes.listens_on(proc.pid, port) is True
        tick_until(agent, server, "ready", timeout=10)
    finally:
        taker.shutdown()
        taker.server_close()


def llamacpp_placement(model: str) -> dict[str, Any]:
    p = placement(model, [])
    p["profile"] = "cpp"
    p["engine"] = {**p["engine"], "name": "cpp", "engine": "llamacpp", "model_path": "/m.gguf"}
    return p


def test_an_engine_that_exited_listens_on_nothing() -> None:
    # An engine that failed to bind exits; until the agent reaps it, it is a zombie,
    # with no sockets and no network namespace to read. Seen as "cannot be read", that
    # passed as ready (the taker's /health answered), the replica reported ready at an
    # endpoint another process serves, then failed.
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
        assert processes.listens_on(proc.pid, 80) is False
    finally:
        proc.wait()


_LISTEN_THEN_WAIT = """\
import socket, sys, time
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(family)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen()
print("listening", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize(
    ("engine", "other", "shared"),
    [
        ("0.0.0.0", "127.0.0.1", True),  # the health check's address taken from the engine
        ("127.0.0.1", "0.0.0.0", True),
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.1", "127.0.0.2", False),  # another address: not the engine's traffic
    ],
)
def test_another_listener_on_the_port_counts_where_its_address_overlaps(
    engine: str, other: str, shared: bool
) -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((other, 0))
    port = sock.getsockname()[1]
    sock.listen()
    proc = subprocess.Popen(
        [sys.executable, "-c", _LISTEN_THEN_WAIT, engine, str(port)], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"listening\n"
        assert processes.listens_on(proc.pid, port) is (not shared)
        sock.close()
        assert processes.listens_on(proc.pid, port) is True
    finally:
        sock.close()
        proc.kill()
        proc.wait()


def test_an_engine_on_an_ipv6_host_is_ready_at_a_bracketed_endpoint(make_agent: Any) -> None:
    # --engine-host :: and an IPv6 address advertised: the port was picked on an IPv4
    # socket (which cannot bind ::) and the endpoint and health URL had no brackets.
    server = StandIn([placement("chat", [])])
    agent = make_agent(server, engine_host="::", advertise="::1")
    ready = tick_until(agent, server, "ready")
    assert ready["endpoint"].startswith("http://[::1]:"), ready
    answer = httpx.post(
        ready["endpoint"] + "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    assert processes.url_host("10.0.0.7") == "10.0.0.7"
    assert processes.url_host("fd00::7") == "[fd00::7]"
