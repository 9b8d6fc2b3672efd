"""The ``sim`` engine: a small OpenAI-compatible server that produces synthetic text.

It lets a cluster without cards or weights be run and tested end to end: the
agent starts it like any engine (``python -m agent.sim --port N --model M``),
its ``/health`` tells when it is ready, and clients speak the OpenAI API to
it (``/v1/models``, ``/v1/chat/completions``, with ``stream: true`` as
server-sent events). The text is made up, deterministically from the prompt,
so tests can compare answers; a model is served by sim only when every one
of its profiles is sim (the catalog's ``simulated``), so this text is never
passed off as a real model's.

Flags for tests and demos: ``--startup-delay`` (seconds before it listens,
as a real engine loading weights), ``--exit-after`` and ``--exit-code`` (it
dies on its own, to show a failure).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

# The synthetic vocabulary; answers are drawn from it.
_TEXT = (
    "the cluster placed this replica on a node and its agent started a simulated engine "
    "which answers with synthetic text so that routing and scheduling can be tested "
    "without cards or weights"
)
WORDS = tuple(_TEXT.split(" "))
MAX_BODY = 1 << 20
DEFAULT_MAX_TOKENS = 16
MAX_TOKENS = 4096


def synthetic(prompt: str, n: int) -> list[str]:
    """``n`` words chosen by the prompt's digest: the same prompt, the same answer."""
    seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big")
    return [WORDS[(seed + i * 7) % len(WORDS)] for i in range(n)]


def _error(status: int, message: str, kind: str = "invalid_request_error") -> Any:
    # The OpenAI error shape, so an SDK shows the message.
    return JSONResponse({"error": {"message": message, "type": kind, "code": None}}, status)


def create_app(model: str, token_delay: float = 0.0) -> FastAPI:
    app = FastAPI(title=f"sim engine: {model}", docs_url=None, redoc_url=None)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        entry = {"id": model, "object": "model", "created": 0, "owned_by": "llmgw-sim"}
        return {"object": "list", "data": [entry]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        raw = await request.body()
        if len(raw) > MAX_BODY:
            return _error(413, f"the request is longer than {MAX_BODY} bytes")
        try:
            body = json.loads(raw)
            messages = body["messages"]
            prompt = " ".join(str(m.get("content", "")) for m in messages)
        except (ValueError, KeyError, TypeError, AttributeError):
            return _error(400, "the body must be JSON with a list of messages")
        if body.get("model") != model:
            return _error(
                404, f"this engine serves {model!r}, not {body.get('model')!r}", "not_found_error"
            )
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        limit = DEFAULT_MAX_TOKENS if limit is None else limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            return _error(400, "max_tokens must be a positive integer")
        words = synthetic(prompt, min(limit, MAX_TOKENS))
        ident, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        usage = {
            "prompt_tokens": len(prompt.split()),
            "completion_tokens": len(words),
            "total_tokens": len(prompt.split()) + len(words),
        }
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": " ".join(words)},
                            "finish_reason": "length",
                        }
                    ],
                    "usage": usage,
                }
            )

        def chunk(delta: dict[str, str], finish: str | None) -> str:
            data = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(data)}\n\n"

        def events() -> Iterator[str]:
            yield chunk({"role": "assistant", "content": ""}, None)
            for i, word in enumerate(words):
                time.sleep(token_delay)
                yield chunk({"content": word if i == 0 else " " + word}, None)
            yield chunk({}, "length")
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent.sim", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True, help="the model name it serves")
    p.add_argument("--startup-delay", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--token-delay", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--exit-after", type=float, default=None, metavar="SECONDS")
    p.add_argument("--exit-code", type=int, default=1)
    args = p.parse_args(argv)
    print(f"sim engine: serving {args.model!r}; loading for {args.startup_delay}s", flush=True)
    time.sleep(args.startup_delay)
    if args.exit_after is not None:
        threading.Timer(args.exit_after, _die, (args.exit_code,)).start()
    import uvicorn

    print(f"sim engine: listening on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(
        create_app(args.model, args.token_delay),
        host=args.host,
        port=args.port,
        log_level="warning",
    )
    return 0


def _die(code: int) -> None:
    print(f"sim engine: exiting with code {code} as asked (--exit-after)", flush=True)
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
