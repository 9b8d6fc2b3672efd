"""One llmgw.toml read by every command and the server: they agree on a node's state."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from tests.api.server import ApiServer, Tokens, running
from tests.e2e.cli import Cli

# stale_after 0s: a node is stale as soon as it has reported; grace 1h: not yet lost.
# The defaults (90s / 5m) would call the same node fresh, so any process that ignored
# the file would disagree.
SETTINGS = """
[policy]
stale_after = "0s"
grace = "1h"
"""

NODE = {"name": "gpu-1", "gpu_class": "T4", "gpus": 4, "memory_gb": 64}
MODEL = {
    "name": "tiny",
    "source": "org/tiny",
    "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 1}],
    "scaling": {"min": 1},
}


def test_every_command_and_the_server_apply_the_settings_files_policy(
    tmp_path: Path, sqlite_url: str
) -> None:
    (tmp_path / "llmgw.toml").write_text(SETTINGS)
    cli = Cli(tmp_path, sqlite_url)
    assert cli("nodes", "report", cli.write("node.yaml", NODE)).returncode == 0
    assert cli("add", cli.write("m.yaml", MODEL)).returncode == 0

    (node,) = cli.json("nodes", "list")
    assert node["state"] == "stale"
    plan = cli.json("place", "--dry-run")
    assert plan["placed"] == []  # a stale node gets nothing new
    assert len(plan["unplaced"]) == 1
    why = cli.json("explain", "tiny")["replicas"][0]
    assert why["outcome"] == "unplaced"
    assert cli.json("settings")["policy"]["stale_after"] == "0s"

    # A flag wins over the file, for this command only.
    (node,) = cli.json("nodes", "list", "--stale-after", "1h")
    assert node["state"] == "fresh"

    tokens = Tokens.issue()
    server = ApiServer(tmp_path, sqlite_url, tokens=tokens, declared=None)
    with running(server), server.client(tokens.reader) as http:
        (listed,) = http.get("/v1/nodes").json()
    assert listed["state"] == "stale"


def test_a_bad_database_url_is_one_line_not_a_traceback(tmp_path: Path, sqlite_url: str) -> None:
    cli = Cli(tmp_path, sqlite_url)
    for url in ("llmgw.db", "mysql+nosuchdriver://x/y", "postgres://nobody@127.0.0.1:1/x"):
        done: subprocess.CompletedProcess[str] = cli("--db", url, "models")
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
        assert "Traceback" not in done.stderr


def test_a_bad_settings_file_is_refused_by_name(tmp_path: Path, sqlite_url: str) -> None:
    (tmp_path / "llmgw.toml").write_text("[policy]\nstale = 3\n")
    done = Cli(tmp_path, sqlite_url)("models")
    assert done.returncode == 1
    assert "llmgw.toml: unknown key 'stale' in [policy]" in done.stderr


def test_the_server_reads_its_port_policy_and_reads_open_from_the_file(
    tmp_path: Path, sqlite_url: str
) -> None:
    (tmp_path / "llmgw.toml").write_text(SETTINGS + "\n[auth]\nreads_open = true\n")
    server = ApiServer(tmp_path, sqlite_url, declared=None)
    with running(server):
        assert httpx.get(f"{server.url}/v1/nodes", timeout=30).status_code == 200


def test_show_past_the_head_and_an_unrecorded_round_say_so(tmp_path: Path, sqlite_url: str) -> None:
    cli = Cli(tmp_path, sqlite_url)
    done = cli("show", "--at", "99")
    assert done.returncode == 1
    assert "position 99 is past the log's head (0)" in done.stderr
    assert cli("add", cli.write("m.yaml", MODEL)).returncode == 0
    done = cli("explain", "tiny", "--round", "99")
    assert done.returncode == 1
    assert "round 99 is not recorded" in done.stderr


def test_add_dry_run_validates_shows_the_round_and_records_nothing(
    tmp_path: Path, sqlite_url: str
) -> None:
    cli = Cli(tmp_path, sqlite_url)
    assert cli("nodes", "report", cli.write("node.yaml", NODE)).returncode == 0
    preview = cli.json("add", cli.write("m.yaml", MODEL), "--dry-run")
    assert preview["would_add"] == ["tiny"]
    assert [p["nodes"] for p in preview["would_place"]] == [["gpu-1"]]
    assert cli.json("models") == []
    assert cli.json("history") == []
    done = cli("add", "m.yaml", "--dry-run")
    assert "would add tiny" in done.stdout and "+ tiny[0] t4 on gpu-1" in done.stdout
    # A refusal is the one a real add gives.
    clash = {**MODEL, "name": "other", "aliases": ["tiny"]}
    assert cli.json("add", "m.yaml")["events"][0]["model"] == "tiny"
    done = cli("add", cli.write("clash.yaml", clash), "--dry-run")
    assert done.returncode == 1 and "alias 'tiny'" in done.stderr


def test_the_actor_defaults_to_the_login_user_and_json_is_everywhere(
    tmp_path: Path, sqlite_url: str
) -> None:
    import getpass

    cli = Cli(tmp_path, sqlite_url)
    added = cli.json("add", cli.write("m.yaml", MODEL))
    assert added["already_recorded"] is False
    (event,) = cli.json("history")
    assert event["actor"] == getpass.getuser()
    assert cli.json("resolve", "tiny") == {"name": "tiny", "canonical": "tiny"}
    assert cli.json("db", "current")["revision"]
    assert cli.json("nodes", "report", cli.write("node.yaml", NODE)) == {"recorded": ["gpu-1"]}
    assert cli.json("snapshot", "--list") == []
    assert cli.json("remove", "tiny")["events"][0]["type"] == "model.removed"
    assert len(cli.json("history", "--since", "1h", "--until", "now")) == 2
    assert cli.json("history", "--until", "yesterday") == []


def test_settings_shows_the_agent_table_and_where_each_value_came_from(
    tmp_path: Path, sqlite_url: str
) -> None:
    """`llmgw settings` is where an operator checks what a node's plain `llmgw agent`
    would run with: the [agent] table too, and for every value whether a flag, the
    environment, the file or a default set it."""
    (tmp_path / "llmgw.toml").write_text(
        SETTINGS + '\n[agent]\nserver = "http://cp.internal:8080"\ninterval = "15s"\n'
        'token_file = "agent.token"\n'
    )
    cli = Cli(tmp_path, sqlite_url)
    cli.env |= {"LLMGW_NODE": "gpu-7", "LLMGW_LABELS": "zone=eu", "LLMGW_GRACE": "2h"}
    cli.env.pop("LLMGW_SERVER", None)
    data = cli.json("settings", "--config", "declared.yaml")
    agent = data["agent"]
    assert agent["server"] == "http://cp.internal:8080"
    assert agent["interval"] == "15s"
    assert agent["token_file"] == str(tmp_path / "agent.token")  # relative to the file
    assert agent["node"] == "gpu-7" and agent["labels"] == "zone=eu"
    assert agent["stop_grace"] == "10s" and agent["log_keep"] == 3
    origins = data["origins"]
    assert origins["agent"]["server"] == "file"
    assert origins["agent"]["node"] == "env LLMGW_NODE"
    assert origins["agent"]["stop_grace"] == "default"
    assert origins["policy"]["stale_after"] == "file"
    assert origins["policy"]["grace"] == "env LLMGW_GRACE"
    assert origins["catalog"]["file"] == "flag --config"
    assert origins["policy"]["interval"] == "default"
    assert origins["database"]["url"] == "env LLMGW_DATABASE_URL"
    # Every value shown has its origin, and nothing else does.
    for section in ("database", "catalog", "policy", "server", "auth", "agent"):
        assert set(origins[section]) == set(data[section]), section

    text = cli("settings").stdout
    assert "\n[agent]\n" in text
    assert 'server = "http://cp.internal:8080"  # file' in text
    assert 'node = "gpu-7"  # env LLMGW_NODE' in text
    assert 'stale_after = "0s"  # file' in text
    assert "fabric = (unset)  # default" in text
