"""Secrets a profile names, resolved by a real agent for a real engine (agent.secrets)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent import processes
from agent.inventory import Inventory
from agent.placements import Key
from agent.runtime import Agent, AgentConfig
from agent.secrets import SecretMissing, resolve_env
from llmgw.gateway_settings import resolve_gateway
from tests.integration.test_agent_runtime import StandIn, placement, tick_until
from tests.unit.gateway.test_gateway_settings import settings_file

VALUE = "hf_node-local-value-42"


def _placement_with(env: dict[str, Any]) -> dict[str, Any]:
    p = placement("chat", [])
    p["engine"]["env"] = env
    return p


def _agent(tmp_path: Path, server: StandIn, secrets_dir: Path | None) -> Agent:
    config = AgentConfig(
        node="n1",
        state_dir=tmp_path / "state",
        engine_host="127.0.0.1",
        stop_grace=5,
        secrets_dir=secrets_dir,
    )
    inventory = Inventory(gpu_class="SIM", devices=(0, 1), memory_gb=64.0, cpus=2)
    # StandIn plays the ControlPlane client, a class (not a Protocol) it does not subclass.
    return Agent(config, inventory, server)  # type: ignore[arg-type]


def test_a_secret_from_the_secrets_dir_reaches_the_engine_and_nothing_else(
    tmp_path: Path,
) -> None:
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    (secrets_dir / "hf-token").write_text(VALUE + "\n")
    server = StandIn([_placement_with({"HF_TOKEN": {"secret": "hf-token"}, "LOG": "x"})])
    agent = _agent(tmp_path, server, secrets_dir)
    try:
        tick_until(agent, server, "ready")
        (engine,) = agent.procs.values()
        environ = psutil.Process(engine.pid).environ()
        assert environ["HF_TOKEN"] == VALUE and environ["LOG"] == "x"
        assert environ[processes.NONCE_VAR] == agent.records[Key("chat", 0)].nonce
    finally:
        agent.shutdown()
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file():
            assert VALUE.encode() not in path.read_bytes(), path
    assert VALUE not in repr(server.reports)


def test_a_missing_secret_fails_the_replica_saying_where_to_put_it(tmp_path: Path) -> None:
    server = StandIn([_placement_with({"HF_TOKEN": {"secret": "hf-token"}})])
    agent = _agent(tmp_path, server, tmp_path / "secrets")
    try:
        failed = tick_until(agent, server, "failed")
    finally:
        agent.shutdown()
    assert "secret 'hf-token'" in failed["message"]
    assert "LLMGW_SECRET_HF_TOKEN" in failed["message"]
    assert str(tmp_path / "secrets" / "hf-token") in failed["message"]


def test_a_secret_is_read_from_the_environment_when_no_file_holds_it(tmp_path: Path) -> None:
    env: dict[str, str | Mapping[str, str]] = {"A_KEY": {"secret": "db.pass"}, "PLAIN": "p"}
    assert resolve_env(env, None, {"LLMGW_SECRET_DB_PASS": "v"}) == {"A_KEY": "v", "PLAIN": "p"}
    (tmp_path / "db.pass").write_text("from-file")
    assert resolve_env(env, tmp_path, {"LLMGW_SECRET_DB_PASS": "v"})["A_KEY"] == "from-file"
    with pytest.raises(SecretMissing, match="1-128 letters"):
        resolve_env({"X": {"secret": "../etc/shadow"}}, tmp_path, os.environ)
    (tmp_path / "big").write_bytes(b"x" * (70 * 1024))
    with pytest.raises(SecretMissing, match="larger than"):
        resolve_env({"X": {"secret": "big"}}, tmp_path, {})


def test_an_engine_inherits_none_of_the_nodes_secrets_but_those_its_profile_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent's environment holds every secret of the node (LLMGW_SECRET_<NAME>); an
    # engine runs code that came with its model, and inherited them all.
    monkeypatch.setenv("LLMGW_SECRET_HF_TOKEN", VALUE)
    monkeypatch.setenv("LLMGW_SECRET_OTHER_TEAMS_KEY", "not-for-this-engine")
    monkeypatch.setenv("KEPT_FROM_THE_AGENT", "yes")
    server = StandIn([_placement_with({"HF_TOKEN": {"secret": "hf-token"}})])
    agent = _agent(tmp_path, server, None)
    try:
        tick_until(agent, server, "ready")
        (engine,) = agent.procs.values()
        environ = psutil.Process(engine.pid).environ()
    finally:
        agent.shutdown()
    assert environ["HF_TOKEN"] == VALUE and environ["KEPT_FROM_THE_AGENT"] == "yes"
    assert not [k for k in environ if k.startswith("LLMGW_SECRET_")], sorted(environ)


def _returns_within(seconds: float, call: Callable[[], object]) -> BaseException | object:
    """What ``call`` returned or raised, or fail if it blocked ``seconds``."""
    out: list[BaseException | object] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"blocked for more than {seconds} s"
    return out[0]


def test_a_secret_file_that_is_no_regular_file_is_refused_without_blocking(
    tmp_path: Path,
) -> None:
    # Attack: a FIFO in the secrets dir (no writer, or a one-shot FIFO already read):
    # open() blocked for ever, the gateway's event loop with it (it reads its engines'
    # keys at every table), and the agent's loop when it started an engine.
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    os.mkfifo(secrets / "engine-key")
    (secrets / "zeros").symlink_to("/dev/zero")
    (secrets / "a-dir").mkdir()
    (tmp_path / "real").write_text("the-key\n")
    (secrets / "linked").symlink_to(tmp_path / "real")  # as Kubernetes lays them out
    gateway = resolve_gateway({"secrets_dir": str(secrets)}, settings_file(tmp_path, ""), env={})
    try:
        for name in ("engine-key", "zeros", "a-dir"):
            for lookup in (
                lambda n=name: gateway.engine_secret(n),
                lambda n=name: resolve_env({"K": {"secret": n}}, secrets, {}),
            ):
                refused = _returns_within(5, lookup)
                assert isinstance(refused, LookupError), refused
                assert "not a regular file" in str(refused), refused
        assert gateway.engine_secret("linked") == "the-key"
    finally:
        # A writer, should a blocked open still wait, so that its thread ends (ENXIO:
        # no reader waits).
        with contextlib.suppress(OSError):
            os.close(os.open(secrets / "engine-key", os.O_WRONLY | os.O_NONBLOCK))
