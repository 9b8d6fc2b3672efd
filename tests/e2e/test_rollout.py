"""Surge-first rollouts with real agents, by `llmgw apply` and by editing the declared file.

A real `llmgw serve --with-scheduler` and two real `llmgw agent`s whose sim engines take
a few seconds to load (``--startup-delay``). A sampler watches the model every 200 ms
from the outside, as an operator's probe would: a replica counts as ready only when the
API says so *and* its engine answers ``/health``. Through each rollout the model never
has fewer than ``scaling.min - max_unavailable`` such replicas; afterwards every engine
runs the new arguments and every old engine has exited.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.processes import same_process
from tests.e2e.agents import Cluster, cluster, eventually
from tests.support import dump_yaml

pytestmark = pytest.mark.slow

ROUNDS = ["--with-scheduler", "--interval", "0.3"]
# Long enough that an engine restarted in place leaves a visible hole at 200 ms sampling.
STARTUP = ["--startup-delay", "3"]


def sim_model(name: str, token_delay: str) -> dict[str, Any]:
    return {
        "name": name,
        "source": f"sim/{name}",
        "scaling": {"min": 2},
        "rollout": {"max_surge": 1, "max_unavailable": 0},
        "profiles": [
            {
                "name": "sim",
                "engine": "sim",
                "gpu_class": "SIM",
                "args": [*STARTUP, "--token-delay", token_delay],
            }
        ],
    }


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "llmgw.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


@dataclass
class Sampler:
    """Every 200 ms: how many replicas of ``model`` are ready and answer /health."""

    c: Cluster
    model: str
    samples: list[int] = field(default_factory=list)
    # Samples taken while the change ran (``settle`` notes it).
    during: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def serving(self) -> int:
        count = 0
        with self.c.server.client(self.c.tokens.reader, timeout=5) as http:
            rows = http.get("/v1/placements", params={"model": self.model}).json()
        for p in rows:
            if p["state"] != "ready" or not p["endpoint"]:
                continue
            with suppress(httpx.HTTPError):
                if httpx.get(p["endpoint"] + "/health", timeout=2).status_code == 200:
                    count += 1
        return count

    def run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.samples.append(self.serving())
            self._stop.wait(max(0.0, 0.2 - (time.monotonic() - started)))

    def settle(self, more: int = 5, timeout: float = 60) -> None:
        """Once the change is done: note how many samples it took, then wait for ``more``.

        A count of samples, not a sleep: under load one sample (an API read and a /health
        per replica) can take far longer than its 200 ms period."""
        self.during = len(self.samples)
        target = len(self.samples) + more
        deadline = time.monotonic() + timeout
        while len(self.samples) < target and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.samples) >= target, f"the sampler stalled at {len(self.samples)} samples"

    @contextmanager
    def watching(self) -> Iterator[Sampler]:
        thread = threading.Thread(target=self.run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(30)


def engines(c: Cluster, model: str) -> list[dict[str, Any]]:
    """Every live engine of ``model`` on every agent, with its argv."""
    return [r for a in c.agents.values() for r in a.live_engines() if r["model"] == model]


def rolled(c: Cluster, model: str, old_versions: set[str]) -> list[dict[str, Any]] | None:
    ps = [p for p in c.placements() if p["model"] == model]
    done = (
        len(ps) == 2
        and all(p["version"] not in old_versions for p in ps)
        and all(p["state"] == "ready" for p in ps)
    )
    return ps if done else None


def roll_and_watch(c: Cluster, model: str, change: Any) -> tuple[Sampler, list[dict[str, Any]]]:
    """Run ``change`` while sampling; wait until every replica is of a new version."""
    before = [p for p in c.placements() if p["model"] == model]
    old_versions = {p["version"] for p in before}
    old_pids = {r["pid"]: r for r in engines(c, model)}
    assert len(old_pids) == 2
    with Sampler(c, model).watching() as sampler:
        change()
        after = eventually(lambda: rolled(c, model, old_versions), f"{model} rolled", 180)
        # And a few more samples once it settled.
        sampler.settle()
    # Every old engine has exited (its agent stopped it once a new one was ready).
    eventually(
        lambda: (
            not any(same_process(r["pid"], r["start_time"], r["argv"]) for r in old_pids.values())
        ),
        "every old engine stopped",
    )
    return sampler, after


def apply_file(c: Cluster, name: str, definition: dict[str, Any]) -> Any:
    path = c.cli.write(name, definition)

    def apply() -> None:
        done = c.cli("apply", path, "--reason", "trial")
        assert done.returncode == 0, done.stderr

    return apply


def rounds_since(c: Cluster, position: int) -> int:
    """Placement rounds the server's scheduler ran at catalog ``position`` or later."""
    lines = [json.loads(x) for x in c.server.log_text().splitlines() if x.startswith("{")]
    return sum(
        1
        for x in lines
        if x.get("event") == "placement.round" and x.get("catalog_position", -1) >= position
    )


def no_restart_in_place(c: Cluster) -> None:
    """No agent restarted an engine in place: each engine was started for a new slot."""
    for agent in c.agents.values():
        restarted = [
            x for x in agent.logs("agent.engine_stopped") if "restart" in x.get("reason", "")
        ]
        assert not restarted, restarted


def test_apply_priority_rollback_and_a_declared_edit_roll_out_surge_first_without_a_hole(
    tmp_path: Path, sqlite_url: str
) -> None:
    declared = sim_model("chat", "0")
    with cluster(tmp_path, sqlite_url, ["n1", "n2"], models=[declared], server_args=ROUNDS) as c:
        c.agent("n1", gpus="SIM:4")
        c.agent("n2", gpus="SIM:4")
        c.add(sim_model("trial", "0"))
        eventually(lambda: c.ready("trial", 2), "2 trial replicas ready", 120)
        eventually(lambda: c.ready("chat", 2), "2 chat replicas ready", 120)

        # 1. `llmgw apply` of the runtime model with one argument changed.
        changed = sim_model("trial", "0.01")
        sampler, _ = roll_and_watch(c, "trial", apply_file(c, "trial.yaml", changed))
        assert sampler.during >= 3, sampler.samples  # it looked while the change ran
        assert min(sampler.samples) >= 2, sampler.samples  # min 2 - max_unavailable 0
        assert {tuple(r["argv"][-2:]) for r in engines(c, "trial")} == {("--token-delay", "0.01")}
        assert len(engines(c, "trial")) == 2
        no_restart_in_place(c)

        # 2. A profile priority change: a new version, but nothing it runs changed. The
        # engines keep running (same processes), and the replicas are not replaced.
        pids = {r["pid"] for r in engines(c, "trial")}
        versions = {p["version"] for p in c.placements() if p["model"] == "trial"}
        prioritised = {**changed, "profiles": [{**changed["profiles"][0], "priority": 5}]}
        apply_file(c, "trial-priority.yaml", prioritised)()
        position = c.cli.json("history")[-1]["position"]
        # Three rounds planned on the new definition; agents tick every 0.2 s meanwhile.
        eventually(lambda: rounds_since(c, position) >= 3, "3 rounds on the new definition")
        assert {r["pid"] for r in engines(c, "trial")} == pids
        assert {p["version"] for p in c.placements() if p["model"] == "trial"} == versions
        no_restart_in_place(c)

        # 3. A rollback: the first definition again, surge-first like any change.
        sampler, _ = roll_and_watch(
            c, "trial", apply_file(c, "trial-back.yaml", sim_model("trial", "0"))
        )
        assert min(sampler.samples) >= 2, sampler.samples
        assert {tuple(r["argv"][-2:]) for r in engines(c, "trial")} == {("--token-delay", "0")}
        no_restart_in_place(c)

        # 4. The declared file edited in place: the running server notices it.
        config = tmp_path / "catalog.yaml"

        def edit() -> None:
            config.write_text(dump_yaml({"models": [sim_model("chat", "0.01")]}))

        sampler, _ = roll_and_watch(c, "chat", edit)
        assert min(sampler.samples) >= 2, sampler.samples
        assert {tuple(r["argv"][-2:]) for r in engines(c, "chat")} == {("--token-delay", "0.01")}
        assert len(engines(c, "chat")) == 2
        no_restart_in_place(c)
        # The untouched model's replicas kept running through the reload.
        assert len(engines(c, "trial")) == 2
        # `llmgw rollout status` says no rollout is in progress once it is done.
        status = c.cli.json("rollout", "status", "chat")
        assert status["in_progress"] is False, status
