"""The tests' httpx clients share one default TLS context (tests/tls.py): 25 ms of CPU a
client otherwise, most of an end-to-end test's CPU when its probes poll."""

from __future__ import annotations

import ssl
from typing import Any

import certifi
import httpx


def context_of(client: httpx.Client) -> Any:
    return client._transport._pool._ssl_context  # type: ignore[attr-defined]


def test_default_clients_share_one_context_and_other_choices_keep_their_own() -> None:
    with httpx.Client() as a, httpx.Client() as b:
        assert context_of(a) is context_of(b)
        assert context_of(a).verify_mode == ssl.CERT_REQUIRED  # still verifying by default
    with httpx.Client(verify=False) as insecure:
        assert context_of(insecure).verify_mode == ssl.CERT_NONE
    own = ssl.create_default_context()
    with httpx.Client(verify=own) as mine:
        assert context_of(mine) is own


def test_a_test_that_points_httpx_at_other_certificates_gets_them(monkeypatch: Any) -> None:
    with httpx.Client() as shared:
        pass
    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())  # not what the shared one read
    with httpx.Client() as other:
        assert context_of(other) is not context_of(shared)
