"""The declared catalog file reloaded by a running `llmgw serve`, seen from every side.

A real server on a real SQLite file; the file is edited as an operator would. A refused
edit changes nothing and is reported in the log, `/readyz`, `/metrics`, `llmgw status`
and the dashboard (a real chromium); a fixed file is taken and recorded in `history`.
SIGHUP makes the server look at once even when the file's stat did not change.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from tests.api.browser import chromium
from tests.api.server import DECLARED, ApiServer, Tokens, running
from tests.e2e.agents import eventually
from tests.e2e.cli import Cli
from tests.support import dump_yaml

pytestmark = pytest.mark.slow

# One argument changed, with a typo in the engine: refused as a whole.
TYPO = {
    "models": [
        {
            **DECLARED["models"][0],
            "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 1, "engine": "vlm"}],
        }
    ]
}
FIXED = {
    "models": [
        {
            **DECLARED["models"][0],
            "profiles": [
                {"name": "t4", "gpu_class": "T4", "tp": 1, "args": ["--max-model-len", "8192"]}
            ],
        }
    ]
}


@pytest.fixture
def server(tmp_path: Path, sqlite_url: str, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(tmp_path, sqlite_url, tokens=tokens)) as s:
        yield s


def ready(server: ApiServer) -> dict[str, Any]:
    with server.client() as http:
        answer = http.get("/readyz")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


def declared_state(server: ApiServer, state: str) -> dict[str, Any] | None:
    declared = ready(server)["declared"]
    return dict(declared) if declared and declared["state"] == state else None


def profile_args(server: ApiServer, tokens: Tokens) -> list[str]:
    with server.client(tokens.reader) as http:
        (model,) = [m for m in http.get("/v1/catalog").json() if m["name"] == "base-7b"]
        return list(model["profiles"][0]["args"])


def metric(server: ApiServer, tokens: Tokens, name: str) -> float:
    with server.client(tokens.reader) as http:
        text = http.get("/metrics").text
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in /metrics")


def test_a_refused_edit_changes_nothing_is_reported_everywhere_and_the_fix_applies(
    server: ApiServer, tokens: Tokens, tmp_path: Path
) -> None:
    config = tmp_path / "catalog.yaml"
    loaded = ready(server)["declared"]
    assert loaded["state"] == "loaded" and loaded["path"] == str(config)
    position = ready(server)["catalog_position"]

    config.write_text(dump_yaml(TYPO))
    refused = eventually(lambda: declared_state(server, "refused"), "the edit refused", 60)
    refusal = refused["refusal"]
    # File, line, model, field and the fix.
    assert refusal["file"] == str(config)
    assert refusal["line"] == config.read_text().splitlines().index("  - engine: vlm") + 1
    assert (refusal["model"], refusal["profile"], refusal["field"]) == ("base-7b", "t4", "engine")
    assert "did you mean 'vllm'?" in refusal["message"]
    assert "previous catalog keeps running" in refusal["detail"]
    # The catalog in force is untouched; nothing was appended to the log.
    assert refused["digest"] == loaded["digest"]
    assert profile_args(server, tokens) == []
    assert ready(server)["catalog_position"] == position
    assert metric(server, tokens, "llmgw_declared_catalog_refused") == 1
    # In the server's log, as one structured line.
    logged = [
        json.loads(x)
        for x in server.log_text().splitlines()
        if x.startswith("{") and "catalog.declared_refused" in x
    ]
    assert logged and logged[-1]["line"] == refusal["line"]
    assert logged[-1]["field"] == "engine"
    # `llmgw status`, from another process, reads what the server made of the file.
    cli = Cli(tmp_path, server.db_url)
    status = cli("status")
    assert status.returncode == 0, status.stderr
    assert "refused" in status.stdout and "did you mean 'vllm'?" in status.stdout
    assert f"line {refusal['line']}" in status.stdout
    shown = cli.json("status")
    (row,) = shown["declared"]
    assert row["state"] == "refused" and row["refusal"]["field"] == "engine"
    # `llmgw rollout status` says what runs (the catalog in force), not what this
    # command would make of the file: no rollout, and why the file is not what runs.
    rollout = cli.json("rollout", "status", "base")
    assert rollout["in_progress"] is False
    assert "refused" in rollout["declared_note"] and "catalog in force" in rollout["declared_note"]

    # Fixed: taken whole, recorded as an event that `history` shows.
    config.write_text(dump_yaml(FIXED))
    applied = eventually(lambda: declared_state(server, "loaded"), "the fixed file taken", 60)
    assert applied["digest"] != loaded["digest"]
    assert profile_args(server, tokens) == ["--max-model-len", "8192"]
    assert metric(server, tokens, "llmgw_declared_catalog_refused") == 0
    history = cli.json("history", "--type", "catalog.declared_changed")
    (event,) = history
    assert event["model"] == "base-7b"
    assert "changed base-7b" in event["reason"] and "reloaded" in event["reason"]
    assert "catalog.declared_changed" in cli("history").stdout
    with server.client(tokens.reader) as http:
        page = http.get("/v1/events", params={"after": position}).json()
    (recorded,) = [e for e in page["events"] if e["type"] == "catalog.declared_changed"]
    assert recorded["payload"]["changed"] == ["base-7b"]
    assert recorded["payload"]["old_digest"] == loaded["digest"]
    assert recorded["payload"]["new_digest"] == applied["digest"]
    # The event replays (as a no-op) like any other: `llmgw replay` skips nothing.
    replayed = cli.json("replay")
    assert replayed["skipped"] == [], replayed
    assert cli.json("status")["declared"][0]["state"] == "loaded"


def test_sighup_looks_at_the_file_even_when_its_stat_did_not_change(
    server: ApiServer, tokens: Tokens, tmp_path: Path
) -> None:
    config = tmp_path / "catalog.yaml"
    before = config.stat()
    text = config.read_text()
    # Same size, same modification time, same inode: the poll cannot see it.
    changed = text.replace("org/base-7b", "org/base-7c")
    assert len(changed) == len(text)
    with config.open("r+") as f:
        f.write(changed)
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert config.stat().st_mtime_ns == before.st_mtime_ns
    with server.client(tokens.reader) as http:
        assert _source(http.get("/v1/catalog").json()) == "org/base-7b"
    assert server.proc is not None
    server.proc.send_signal(signal.SIGHUP)

    def reloaded() -> bool:
        with server.client(tokens.reader) as http:
            return _source(http.get("/v1/catalog").json()) == "org/base-7c"

    eventually(reloaded, "the file read on SIGHUP", 60)
    assert server.proc.poll() is None  # SIGHUP did not stop the server


def test_a_fifo_in_the_files_place_is_refused_and_later_reloads_still_work(
    server: ApiServer, tokens: Tokens, tmp_path: Path
) -> None:
    # Issue 36: the reload thread blocked for ever opening the FIFO (waiting for a
    # writer): nothing recorded, no later reload, and SIGTERM took 13 s.
    config = tmp_path / "catalog.yaml"
    good = config.read_text()
    loaded = ready(server)["declared"]
    config.unlink()
    os.mkfifo(config)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGHUP)
    refused = eventually(lambda: declared_state(server, "refused"), "the FIFO refused", 60)
    refusal = refused["refusal"]
    assert refusal["file"] == str(config)
    assert "it is a FIFO (a named pipe), not a regular file" in refusal["message"]
    assert "put the file itself at this path" in refusal["message"]
    assert refused["digest"] == loaded["digest"]  # the catalog in force keeps running
    assert any(
        "it is a FIFO" in str(x.get("reason")) for x in server.logs("catalog.declared_refused")
    )

    # The file back, changed: the next SIGHUP takes it.
    config.unlink()
    config.write_text(good.replace("org/base-7b", "org/base-7c"))
    server.proc.send_signal(signal.SIGHUP)

    def reloaded() -> bool:
        with server.client(tokens.reader) as http:
            return _source(http.get("/v1/catalog").json()) == "org/base-7c"

    eventually(reloaded, "the restored file read on SIGHUP", 60)
    # (Recorded as loaded just after the catalog is taken.)
    eventually(lambda: declared_state(server, "loaded"), "the refusal cleared", 60)
    # Nothing is left blocked: SIGTERM stops the server at once, cleanly (a watcher
    # blocked in the FIFO held it 13 s before; ApiServer.stop kills after 20 s).
    assert server.stop() == 0


def test_an_emptied_file_keeps_the_declared_models_and_models_empty_list_removes_them(
    server: ApiServer, tokens: Tokens, tmp_path: Path
) -> None:
    # A file written in place is empty for a moment; a reload caught then read "no
    # models" and removed every declared model (found with the replicas' chaos test).
    config = tmp_path / "catalog.yaml"
    loaded = ready(server)["declared"]
    config.write_text("")
    assert server.proc is not None
    server.proc.send_signal(signal.SIGHUP)
    refused = eventually(lambda: declared_state(server, "refused"), "the empty file refused", 60)
    assert "the file is empty" in refused["refusal"]["message"]
    assert "models: []" in refused["refusal"]["message"]
    assert refused["digest"] == loaded["digest"]
    with server.client(tokens.reader) as http:
        assert any(m["name"] == "base-7b" for m in http.get("/v1/catalog").json())

    # Said on purpose: every declared model goes.
    config.write_text("models: []\n")
    server.proc.send_signal(signal.SIGHUP)

    def emptied() -> bool:
        with server.client(tokens.reader) as http:
            return not any(m["name"] == "base-7b" for m in http.get("/v1/catalog").json())

    eventually(emptied, "models: [] applied", 60)


def _source(models: list[dict[str, Any]]) -> str:
    (model,) = [m for m in models if m["name"] == "base-7b"]
    return str(model["source"])


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


def test_the_dashboard_shows_a_refused_edit_and_takes_a_token_from_the_fragment(
    server: ApiServer, tokens: Tokens, tmp_path: Path, browser: Browser
) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url + " " + json.dumps(r.headers)))
    # The token in the fragment: no login form, and it never leaves the browser in a URL.
    page.goto(f"{server.url}/ui/#nodes&token={tokens.reader}")
    page.wait_for_selector("body[data-ready=true]")
    expect(page.locator("#login")).to_be_hidden()
    assert tokens.reader not in page.url  # wiped from the address bar
    assert page.url.endswith("#nodes")
    expect(page.locator("#page-nodes")).to_be_visible()
    assert not [u for u in sent if tokens.reader in u.split(" ", 1)[0]]
    assert tokens.reader not in server.log_text()
    # The API was read with it as a bearer token.
    assert any(f"Bearer {tokens.reader}" in u for u in sent)

    (tmp_path / "catalog.yaml").write_text(dump_yaml(TYPO))
    eventually(lambda: declared_state(server, "refused"), "the edit refused", 60)
    page.reload()  # the fleet is read again (it is also read every 10 s)
    page.wait_for_selector("body[data-ready=true]")
    banner = page.locator("#declared")
    expect(banner).to_be_visible(timeout=30_000)
    expect(banner).to_contain_text("did you mean 'vllm'?")
    expect(banner).to_contain_text("catalog.yaml, line")
    page.close()
