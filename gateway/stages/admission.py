"""Resolution and admission: the catalog's limits applied to one request, before any replica.

Pure: a parsed body in, facts or a refusal out. Every refusal is OpenAI's error shape
and names the model, the field and the limit, so a client (and its operator) can act
on it without reading our logs. A refusal costs microseconds and no card time; the
alternative, an over-long prompt admitted, given a replica and failed at the engine, is
what ``context_length`` exists to prevent (the seed's words).

Token counting for the context check (see ``docs/operator/gateway.md``): most requests
are decided without counting, by an upper bound (``upper_bound``): a byte-level
tokenizer never makes more tokens than the text has UTF-8 bytes, plus the chat
template's few tokens per message. Only a request whose bound does not fit is counted,
by the engine's own ``/tokenize`` when it has one (the edge does that), else by
``estimate``, a documented conservative estimate.

The window a request must fit (``window``) is the smaller of the catalog's
``context_length`` and what the model's ready replicas really give one request (their
engines' ``effective_context_length``: llama.cpp divides ``--ctx-size`` across its
``--parallel`` slots). Any ready replica may be picked, so the tightest one counts.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import is_
from typing import Any

from gateway.table import ModelEntry, Replica, Table

CHAT = "chat"
COMPLETIONS = "completions"
EMBEDDINGS = "embeddings"
# A request nested deeper than this is not a chat request (a chat body is about 5 deep).
MAX_DEPTH = 32
# A model name longer than this is refused before any look-up or suggestion.
MAX_MODEL_NAME = 256
# The largest integer the gateway takes in a field it reads (``max_tokens``,
# ``max_completion_tokens``, token ids): an engine's int32. A larger one is refused
# naming its field, not carried into arithmetic, messages and the engine.
MAX_INT = 2**31 - 1
# An integer literal longer than this (anywhere in a body) is refused naming its field:
# Python's own limit on converting text to int (``sys.get_int_max_str_digits``), past
# which json.loads failed with a message about ``set_int_max_str_digits``.
MAX_INT_DIGITS = 4300
# Chat templates wrap each message in a few special tokens (Llama 3: 5; ChatML: 4).
TEMPLATE_TOKENS_PER_MESSAGE = 8
TEMPLATE_TOKENS = 16
# Without the engine's tokenizer: one token per 3 bytes of UTF-8. English runs about
# 4 bytes a token, code 3, CJK 3 bytes a character and about one token each; so this
# over-counts the common cases, and the engine stays the last check.
ESTIMATE_BYTES_PER_TOKEN = 3


@dataclass(frozen=True, slots=True)
class Refusal(Exception):
    """An OpenAI error: ``{"error": {"message", "type", "param", "code"}}``."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    type: str = "invalid_request_error"
    retry_after: int | None = None  # seconds, for a 503

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    @property
    def reason(self) -> str:
        """For metrics: the code, or the status."""
        return self.code or str(self.status)


# Not frozen: made on every request, and a frozen dataclass's fields are set
# one by one through object.__setattr__, four times the instructions of a plain one's.
@dataclass(slots=True)
class Request:
    """The facts of one request that admission and routing read; never the text itself."""

    kind: str
    model: str
    stream: bool
    max_tokens: int | None  # max_completion_tokens, else max_tokens
    max_tokens_field: str
    tools: bool
    images: bool
    text_bytes: int  # UTF-8 bytes of every text the prompt holds
    messages: int
    token_ids: int  # prompt tokens given as ids (completions/embeddings): counted exactly
    session: str | None  # the `user` field (an x-session-id header wins at the edge)
    text: str  # the prompt's text, joined: only for /tokenize, never logged
    # A content part neither text nor an image (audio, video...): tokens not in the
    # body's bytes (gateway.stages.plausible).
    media: bool = False


def _len_utf8(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


def _depth_ok(value: Any) -> bool:
    """Whether no container is nested deeper than MAX_DEPTH: a level of the body at a
    time, each level's values gathered in C (``map``, ``compress``, ``chain``), never a
    Python step per value: a walk with one (a stack of each container with its depth)
    took 2.2 s of CPU for an 8 MiB body of 2.7 million empty objects, this 0.22 s. (A
    decoded JSON body's containers are exactly ``dict`` and ``list``.)"""
    level = [value]
    for _ in range(MAX_DEPTH):
        kinds = list(map(type, level))
        dicts = compress(level, map(is_, kinds, repeat(dict)))
        lists = compress(level, map(is_, kinds, repeat(list)))
        level = [*chain.from_iterable(map(dict.values, dicts)), *chain.from_iterable(lists)]
        if not level:
            return True
    # The values at depth MAX_DEPTH + 1: none may be a container.
    kinds_left = set(map(type, level))
    return dict not in kinds_left and list not in kinds_left


def _refuse_field(field: str, what: str) -> Refusal:
    return Refusal(400, f"{field} {what}", param=field, code="invalid_value")


def _completion_limit(body: Mapping[str, Any]) -> tuple[int | None, str]:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _refuse_field(name, "must be a positive integer")
        if value > MAX_INT:
            raise _refuse_field(
                name, f"is {_digits(value)}; it must be a positive integer at most {MAX_INT}"
            )
        return value, name
    return None, "max_tokens"


def _digits(value: int) -> str:
    """An integer for a refusal's words: itself if short, else its number of digits."""
    text = str(value) if value.bit_length() < 128 else ""
    return text or f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"


def _shallow(raw: bytes | None) -> bool:
    """Whether the JSON text ``raw`` surely nests no deeper than MAX_DEPTH: it opens no
    more containers than that in all. Every container starts with ``{`` or ``[`` (a
    byte of that value in UTF-8, -16 or -32; inside strings they only count extra), so
    the depth is at most their count. Two scans in C, against 2.8 us for walking a
    small chat body in Python; a body with more brackets is walked."""
    return raw is not None and raw.count(b"{") + raw.count(b"[") <= MAX_DEPTH


def parse_request(body: Any, kind: str, raw: bytes | None = None) -> Request:
    """The facts of a parsed JSON body; a ``Refusal`` (400) for a malformed one.

    ``raw``: the JSON text ``body`` was decoded from, when the caller has it (a cheaper
    depth check)."""
    if not isinstance(body, dict):
        raise Refusal(400, "the body must be a JSON object", code="invalid_body")
    if not _shallow(raw) and not _depth_ok(body):
        raise Refusal(400, f"the body is nested more than {MAX_DEPTH} deep", code="invalid_body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise Refusal(400, "`model` is required: a model name or alias", param="model")
    if len(model) > MAX_MODEL_NAME:
        raise Refusal(
            400,
            f"`model` is {len(model)} characters; a model name or alias has at most "
            f"{MAX_MODEL_NAME}",
            param="model",
            code="invalid_value",
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _refuse_field("stream", "must be true or false")
    max_tokens, field = _completion_limit(body)
    user = body.get("user")
    session = user if isinstance(user, str) and user else None
    tools = bool(body.get("tools")) or bool(body.get("functions"))
    if kind == CHAT:
        texts, images, media, messages = _chat_texts(body)
        token_ids = 0
    else:
        texts, token_ids = _prompt_texts(body, "prompt" if kind == COMPLETIONS else "input")
        images, media, messages = False, False, 0
    text = "\n".join(texts)
    return Request(
        kind=kind,
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        max_tokens_field=field,
        tools=tools,
        images=images,
        text_bytes=_len_utf8(text),
        messages=messages,
        token_ids=token_ids,
        session=session,
        text=text,
        media=media,
    )


def resolve(table: Table, name: str, allowed: frozenset[str] | None) -> ModelEntry:
    """The model a name or alias refers to, if this client may use it.

    ``allowed``: the canonical names the client's token is limited to, or None.
    """
    entry = table.resolve(name)
    if entry is None or (allowed is not None and entry.name not in allowed):
        names = table.names() if allowed is None else _visible(table, allowed)
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        if entry is not None:
            return _not_allowed(name)
        return _not_found(name, hint)
    return entry


def _visible(table: Table, allowed: frozenset[str]) -> list[str]:
    return sorted(n for n, canonical in table.index.items() if canonical in allowed)


def _not_found(name: str, hint: str) -> ModelEntry:
    raise Refusal(
        404,
        f"model {name!r} is not in the catalog (neither a name nor an alias).{hint} "
        "GET /v1/models lists the models you may use.",
        param="model",
        code="model_not_found",
    )


def _not_allowed(name: str) -> ModelEntry:
    # Only the name the client sent: which model an alias maps to is the catalog's,
    # not a client's to learn from a refusal (a token not allowed the model).
    raise Refusal(
        403,
        f"model {name!r}: this client token is not allowed to use it; ask the operator for "
        "a token that lists it (`llmgw token new NAME --role client --models ...`)",
        param="model",
        code="model_not_allowed",
        type="permission_error",
    )


def admit(req: Request, m: ModelEntry) -> None:
    """The model's own limits that need no counting; a ``Refusal`` (400) naming the one
    broken. The context window is checked by ``fits`` once the prompt is counted."""
    if req.kind == EMBEDDINGS and not m.embeddings:
        raise Refusal(
            400,
            f"model {m.name!r} does not serve embeddings (capabilities.embeddings is false "
            "in its catalog definition); use a model that has it",
            param="model",
            code="embeddings_unsupported",
        )
    if req.tools and not m.tools:
        raise Refusal(
            400,
            f"model {m.name!r} cannot use tools (capabilities.tools is false in its catalog "
            "definition): it would answer in prose; drop `tools` or use a model that has it",
            param="tools",
            code="tools_unsupported",
        )
    if req.images and not m.vision:
        raise Refusal(
            400,
            f"model {m.name!r} cannot read images (capabilities.vision is false in its "
            "catalog definition); send text only or use a model that has it",
            param="messages",
            code="vision_unsupported",
        )
    if req.max_tokens is not None and m.max_output and req.max_tokens > m.max_output:
        raise Refusal(
            400,
            f"model {m.name!r}: {req.max_tokens_field} {req.max_tokens} is above its "
            f"max_output {m.max_output}; ask for at most {m.max_output}",
            param=req.max_tokens_field,
            code="max_tokens_exceeded",
        )


def completion_tokens(req: Request) -> int:
    """The completion the request reserves room for (at least one token)."""
    return 0 if req.kind == EMBEDDINGS else max(req.max_tokens or 1, 1)


def upper_bound(req: Request) -> int:
    """Prompt tokens the request cannot exceed with any byte-level tokenizer."""
    template = TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE * req.messages
    return req.text_bytes + req.token_ids + (template if req.kind == CHAT else 0)


def estimate(req: Request) -> int:
    """The conservative estimate used when the engine has no ``/tokenize``."""
    template = TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE * req.messages
    return (
        math.ceil(req.text_bytes / ESTIMATE_BYTES_PER_TOKEN)
        + req.token_ids
        + (template if req.kind == CHAT else 0)
    )


@dataclass(frozen=True, slots=True)
class Window:
    """The tokens one request may use (0: no limit), and why, in a refusal's words."""

    tokens: int
    why: str


# A catalog's window by its context_length, made once (one was made on every request).
# Shared: nobody changes a Window.
_CATALOG_WINDOWS: dict[int, Window] = {}


def window(m: ModelEntry, replicas: Iterable[Replica] = ()) -> Window:
    """The smaller of the catalog's ``context_length`` and the least
    ``effective_context_length`` among ``replicas`` (the model's ready ones).

    Any ready replica may be picked, so the request must fit the tightest one.
    """
    declared = m.context_length
    catalog = _CATALOG_WINDOWS.get(declared)
    if catalog is None:
        if len(_CATALOG_WINDOWS) > 1024:
            _CATALOG_WINDOWS.clear()
        catalog = _CATALOG_WINDOWS[declared] = Window(declared, f"its context_length {declared}")
    known = [r for r in replicas if r.context is not None]
    if not known:
        return catalog
    tight = min(known, key=lambda r: (r.context or 0, r.key))
    effective = tight.context or 0
    if declared and effective >= declared:
        return catalog
    arithmetic = tight.context_detail or f"its engine gives one request {effective}"
    if declared:
        why = (
            f"{effective}, what one request may use on replica {tight.key} ({arithmetic} < "
            f"context_length {declared}: the smaller of the two is the limit)"
        )
    else:
        why = (
            f"{effective}, what one request may use on replica {tight.key} ({arithmetic}; "
            "the catalog declares no context_length)"
        )
    return Window(effective, why)


def needs_count(req: Request, m: ModelEntry, w: Window | None = None) -> bool:
    """Whether the context check must count: the bound alone does not show it fits."""
    w = w or window(m)
    if not w.tokens:
        return False
    return upper_bound(req) + completion_tokens(req) > w.tokens


def fits(
    req: Request, m: ModelEntry, prompt_tokens: int, how: str, w: Window | None = None
) -> None:
    """Refuse a prompt that, with the requested completion, overflows the window
    (``w``; the catalog's context_length when not given).

    ``how`` says how ``prompt_tokens`` was counted ("the engine's tokenizer",
    "an estimate"), so the client knows how exact the figure is.
    """
    w = w or window(m)
    if not w.tokens:
        return
    completion = completion_tokens(req)
    if prompt_tokens + completion > w.tokens:
        asked = f" plus {req.max_tokens_field} {completion}" if req.max_tokens is not None else ""
        raise Refusal(
            400,
            f"model {m.name!r}: the prompt is {_digits(prompt_tokens)} tokens ({how})"
            f"{asked}, above {w.why}; shorten the prompt or ask for fewer tokens",
            param="messages" if req.kind == CHAT else "prompt",
            code="context_length_exceeded",
        )


def _chat_texts(body: Mapping[str, Any]) -> tuple[list[str], bool, bool, int]:
    """The texts of ``messages``, whether any part is an image, whether any is another
    part not text (audio, video...), and how many messages."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise Refusal(400, "`messages` must be a non-empty list", param="messages")
    texts: list[str] = []
    images = media = False
    for m in raw:
        if not isinstance(m, dict):
            raise Refusal(400, "each of `messages` must be an object", param="messages")
        content = m.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    continue
                kind_of = part.get("type")
                if kind_of == "text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif kind_of in ("image_url", "input_image", "image"):
                    images = True
                elif kind_of != "text":
                    media = True
    return texts, images, media, len(raw)


def _prompt_texts(body: Mapping[str, Any], name: str) -> tuple[list[str], int]:
    """The texts of ``prompt`` (completions) or ``input`` (embeddings), and token ids."""
    raw = body.get(name)
    if raw is None or (isinstance(raw, list) and not raw):
        raise Refusal(400, f"`{name}` is required", param=name)
    texts: list[str] = []
    token_ids = 0
    for item in raw if isinstance(raw, list) else [raw]:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            _token_id(name, item)
            token_ids += 1
        elif isinstance(item, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in item
        ):
            for t in item:
                _token_id(name, t)
            token_ids += len(item)
        else:
            raise Refusal(400, f"`{name}` must be text, a list of texts, or token ids", param=name)
    return texts, token_ids


def _token_id(name: str, value: int) -> None:
    if not 0 <= value <= MAX_INT:
        raise Refusal(
            400,
            f"`{name}` holds the token id {_digits(value)}; a token id is an integer from 0 "
            f"to {MAX_INT}",
            param=name,
            code="invalid_value",
        )
