"""What one request may really use on a ready engine, as the engine itself says.

The catalog's ``context_length`` is what an operator wrote; the engine decides.
llama.cpp divides ``--ctx-size`` across its ``--parallel`` slots, so a pool of
8192 across four slots is 2048 a request (``/props``: ``n_ctx`` of a slot, and
``total_slots``); vLLM lists ``max_model_len`` with each model in ``/v1/models``
(the sim engine too, when given ``--max-model-len``). The agent reads it once
the engine is ready and reports it with the replica's state; the control plane
compares it with the catalog (``scheduler.lifecycle.context_check``).

The parsers are pure and bounded: an engine's answer is read up to ``MAX_BODY``
bytes and anything of the wrong shape means "not known", never a guess.
"""

from __future__ import annotations

import http.client
import io
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from http.client import HTTPMessage
from typing import IO, Any

# Engines' answers here are a few kilobytes; /props carries a chat template.
MAX_BODY = 1 << 20
# No engine serves a window of a billion tokens (the control plane's bound too).
MAX_TOKENS = 1 << 30


@dataclass(frozen=True, slots=True)
class EngineContext:
    """``tokens`` one request may use; ``detail`` how the engine came to it."""

    tokens: int
    detail: str


def probe_path(engine: str) -> str | None:
    """Where an engine says its context; None for an engine that does not."""
    if engine == "llamacpp":
        return "/props"
    if engine in ("vllm", "sim"):
        return "/v1/models"
    return None


def parse(
    engine: str, body: Any, served_model_name: str, argv: Sequence[str] = ()
) -> EngineContext | None:
    """The context in an engine's answer (parsed JSON); None when it does not say.
    ``argv`` is the command line the engine runs with (how it was asked)."""
    if engine == "llamacpp":
        return from_llamacpp_props(body, argv)
    if engine in ("vllm", "sim"):
        return from_models_list(body, served_model_name)
    return None


def _count(value: Any) -> int | None:
    if type(value) is not int or not 1 <= value <= MAX_TOKENS:
        return None
    return value


def _flag(argv: Sequence[str], *names: str) -> int | None:
    """The last value given to any of ``names`` in ``argv`` (llama-server takes the last)."""
    value = None
    for i, word in enumerate(argv[:-1]):
        if word in names:
            value = argv[i + 1]
    return int(value) if value is not None and value.isdigit() else None


def from_llamacpp_props(props: Any, argv: Sequence[str] = ()) -> EngineContext | None:
    """llama-server's ``/props``: ``default_generation_settings.n_ctx`` is a slot's context.

    The arithmetic is written the operator's way when the command line it ran with
    (``argv``) agrees with it; with a unified KV cache (``--kv-unified``, llama-server's
    default when ``--parallel`` is not given) every slot may use the whole pool, and
    the detail says what /props said instead.

    >>> from_llamacpp_props({"default_generation_settings": {"n_ctx": 512}, "total_slots": 4},
    ...     ["llama-server", "--ctx-size", "2048", "--parallel", "4"])
    EngineContext(tokens=512, detail='--ctx-size 2048 / --parallel 4 = 512')
    """
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    per_slot = _count(settings.get("n_ctx")) if isinstance(settings, dict) else None
    if per_slot is None:
        return None
    slots = _count(props.get("total_slots")) or 1
    if _flag(argv, "-c", "--ctx-size") == per_slot * slots:
        return EngineContext(
            per_slot, f"--ctx-size {per_slot * slots} / --parallel {slots} = {per_slot}"
        )
    return EngineContext(per_slot, f"n_ctx {per_slot} a slot, {slots} slot(s) (/props)")


def from_models_list(models: Any, served_model_name: str) -> EngineContext | None:
    """vLLM's ``/v1/models``: the ``max_model_len`` of the served model's entry.

    >>> from_models_list({"data": [{"id": "m", "max_model_len": 8192}]}, "m")
    EngineContext(tokens=8192, detail='max_model_len 8192')
    """
    if not isinstance(models, dict) or not isinstance(models.get("data"), list):
        return None
    for entry in models["data"][:1024]:
        if isinstance(entry, dict) and entry.get("id") == served_model_name:
            tokens = _count(entry.get("max_model_len"))
            return None if tokens is None else EngineContext(tokens, f"max_model_len {tokens}")
    return None


class KeyStaysHome(urllib.request.HTTPRedirectHandler):
    """Redirects followed without ``Authorization`` to another origin (scheme, host,
    port), as aiohttp and requests do: urllib sends every header on, and whatever
    answers on an engine's address could send the engine's key to a host it names."""

    def redirect_request(  # noqa: PLR0917 (urllib's own signature)
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(new.full_url) != _origin(req.full_url):
            for held in (new.headers, new.unredirected_hdrs):
                for name in [n for n in held if n.lower() == "authorization"]:
                    del held[name]
        return new


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port


def direct_opener(within: float | None = None) -> urllib.request.OpenerDirector:
    """Straight to the engine (or gateway), never through an http_proxy the environment
    may name for the control plane, and its key never on to another origin. ``within``:
    seconds the whole exchange may take from now (redirects, head and body), where a
    timeout bounds each read alone, and an engine sending a byte just within it held
    its reader for as long as it liked (the agent's loop: its health checks and context
    reads)."""
    handlers: list[urllib.request.BaseHandler] = [
        urllib.request.ProxyHandler({}),
        KeyStaysHome(),
    ]
    if within is not None:
        deadline = time.monotonic() + within
        handlers += [_Bounded(deadline), _BoundedTLS(deadline)]
    return urllib.request.build_opener(*handlers)


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each given what is left until ``deadline`` as its timeout.
    Through the socket's own ``makefile``: it holds the socket open once urllib closes
    its handle on it (an answer is read after that)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self.sock = sock
        self.raw = sock.makefile("rb", buffering=0)
        self.deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer took longer than its time")
        self.sock.settimeout(left)
        return self.raw.readinto(buffer)

    def close(self) -> None:
        self.raw.close()
        super().close()


class _DeadlineSocket:
    """A connected socket whose ``makefile`` (what ``http.client`` reads an answer
    through) reads within ``deadline``; everything else as the socket's."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str = "rb", *_: Any, **__: Any) -> io.BufferedReader:
        assert mode == "rb", mode
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _connection(base: type[http.client.HTTPConnection], deadline: float) -> Any:
    def connection(host: str, **kwargs: Any) -> http.client.HTTPConnection:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer took longer than its time")
        given = kwargs.get("timeout")  # urllib's default: an object, not a number
        kwargs["timeout"] = min(given, left) if isinstance(given, int | float) else left
        conn = base(host, **kwargs)
        connect = conn.connect

        def bounded_connect() -> None:
            connect()
            conn.sock = _DeadlineSocket(conn.sock, deadline)

        conn.connect = bounded_connect  # type: ignore[method-assign]
        return conn

    return connection


class _Bounded(urllib.request.HTTPHandler):
    def __init__(self, deadline: float) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_connection(http.client.HTTPConnection, self.deadline), req)


class _BoundedTLS(urllib.request.HTTPSHandler):
    def __init__(self, deadline: float) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_connection(http.client.HTTPSConnection, self.deadline), req)


def read(
    engine: str,
    base_url: str,
    served_model_name: str,
    timeout: float = 2.0,
    argv: Sequence[str] = (),
    *,
    key: str | None = None,
) -> EngineContext | None:
    """Ask a ready engine (``key``: the one it was started with, sent as a bearer
    token); None when it has no such answer, or none that can be read."""
    path = probe_path(engine)
    if path is None:
        return None
    ask = urllib.request.Request(base_url.rstrip("/") + path)
    if key:
        ask.add_header("Authorization", f"Bearer {key}")
    try:
        with direct_opener(within=timeout).open(ask, timeout=timeout) as answer:
            if not 200 <= int(answer.status) < 300:
                return None
            raw = answer.read(MAX_BODY + 1)
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        return None
    if len(raw) > MAX_BODY:
        return None
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return parse(engine, body, served_model_name, argv)
