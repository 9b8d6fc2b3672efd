"""The CLI judges nodes by the policy the running server records, not by its own defaults.

Issue 36, item 6: with `llmgw serve --stale-after 3 --grace 3`, once an agent was killed
the scheduler had given up its node, yet `llmgw status` counted the node fresh, `nodes
list` showed it fresh, `place --dry-run` would have placed a replica on it and `explain`
said a replica was placed there while `placements` listed none: each command judged by
its own defaults (90 s / 5 min). Here a real server, real agents and sim engines: one
agent is killed, the server unplaces its replica, and the four commands, run without
any flag and without the server's settings, agree with it and say what they judged by.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from events.database.connection import make_engine
from scheduler.persistence.tables import PlacementRoundRow, table
from tests import forkserver
from tests.e2e.agents import SIM, cluster, eventually
from tests.e2e.cli import Cli

pytestmark = pytest.mark.slow

# Short, so that the test waits seconds; any policy far from the defaults would do. The
# survivor's agent reports every 0.2 s: on a starved machine it may look stale (silent 3 s),
# never lost (5 s), so the assertions below allow it stale.
SERVER = ["--with-scheduler", "--interval", "0.3", "--stale-after", "3", "--grace", "2"]
# Two nodes of one card each, two replicas wanted: once a node is lost, its replica
# has nowhere to go. A command that still thought the node fresh would place it there.
CHAT = {**SIM, "scaling": {"min": 2}}


def test_status_nodes_place_and_explain_agree_with_the_server_on_a_lost_node(
    tmp_path: Path, db_url: str
) -> None:
    with cluster(tmp_path, db_url, ["n1", "n2"], server_args=SERVER, models=[CHAT]) as c:
        for node in ("n1", "n2"):
            c.agent(node, gpus="SIM:1")
        placed = eventually(lambda: c.ready("chat", 2), "2 chat replicas ready")
        victim = placed[0]["nodes"][0]
        survivor = "n2" if victim == "n1" else "n1"
        c.agents[victim].stop(signal.SIGKILL)
        c.agents[victim].kill_engines()

        def unplaced() -> list[dict[str, Any]] | None:
            now = c.placements()
            return now if all(victim not in p["nodes"] for p in now) else None

        # The server gave the node up: its replica is no longer placed (nowhere to go).
        on_server = eventually(unplaced, f"the server unplaced the replica on {victim}")
        cli = Cli(tmp_path, db_url)

        status = cli.json("status")
        assert (status["nodes"]["lost"], status["nodes"]["fresh"] + status["nodes"]["stale"]) == (
            1,
            1,
        )
        judged = status["judged_by"]
        assert (judged["stale_after"], judged["grace"]) == ("3s", "2s")
        assert judged["source"] in ("round", "started", "placing")
        assert judged["overridden_by_flags"] == []
        text = cli("status").stdout
        assert " stale, 1 lost)" in text
        assert "judged by the policy " in text and "stale-after 3s, grace 2s" in text

        nodes = {n["name"]: n for n in cli.json("nodes", "list")}
        assert nodes[victim]["state"] == "lost" and nodes[survivor]["state"] != "lost"
        assert nodes[victim]["judged_by"]["stale_after"] == "3s"
        assert "stale-after 3s, grace 2s" in cli("nodes", "list").stdout

        plan = cli.json("place", "--dry-run")
        assert all(victim not in p["nodes"] for p in plan["placed"]), plan["placed"]
        assert [u["model"] for u in plan["unplaced"]] == ["chat"]
        assert plan["judged_by"]["grace"] == "2s"

        extra = cli.write("extra.yaml", {**SIM, "name": "extra", "scaling": {"min": 1}})
        preview = cli.json("add", extra, "--dry-run")
        assert all(victim not in p["nodes"] for p in preview["would_place"]), preview
        assert preview["judged_by"]["stale_after"] == "3s"

        why = cli.json("explain", "chat")
        where = sorted(tuple(s["nodes"]) for s in why["replicas"] if s["outcome"] != "unplaced")
        assert where == sorted(tuple(p["nodes"]) for p in on_server) == [(survivor,)]
        assert [s["outcome"] for s in why["replicas"]].count("unplaced") == 1
        assert "stale-after 3s, grace 2s" in cli("explain", "chat").stdout
        # A recorded round is explained by the policy it ran with, and says so too.
        again = cli.json("explain", "chat", "--round", "1")["judged_by"]
        assert (again["source"], again["round"], again["grace"]) == ("round", 1, "2s")

        # A flag still wins, for this command only, and the command says so.
        (looser,) = [
            n
            for n in cli.json("nodes", "list", "--stale-after", "1h", "--grace", "1h")
            if n["name"] == victim
        ]
        assert looser["state"] == "fresh"
        assert looser["judged_by"]["overridden_by_flags"] == ["stale_after", "grace"]
        loose = cli.json("status", "--stale-after", "1h", "--grace", "1h")
        assert (loose["nodes"]["fresh"], loose["judged_by"]["stale_after"]) == (2, "1h")
        shown = cli("nodes", "list", "--grace", "1h").stdout
        assert "--grace 1h given here wins over the recorded grace 2s" in shown


def test_with_nothing_recorded_a_command_judges_by_its_own_settings_and_says_so(
    tmp_path: Path, sqlite_url: str
) -> None:
    cli = Cli(tmp_path, sqlite_url)
    node = {"name": "gpu-1", "gpu_class": "T4", "gpus": 1}
    assert cli("nodes", "report", cli.write("node.yaml", node)).returncode == 0
    (listed,) = cli.json("nodes", "list")
    judged = listed["judged_by"]
    assert (judged["source"], judged["stale_after"], judged["grace"]) == ("settings", "1m30s", "5m")
    assert judged["recorded_at"] is None
    text = cli("nodes", "list").stdout
    assert "judged by this command's own settings (no server has recorded its policy" in text
    assert "stale-after: default, grace: default" in text

    # A round whose stored policy cannot be read is skipped and named, never a crash.
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(
            insert(table(PlacementRoundRow)),
            {
                "id": 1,
                "planned_at": datetime.now(UTC),
                "catalog_position": 0,
                "inventory_digest": "",
                "reported_at": "{}",
                "current": "[]",
                "policy": '{"grace_s": 3, "schema_version": 2}',
                "placed": 0,
                "removed": 0,
                "unplaced": 0,
            },
        )
    engine.dispose()
    done = cli("status")
    assert done.returncode == 0, done.stderr
    assert "skipped, cannot be read: round 1: stale_after_s is missing" in done.stdout
    (listed,) = cli.json("nodes", "list")
    assert listed["judged_by"]["source"] == "settings"
    assert listed["judged_by"]["skipped"] == ["round 1: stale_after_s is missing"]


@contextmanager
def daemon(
    cli: Cli, log: Path, *flags: str
) -> Iterator[forkserver.Forked | subprocess.Popen[bytes]]:
    with log.open("wb") as stderr:  # the child keeps its own copy
        # Forked (tests/forkserver.py), as Cli's commands are: the same `llmgw daemon`
        # without ~1 s of imports (a fresh process with LLMGW_TEST_FORK=0).
        proc = forkserver.popen(
            ["daemon", "--interval", "0.3", *flags],
            cwd=cli.workdir,
            env={**cli.env, "LLMGW_LOG_LEVEL": "INFO"},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _events(log: Path) -> list[str]:
    lines = log.read_text().splitlines()
    return [json.loads(line)["event"] for line in lines if line.startswith("{")]


def test_the_daemon_that_places_is_the_reference_even_after_a_standby_starts(
    tmp_path: Path, sqlite_url: str
) -> None:
    """`llmgw daemon` records its policy when it starts; a standby started later with
    another policy is the newest record until the leader's next round records its own
    again (its rounds change nothing here, so no round records it)."""
    cli = Cli(tmp_path, sqlite_url)

    def judged() -> dict[str, Any]:
        (node,) = cli.json("nodes", "list")
        return dict(node["judged_by"])

    assert cli("nodes", "report", cli.write("n.yaml", {"name": "n1", "gpus": 0})).returncode == 0
    leader_log = tmp_path / "leader.log"
    with daemon(cli, leader_log, "--stale-after", "3s", "--grace", "3s") as leader:
        first = eventually(lambda: (j := judged())["source"] != "settings" and j, "a record")
        assert (first["process"], first["pid"]) == ("daemon", leader.pid)
        assert (first["source"], first["stale_after"], first["grace"]) == ("started", "3s", "3s")
        standby_log = tmp_path / "standby.log"
        with daemon(cli, standby_log, "--stale-after", "1h"):
            # It recorded its start before its first round, which finds the leader leading.
            eventually(lambda: "placement.waiting" in _events(standby_log), "a standby waiting")
            eventually(
                lambda: "placement.policy_recorded" in _events(leader_log),
                "the leader's round to record its policy again",
            )
            back = judged()
            assert (back["pid"], back["source"]) == (leader.pid, "placing")
            assert (back["stale_after"], back["grace"]) == ("3s", "3s")
        assert leader.poll() is None
