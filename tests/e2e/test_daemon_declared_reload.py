"""`llmgw daemon` takes an edit of the declared file while it runs, and places by it."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.agents import eventually
from tests.e2e.test_daemon import NODES, Env, _model
from tests.support import dump_yaml


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path, f"sqlite:///{tmp_path / 'llmgw.db'}")
    e.llmgw("db", "upgrade")
    yield e
    for proc, _ in e.daemons:
        proc.kill()
        proc.wait()


def test_the_daemon_takes_an_edit_of_the_declared_file_and_refuses_a_bad_one(env: Env) -> None:
    config = env.workdir / "catalog.yaml"
    config.write_text(dump_yaml({"models": [_model("chat", 1)]}))
    env.llmgw("nodes", "report", env.write("nodes.yaml", NODES))
    proc, log = env.start_daemon()
    eventually(lambda: len(env.placements()) == 1, "chat placed")

    # A bad edit: refused, the daemon keeps placing by the catalog in force.
    bad = _model("chat", 3)
    bad["profiles"] = [{"name": "t4", "gpu_class": "T4", "tp": 2, "engine": "vlm"}]
    config.write_text(dump_yaml({"models": [bad]}))
    eventually(lambda: "catalog.declared_refused" in log.read_text(), "the edit refused", 60)
    status = json.loads(env.llmgw("status", "--json").stdout)
    assert status["declared"][0]["state"] == "refused"
    assert "llmgw daemon" in status["declared"][0]["by"]
    assert len(env.placements()) == 1

    # Fixed (3 replicas now): taken, recorded, and placed by.
    config.write_text(dump_yaml({"models": [_model("chat", 3)]}))
    eventually(lambda: len(env.placements()) == 3, "3 chat replicas placed", 60)
    history = json.loads(env.llmgw("history", "--json").stdout)
    (event,) = [e for e in history if e["type"] == "catalog.declared_changed"]
    assert "llmgw daemon" in event["actor"]
    # SIGHUP does not stop it; SIGTERM does, cleanly.
    proc.send_signal(signal.SIGHUP)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
