"""Following the control plane: the catalog, the placements and the client tokens, live.

A full read (``GET /v1/catalog``, ``GET /v1/placements``, ``GET
/v1/gateway/client-tokens``, ``GET /v1/gateway/reader-tokens``) builds a routing table
and installs it; between two full reads (every ``resync``), the event stream
(``/v1/events/stream?placements=true``) says when something changed: a catalog event
re-reads the catalog and the placements, a placement event (``replica.ready``,
``placement.removed``, ...) the placements, a token event (``token.issued``,
``token.revoked``: ``llmgw token new|revoke``) the tokens, a gateway's usage counts
(``usage.recorded``) nothing. A replica that becomes ready
thus takes traffic within the stream's poll (half a second by default; a few
milliseconds on PostgreSQL, which notifies every write) and one read, and a revoked client
token is refused here as soon.

When the control plane cannot be reached, the last table stays in force: the request
path never waits on the control plane. ``/healthz`` and
``llmgw_gateway_control_plane_up`` say so, and the follower retries with a growing pause.

Given several servers (the control plane's replicas, ``catalog.forms.servers``), the
follower sticks to one; when it fails (no connection, no answer within
``FAILOVER_TIMEOUT_S``, a 5xx, the stream cut) it moves to the next at once
(``gateway.server_switched``, ``llmgw_gateway_control_plane_switches_total``) and
reads everything again there. A frozen server's stream only goes quiet: it is left
at the next full read, every ``resync``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import aiohttp
import structlog

from catalog.definition.model import Model
from catalog.definition.parse import parse_model
from catalog.errors import CatalogError
from catalog.forms.client_limits import LimitError, from_json
from catalog.forms.priority import MAX_SHARE, PRIORITY_CLASSES, STANDARD
from catalog.forms.servers import FAILOVER_TIMEOUT_S, ServerList
from gateway.bodies import read_at_most
from gateway.settings import no_secrets
from gateway.state import Client, State
from gateway.table import EngineAuth, build, engine_auth

log = structlog.get_logger("gateway")

# Keys of a /v1/catalog entry that are not part of the definition.
_NOT_DEFINITION = frozenset({"declared", "replicas", "resilience"})
# A feed larger than this is not one.
MAX_FEED_BYTES = 64 << 20
# The longest pause between two attempts to reach the control plane. Short, because the
# first full read after a restart of `llmgw serve` is also when a change of its auth file
# takes effect here; a failed attempt costs one refused connection. Jittered, so a fleet
# of gateways does not come back in step.
MAX_PAUSE_S = 1.0
# Events closer together than this are one change.
BATCH_S = 0.03


class FeedError(Exception):
    pass


class ServerFailed(FeedError):
    """The server failed us (unreachable, too slow, a 5xx): the next one is tried."""


class Follower:
    def __init__(
        self,
        state: State,
        servers: str | ServerList,
        token: str,
        resync_s: float,
        engine_secret: Callable[[str], str] = no_secrets,
    ) -> None:
        self.state = state
        self.engine_secret = engine_secret
        # The engines' keys this gateway could not send, as last logged (logged on change).
        self._unsent: dict[tuple[str, str], str] = {}
        # By (model, profile): the engine key's line sent now, and the one before it
        # (a rotation: the engines not yet restarted hold that one).
        self._keys: dict[tuple[str, str], tuple[bytes, bytes]] = {}
        if isinstance(servers, str):
            servers = ServerList((servers.rstrip("/"),))
        self.servers = servers
        self.resync_s = resync_s
        self.session = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {token}"},
            timeout=aiohttp.ClientTimeout(total=None, connect=3, sock_read=30),
        )
        self.models: list[Model] = []
        self.placements: list[Mapping[str, Any]] = []
        self.position = 0
        self.placement_position = 0
        self._skipped: set[str] = set()
        self._readers_absent = False

    @property
    def server(self) -> str:
        """The server followed now."""
        return self.servers.current

    async def close(self) -> None:
        await self.session.close()

    def _timeout(self) -> aiohttp.ClientTimeout:
        if self.servers.several:
            # Another replica is as good: a slow or frozen one is left within about a second.
            return aiohttp.ClientTimeout(
                total=10, connect=FAILOVER_TIMEOUT_S, sock_read=FAILOVER_TIMEOUT_S
            )
        return aiohttp.ClientTimeout(total=10)

    async def _get(self, path: str) -> tuple[Any, Mapping[str, str]]:
        server = self.server
        try:
            async with self.session.get(server + path, timeout=self._timeout()) as resp:
                if resp.status != 200:
                    text = (await resp.content.read(300)).decode("utf-8", "replace")
                    failed = ServerFailed if resp.status >= 500 else FeedError
                    raise failed(f"GET {path} answered {resp.status}: {text}")
                raw = await read_at_most(resp.content, MAX_FEED_BYTES)
                if len(raw) > MAX_FEED_BYTES:
                    raise FeedError(f"GET {path}: larger than {MAX_FEED_BYTES} bytes")
                return json.loads(raw), resp.headers
        except (aiohttp.ClientError, TimeoutError, ServerFailed) as exc:
            self._failed(server, exc)
            raise

    def _failed(self, server: str, exc: BaseException) -> None:
        """``server`` failed: move on from it (once, however many reads failed together)."""
        self.servers.failed(server, f"{type(exc).__name__}: {exc}"[:300])

    async def read_catalog(self) -> None:
        data, headers = await self._get("/v1/catalog")
        models = []
        for entry in data if isinstance(data, list) else ():
            if not isinstance(entry, dict):
                continue
            definition = {k: v for k, v in entry.items() if k not in _NOT_DEFINITION}
            try:
                models.append(parse_model(definition))
            except CatalogError as exc:
                # A definition this gateway cannot read (a newer release's field): named
                # once, and the model is not served here rather than served wrongly.
                name = str(entry.get("name"))[:100]
                if name not in self._skipped:
                    self._skipped.add(name)
                    log.warning("gateway.model_skipped", model=name, reason=str(exc)[:300])
        self.models = models
        position = headers.get("X-Llmgw-Position", "")
        if position.isdigit():
            self.position = int(position)

    async def read_placements(self) -> None:
        data, _ = await self._get("/v1/placements")
        self.placements = [p for p in data if isinstance(p, dict)] if isinstance(data, list) else []

    async def read_clients(self) -> None:
        data, _ = await self._get("/v1/gateway/client-tokens")
        clients: dict[str, Client] = {}
        for entry in data if isinstance(data, list) else ():
            if not isinstance(entry, dict):
                continue
            digest, name, models = entry.get("sha256"), entry.get("name"), entry.get("models")
            if not isinstance(digest, str) or not isinstance(name, str):
                continue
            listed = (
                tuple(m for m in models if isinstance(m, str)) if isinstance(models, list) else ()
            )
            try:
                limits = from_json(entry.get("limits"))
            except LimitError as exc:
                # Limits this gateway cannot read (a newer release's): the token is not
                # taken, rather than served without its limits.
                log.warning("gateway.client_skipped", client=name[:64], reason=str(exc)[:300])
                continue
            clients[digest] = Client(name, listed or None, limits, *_place(entry))
        if self.state.prepare is not None:
            # A limited token new here is taken once its allowance is drawn (a call
            # bounded in time; failed, it is taken anyway): its first request is
            # served from what is held, not refused for want of it.
            await self.state.prepare(clients)
        self.state.clients = clients

    async def read_readers(self) -> None:
        """The operator and reader tokens' hashes, for ``/metrics`` and ``/routing``.

        A control plane without the route (older) answers 404: those routes then take
        no token at all but answer 401 naming why, rather than open up."""
        try:
            data, _ = await self._get("/v1/gateway/reader-tokens")
        except FeedError as exc:
            if " answered 404" not in str(exc):
                raise
            if not self._readers_absent:
                self._readers_absent = True
                log.warning(
                    "gateway.reader_tokens_absent",
                    server=self.server,
                    detail="the control plane does not list reader tokens (an older "
                    "release): /metrics and /routing need [gateway] admin_open = true",
                )
            data = []
        readers: dict[str, str] = {}
        for entry in data if isinstance(data, list) else ():
            if isinstance(entry, dict):
                digest, name = entry.get("sha256"), entry.get("name")
                if isinstance(digest, str) and isinstance(name, str):
                    readers[digest] = name
        self.state.readers = readers

    def install(self) -> None:
        state = self.state
        auth = self._rotated(engine_auth(self.models, self.engine_secret))
        self._log_unsent(auth)
        state.install(build(self.models, self.placements, self.position, state.engine_slots, auth))
        self._confirmed()

    def _rotated(
        self, auth: dict[tuple[str, str], EngineAuth]
    ) -> dict[tuple[str, str], EngineAuth]:
        """``auth`` with the key before each rotation of this gateway's copy: the
        engines started with it keep it until they restart (the docs' order: the
        gateways' copies first, then the agents'), and refused the new one."""
        for where, a in auth.items():
            if not a.line:
                continue
            now, before = self._keys.get(where, (b"", b""))
            if a.line != now:
                now, before = a.line, now or before
                self._keys[where] = (now, before)
            if before and before != a.line:
                auth[where] = replace(a, previous=before)
        return auth

    def _log_unsent(self, auth: Mapping[tuple[str, str], EngineAuth]) -> None:
        unsent = {where: a.problem for where, a in auth.items() if a.problem}
        if unsent == self._unsent:
            return
        for (model, profile), note in sorted(unsent.items()):
            if self._unsent.get((model, profile)) != note:
                log.warning("gateway.engine_key_unsent", model=model, profile=profile, why=note)
        self._unsent = unsent

    def _confirmed(self) -> None:
        state = self.state
        if not state.reachable and state.synced:
            log.info("gateway.control_plane_back", server=self.server)
        state.synced = state.reachable = True
        state.last_sync = time.monotonic()
        state.last_error = ""

    def _lost(self, exc: BaseException) -> None:
        state = self.state
        reason = f"{type(exc).__name__}: {exc}"[:300]
        if state.reachable or not state.last_error:
            log.warning(
                "gateway.control_plane_unreachable",
                server=self.server,
                error=reason,
                serving="the last known table" if state.synced else "nothing yet",
            )
        state.reachable = False
        state.last_error = reason

    async def sync(self) -> None:
        await asyncio.gather(
            self.read_catalog(), self.read_placements(), self.read_clients(), self.read_readers()
        )
        self.install()

    async def run(self) -> None:
        pause = 0.2
        while True:
            server = self.server
            try:
                await self.sync()
                pause = 0.2
                await self._follow(time.monotonic() + self.resync_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # every failure means the same: keep the last table
                if self.server != server:
                    continue  # moved to the next replica: read it at once
                self._lost(exc)
                await asyncio.sleep(pause * random.uniform(0.8, 1.2))
                pause = min(pause * 2, MAX_PAUSE_S)

    async def _follow(self, until: float) -> None:
        """Read the event stream until ``until``; re-read what its events say changed.

        Events that come together (a round places many replicas) are taken as one
        change: the re-read waits until the stream is quiet for ``BATCH_S``.
        """
        server = self.server
        try:
            await self._stream(server, until)
        except (aiohttp.ClientError, ServerFailed) as exc:
            self._failed(server, exc)
            raise

    async def _stream(self, server: str, until: float) -> None:
        params = {"placements": "true", "after": str(self.position)}
        connect = FAILOVER_TIMEOUT_S if self.servers.several else 3
        async with self.session.get(
            server + "/v1/events/stream",
            params=params,
            timeout=aiohttp.ClientTimeout(total=None, connect=connect, sock_read=None),
        ) as resp:
            if resp.status != 200:
                failed = ServerFailed if resp.status >= 500 else FeedError
                raise failed(f"the event stream answered {resp.status}")
            name: bytes | None = None
            data = token = usage = False
            catalog = placements = tokens = False
            while True:
                left = until - time.monotonic()
                if left <= 0:
                    return
                pending = catalog or placements or tokens
                try:
                    line = await asyncio.wait_for(
                        resp.content.readline(), min(left, BATCH_S) if pending else left
                    )
                except TimeoutError:
                    line = None
                if line is None or not line:
                    if pending:
                        if tokens:
                            await asyncio.gather(self.read_clients(), self.read_readers())
                        if catalog:
                            await asyncio.gather(self.read_catalog(), self.read_placements())
                        elif placements:
                            await self.read_placements()
                        if catalog or placements:
                            self.install()
                        catalog = placements = tokens = False
                    if line is not None:
                        return  # the server ended the stream: resync, then follow again
                    continue
                text = line.rstrip(b"\r\n")
                if text.startswith(b"event:"):
                    name = text[6:].strip()
                elif text.startswith(b"data:"):
                    data = True
                    token = token or _is_token_event(text[5:])
                    usage = usage or _is_usage_event(text[5:])
                elif not text:  # the end of a message
                    if data:
                        if name is not None and name.startswith(b"placement"):
                            placements = True
                        elif token:
                            tokens = True
                        elif not usage:
                            catalog = True
                    name, data, token, usage = None, False, False, False


def _is_usage_event(data: bytes) -> bool:
    """Whether a catalog message's ``data:`` is a gateway's usage counts
    (``usage.recorded``, every flush of every gateway): nothing to read again."""
    if b'"usage.recorded"' not in data:
        return False
    try:
        event = json.loads(data)
    except ValueError:
        return False
    return isinstance(event, dict) and event.get("type") == "usage.recorded"


def _is_token_event(data: bytes) -> bool:
    """Whether a catalog message's ``data:`` is a token's event (its type ``token.*``).

    Decoded only when the text could be one: a model's definition is read as a catalog
    change whatever its text holds."""
    if b'"token.' not in data:
        return False
    try:
        event = json.loads(data)
    except ValueError:
        return False
    kind = event.get("type") if isinstance(event, dict) else None
    return isinstance(kind, str) and kind.startswith("token.")


def _place(entry: dict[str, Any]) -> tuple[str, float]:
    """A client token's priority class and share in the feed; what is not one (an older
    control plane's feed says neither) is the default, standard and 1."""
    klass, share = entry.get("priority_class"), entry.get("share")
    if klass not in PRIORITY_CLASSES:
        klass = STANDARD
    if type(share) is not int or not 1 <= share <= MAX_SHARE:
        share = 1
    return str(klass), float(share)
