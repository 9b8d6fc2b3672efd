"""A client token's limits, on real SQLite and PostgreSQL databases migrated by Alembic,
through the real `llmgw token` command: set at issue, changed by `token limits` with a
``token.limits_changed`` event (who, when, before and after) in the hash chain, shown by
`token list`, served to gateways by the control plane's book; every flag bounded, and a
refusal names the flag and what to write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine

from catalog import Catalog
from catalog.forms.client_limits import ClientLimits, LimitError, from_json, parse_change
from events.core.chain import verify_chain
from events.core.token_change import check_token_change
from events.core.types import TOKEN_ISSUED, TOKEN_LIMITS_CHANGED
from events.read.replay import replay
from events.storage.backends import open_log
from events.storage.chain_rows import read_chain, read_seal
from events.write.tokens import read_tokens
from llmgw.api.runtime.live_tokens import LiveTokens
from tests.e2e.cli import Cli


def test_limits_are_set_at_issue_changed_later_and_audited(
    tmp_path: Path, db_url: str, engine: Engine
) -> None:
    cli = Cli(tmp_path, db_url)
    done = cli(
        "token", "new", "app-1", "--role", "client", "--models", "a,b", "--rpm", "600",
        "--tpm", "200000", "--tpm", "chat=100K", "--max-inflight", "32", "--budget", "50M/30d",
        "--actor", "alice", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    issued = json.loads(done.stdout)["limits"]
    assert issued == {
        "rpm": 600,
        "tpm": 200000,
        "model_tpm": {"chat": 100000},
        "max_inflight": 32,
        "budget": {"tokens": 50_000_000, "period_s": 30 * 86400},
    }
    (listed,) = cli.json("token", "list")
    assert listed["limits"] == issued
    table = cli("token", "list")
    assert "rpm 600, tpm 200000, tpm chat=100000, max-inflight 32, budget 50000000/30d" in (
        table.stdout
    )

    changed = cli.json(
        "token", "limits", "app-1", "--rpm", "none", "--tpm", "chat=none", "--tpm", "a=5K",
        "--max-inflight", "4", "--actor", "bob", "--reason", "runaway batch",
    )  # fmt: skip
    assert changed["before"] == issued
    after = {
        "tpm": 200000,
        "model_tpm": {"a": 5000},
        "max_inflight": 4,
        "budget": {"tokens": 50_000_000, "period_s": 30 * 86400},
    }
    assert changed["after"] == after and changed["changed"] is True
    (row,) = read_tokens(engine)
    assert row.record.limits == from_json(after) and row.unreadable is None
    # The same change again changes nothing and appends nothing.
    assert cli.json("token", "limits", "app-1", "--max-inflight", "4")["changed"] is False

    log = open_log(engine)
    events = list(log.read())
    assert [e.type for e in events] == [TOKEN_ISSUED, TOKEN_LIMITS_CHANGED]
    event = events[1]
    assert (event.actor, event.reason) == ("bob", "runaway batch")
    change = check_token_change(event.type, json.loads(event.payload))
    assert change.before == from_json(issued) and change.limits == from_json(after)
    assert "sha256" not in event.payload
    # In the hash chain, and replay reads it as no change to the catalog.
    assert verify_chain(read_chain(engine), read_seal(engine)).ok
    assert replay(Catalog.build([]), events).skipped == ()
    history = cli("history")
    assert "token app-1 (client) limits changed: rpm 600" in history.stdout

    # The control plane's book carries them to the gateways (/v1/gateway/client-tokens).
    live = LiveTokens((), engine)
    live.refresh()
    (client,) = live.book.clients()
    assert client.limits == from_json(after)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--rpm", "0"), "--rpm 0: write a whole number from 1 to 10000000"),
        (("--rpm", "9" * 200), "--rpm '9999"),
        (("--tpm", "lots"), "--tpm 'lots': write a number of tokens"),
        (("--tpm", "bad name!=5"), "the model must be a catalog name"),
        (("--budget", "50M"), "--budget '50M': write tokens/period, e.g. 50M/30d"),
        (("--budget", "5/30s"), "--budget '5/30s'"),
        (("--budget", "5/400d"), "the period must be from 1m to 366d"),
        (("--max-inflight", "-3"), "--max-inflight '-3': write a whole number"),
    ],
)
def test_a_bad_limit_is_refused_naming_the_flag(
    tmp_path: Path, sqlite_url: str, args: tuple[str, str], named: str
) -> None:
    cli = Cli(tmp_path, sqlite_url)
    done = cli("token", "new", "app-1", "--role", "client", *args)
    assert done.returncode != 0
    assert named in done.stderr, done.stderr
    assert cli.json("token", "list") == []


def test_limits_belong_to_client_tokens_in_force(tmp_path: Path, sqlite_url: str) -> None:
    cli = Cli(tmp_path, sqlite_url)
    done = cli("token", "new", "ops", "--role", "reader", "--rpm", "5")
    assert done.returncode != 0 and "only client tokens do" in done.stderr
    assert cli("token", "new", "ops", "--role", "reader").returncode == 0
    done = cli("token", "limits", "ops", "--rpm", "5")
    assert done.returncode != 0 and "only a client token has limits" in done.stderr
    done = cli("token", "limits", "nobody", "--rpm", "5")
    assert done.returncode != 0 and "no token named 'nobody'" in done.stderr
    done = cli("token", "limits", "ops")
    assert done.returncode != 0 and "give at least one of --rpm" in done.stderr


def test_the_stored_form_is_read_back_bounded() -> None:
    limits = ClientLimits(rpm=1, tpm=2, model_tpm=(("m", 3),), max_inflight=4, budget=5,
                          budget_period_s=60)  # fmt: skip
    assert from_json(limits.to_json()) == limits
    for bad in ({"rpm": True}, {"tpm": 10**13}, {"what": 1}, {"budget": {"tokens": 5}}, [1],
                {"model_tpm": {f"m{i}": 1 for i in range(101)}}):  # fmt: skip
        with pytest.raises(LimitError):
            from_json(bad)
    with pytest.raises(LimitError, match="at most 100 models"):
        parse_change(tpm=[f"m{i}=5" for i in range(101)])
