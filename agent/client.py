"""The agent's HTTP client for the control plane: report the node, read its placements.

Standard library only (``urllib``): the agent is a small program on every
machine and needs no HTTP stack of its own. Every answer is read with a
bound, and every failure becomes one of two errors: ``Unreachable`` (try
again next tick; running engines are left alone) or ``Refused`` (the server
answered no, with its reason).

Given several servers (replicas of one control plane, ``catalog.forms.servers``), a call
that finds the current one unreachable (no connection, no answer within
``FAILOVER_TIMEOUT_S``, a 5xx) moves to the next at once and tries there, within
the same call; only when every server failed is the call ``Unreachable``. The move
is logged (``agent.server_switched``) and counted (``ServerList.switches``): a report
sent with ``switches`` says the count as ``server_switches``, for the control plane's
``llmgw_agent_control_plane_switches_total{node}`` (the agent serves no metrics). A
refusal is not a reason to move: every replica would refuse alike.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import structlog

from agent.processes import printable
from catalog.forms.servers import FAILOVER_TIMEOUT_S, MAX_SERVER_SWITCHES, ServerList

log = structlog.get_logger("agent")

# A node's placements are a few kilobytes each; a bigger answer is not one.
MAX_ANSWER = 8 << 20
MAX_DETAIL = 2000


class Unreachable(Exception):
    """No answer from the control plane (network, timeout, 5xx)."""


class Refused(Exception):
    """The control plane answered with a refusal; ``detail`` is its reason, printable."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


def _switched(old: str, new: str, reason: str) -> None:
    log.warning("agent.server_switched", server=old, to=new, reason=reason)


class ControlPlane:
    def __init__(self, servers: str | ServerList, token: str, timeout: float = 10.0) -> None:
        """``servers``: one URL, or the replicas' (``catalog.forms.servers.ServerList``)."""
        if isinstance(servers, str):
            servers = ServerList((servers.rstrip("/"),))
        self.servers = servers
        if servers.on_switch is None:
            servers.on_switch = _switched
        self._token = token
        self.timeout = timeout

    @property
    def token(self) -> str:
        """The agent's token (a heartbeat carries it, as every request does)."""
        return self._token

    @property
    def url(self) -> str:
        """The server calls go to now."""
        return self.servers.current

    def report(self, node: str, body: dict[str, Any], *, switches: bool = False) -> Any:
        """With ``switches``, the body says ``server_switches`` as counted when each try
        is sent: a report that found the first server dead says so to the next one."""
        path = f"/v1/nodes/{urllib.parse.quote(node, safe='')}"
        if not switches:
            return self._call("PUT", path, body)
        return self._call(
            "PUT",
            path,
            lambda: {**body, "server_switches": min(self.servers.switches, MAX_SERVER_SWITCHES)},
        )

    def placements(self, node: str) -> Any:
        return self._call("GET", "/v1/placements?" + urllib.parse.urlencode({"node": node}))

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        """The call on the current server, then on each next one while they are unreachable
        (each given ``FAILOVER_TIMEOUT_S`` but the last, which has the full timeout).
        ``body`` may be a function: what it returns is sent, made anew for each try."""
        servers = self.servers
        tries = len(servers.urls)
        for attempt in range(tries):
            url = servers.current
            last = attempt == tries - 1
            try:
                sent = body() if callable(body) else body
                return self._call_one(
                    url, method, path, sent, self.timeout if last else FAILOVER_TIMEOUT_S
                )
            except Unreachable as exc:
                servers.failed(url, str(exc))
                if last:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover: the loop returns or raises

    def _call_one(self, url: str, method: str, path: str, body: Any, timeout: float) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            url + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self._token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return json.loads(_read(answer))
        except urllib.error.HTTPError as exc:
            detail = _detail(exc)
            if exc.code >= 500:
                raise Unreachable(f"HTTP {exc.code}: {detail}") from None
            raise Refused(exc.code, detail) from None
        except (urllib.error.URLError, OSError) as exc:
            raise Unreachable(printable(str(getattr(exc, "reason", exc)))) from None
        except ValueError as exc:  # not JSON, or too long
            raise Unreachable(f"unreadable answer: {printable(str(exc))[:MAX_DETAIL]}") from None


def _read(answer: Any) -> bytes:
    data: bytes = answer.read(MAX_ANSWER + 1)
    if len(data) > MAX_ANSWER:
        raise ValueError(f"the answer is longer than {MAX_ANSWER} bytes")
    return data


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        raw = exc.read(64 << 10)
        problem = json.loads(raw)
        text = str(problem.get("detail") or problem.get("title") or problem)
    except (ValueError, OSError, AttributeError):
        text = exc.reason if isinstance(exc.reason, str) else ""
    return printable(text)[:MAX_DETAIL]
