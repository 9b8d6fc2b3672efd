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
