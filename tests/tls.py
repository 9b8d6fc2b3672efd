"""One TLS context for every httpx client the tests make (tests/conftest.py installs it).

Every test talks plain HTTP to 127.0.0.1, yet httpx builds a TLS context for each new
client (``httpx.get`` makes one per call, as does each ``openai.OpenAI``), loading
certifi's ~150 CA certificates: about 25 ms of CPU a client. The probes that poll a
cluster every 200 ms made that most of an end-to-end test's CPU (test_rollout: 20 of
its 25 s in the pytest process, by py-spy). A context is safe to share between clients
and threads, so the default one is built once and shared; any other ``verify`` or a
client certificate goes through httpx unchanged. Only the tests' own clients are
concerned: no product code uses httpx.
"""

from __future__ import annotations

import functools
import os
import ssl
from typing import Any

import httpx._transports.default as transports


def share_default_tls_context() -> None:
    """Make httpx's transports reuse one default TLS context (idempotent)."""
    original = transports.create_ssl_context  # type: ignore[attr-defined]
    if getattr(original, "shares_default_context", False):
        return

    @functools.cache
    def default_context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
        return original(verify=True, trust_env=True)

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is True and cert is None and trust_env:
            # Keyed on the variables httpx reads, so a test that sets them still gets theirs.
            return default_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        return original(verify=verify, cert=cert, trust_env=trust_env)

    create_ssl_context.shares_default_context = True  # type: ignore[attr-defined]
    transports.create_ssl_context = create_ssl_context  # type: ignore[attr-defined]
