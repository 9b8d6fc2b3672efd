"""``python -m bench.gateway.stub [--port P] [--chunks N] [--chunk-delay-ms D]``: the upstream
of the gateway benchmark, an OpenAI-shaped engine that answers at once.

It must not be the limit of what it measures, so it is an asyncio ``Protocol`` on uvloop with
its answers prepared at start: no framework, no per-request JSON encoding. It speaks HTTP/1.1
with keep-alive (what every gateway under test keeps to its upstream) and answers:

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: a chat completion (or
  completion) of a few words, with ``usage``; with ``"stream": true`` in the body, ``--chunks``
  server-sent events of one token each, ``--chunk-delay-ms`` apart, then ``data: [DONE]``,
  each event written as its own HTTP chunk as an engine writes it; asked for its usage
  (``stream_options.include_usage``), the stream ends with a usage event (``choices``
  empty) before ``[DONE]``, as vLLM's, llama.cpp's and OpenAI's do;
- ``GET /health``, ``GET /healthz``, ``GET /v1/models``, ``GET /metrics``: what routers probe.

Prints ``listening on http://127.0.0.1:PORT`` once bound; stops on SIGTERM or SIGINT. Every
path it does not know is answered 404 and counted, and the counts are printed to stderr at
exit, so a peer that probes something else shows up in the benchmark's log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections import Counter
from typing import cast

import uvloop

MODEL = "bench-model"
MAX_HEAD = 64 * 1024
MAX_BODY = 1024 * 1024


def _response(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


def _chat_body() -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hello from the stub."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 8, "completion_tokens": 5, "total_tokens": 13},
        },
        separators=(",", ":"),
    ).encode()


def _completion_body() -> bytes:
    return json.dumps(
        {
            "id": "cmpl-bench",
            "object": "text_completion",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [{"index": 0, "text": " Hello.", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
        },
        separators=(",", ":"),
    ).encode()


def _chunked(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


def _stream_events(chunks: int, usage: bool = False) -> list[bytes]:
    """The HTTP chunks of one streamed chat completion: role, ``chunks`` tokens, finish,
    (``usage``: the usage event,) DONE."""
    created = int(time.time())

    def event(delta: dict[str, str], finish: str | None = None) -> bytes:
        data = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": created,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return _chunked(b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n")

    out = [event({"role": "assistant", "content": ""})]
    out += [event({"content": f" tok{i}"}) for i in range(chunks)]
    out.append(event({}, "stop"))
    if usage:
        data = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": created,
            "model": MODEL,
            "choices": [],
            "usage": {"prompt_tokens": 8, "completion_tokens": chunks, "total_tokens": 8 + chunks},
        }
        out.append(_chunked(b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"))
    out.append(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return out


class Answers:
    """Everything the stub sends, prepared once."""

    def __init__(self, chunks: int, chunk_delay: float) -> None:
        self.chat = _response("200 OK", _chat_body())
        self.completion = _response("200 OK", _completion_body())
        models = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "stub"}]}
        self.models = _response("200 OK", json.dumps(models).encode())
        self.health = _response("200 OK", b"{}")
        self.metrics = _response("200 OK", b"", "text/plain; version=0.0.4")
        self.not_found = _response("404 Not Found", b'{"error":{"message":"not found"}}')
        self.too_large = _response("413 Content Too Large", b'{"error":{"message":"too large"}}')
        self.stream_head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        self.stream = _stream_events(chunks)
        self.stream_usage = _stream_events(chunks, usage=True)
        self.chunk_delay = chunk_delay
        self.unknown: Counter[str] = Counter()


class StubProtocol(asyncio.Protocol):
    """One connection: parse requests as they arrive (pipelined or split), answer in order."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        # A streamed answer in progress: later requests on the connection wait their turn.
        self.busy: asyncio.Task[None] | None = None
        self.pending: list[tuple[bytes, bytes]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.busy is not None:
            self.busy.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    self._close(self.answers.too_large)
                return
            head = self.buffer[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length > MAX_BODY:
                self._close(self.answers.too_large)
                return
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            if self.busy is not None:
                self.pending.append((head, body))
            else:
                self._answer(head, body)

    def _close(self, answer: bytes) -> None:
        if self.transport is not None:
            self.transport.write(answer)
            self.transport.close()

    def _answer(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        line = head.split(b"\r\n", 1)[0]
        method, _, rest = line.partition(b" ")
        path = rest.rpartition(b" ")[0].split(b"?", 1)[0]
        answers = self.answers
        if method == b"POST" and path in (b"/v1/chat/completions", b"/chat/completions"):
            if _wants_stream(body):
                events = answers.stream_usage if _wants_usage(body) else answers.stream
                self.busy = asyncio.ensure_future(self._stream(events))
            else:
                self.transport.write(answers.chat)
        elif method == b"POST" and path in (b"/v1/completions", b"/completions"):
            self.transport.write(answers.completion)
        elif path in (b"/health", b"/healthz", b"/health_generate", b"/readiness"):
            self.transport.write(answers.health)
        elif path in (b"/v1/models", b"/models"):
            self.transport.write(answers.models)
        elif path == b"/metrics":
            self.transport.write(answers.metrics)
        else:
            asked = b"%s %s" % (method, path)
            answers.unknown[asked.decode(errors="replace")] += 1
            self.transport.write(answers.not_found)

    async def _stream(self, events: list[bytes]) -> None:
        answers = self.answers
        try:
            if self.transport is None:
                return
            self.transport.write(answers.stream_head)
            for chunk in events:
                if answers.chunk_delay:
                    await asyncio.sleep(answers.chunk_delay)
                if self.transport is None:
                    return
                self.transport.write(chunk)
        finally:
            self.busy = None
        while self.pending and self.busy is None and self.transport is not None:
            head, body = self.pending.pop(0)
            self._answer(head, body)


def _wants_stream(body: bytes) -> bool:
    if b'"stream"' not in body:
        return False
    try:
        return bool(json.loads(body).get("stream"))
    except (ValueError, AttributeError):
        return False


def _wants_usage(body: bytes) -> bool:
    if b'"include_usage"' not in body:
        return False
    try:
        options = json.loads(body).get("stream_options")
    except (ValueError, AttributeError):
        return False
    return isinstance(options, dict) and options.get("include_usage") is True


async def serve(host: str, port: int, answers: Answers) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: StubProtocol(answers), host, port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on http://{host}:{bound}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    if answers.unknown:
        print(f"stub: unknown paths {dict(answers.unknown)}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway.stub", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=16, help="tokens in a streamed answer")
    parser.add_argument(
        "--chunk-delay-ms", type=float, default=1.0, help="time between streamed tokens"
    )
    args = parser.parse_args(argv)
    answers = Answers(args.chunks, args.chunk_delay_ms / 1000)
    uvloop.run(serve(args.host, args.port, answers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
