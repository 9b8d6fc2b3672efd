"""What an engine's token counts may charge: at most what the request could have used.

An engine runs code that came with its model, so the ``usage`` it reports is its word
(gateway.usage reads up to 12 digits a count). Taken as it stood, one answer claiming
2 x 10^12 completion tokens was settled against its client token's limits (``tpm``,
which every model's requests draw from, and the budget: a minute's limit of 1M tokens
owing for nearly four years), summed into the usage ledger and ``llmgw_gateway_tokens_total``,
and charged to the client on its model's fair-queuing clock (its next requests went
last for good). The control plane's bound on a count (10^15) bounds none of that.

So every count of a served request is held to what the request could plausibly have
used (``Most``), once, before anything reads it (gateway.proxy, as each attempt ends):
the settlement of its limits, the ledger, the metrics, the fair-queuing clock and its
``gateway.request`` log line all see the same, capped, figure.

- **prompt tokens**: at most the model's context window (the larger of the catalog's
  ``context_length`` and the serving replica's ``effective_context_length``); for a
  prompt of text only (no image, audio or other part), also at most the body's bytes
  plus the chat template's tokens plus ``PROMPT_SLACK`` (a byte-level tokenizer makes
  no more tokens than the text has bytes, and every text of the prompt is in the body;
  the slack is for what a template adds around tools). A model without a known window
  asked with a media part: ``MAX_TOKENS``.
- **completion tokens**: at most the request's ``max_completion_tokens`` (or
  ``max_tokens``), else the model's ``max_output``, else its window, else
  ``MAX_TOKENS``; times the choices asked (``n``, ``best_of``: each choice's tokens are
  counted); none for an embeddings request.
- **cached tokens**: at most the prompt's (charged).

A count over its bound is charged at the bound; the proxy logs it
``gateway.usage_implausible`` (request id, model, replica, reported and charged) and
counts it in ``llmgw_gateway_usage_implausible_total{model}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from gateway.stages.admission import (
    CHAT,
    EMBEDDINGS,
    MAX_INT,
    TEMPLATE_TOKENS,
    TEMPLATE_TOKENS_PER_MESSAGE,
    Request,
)
from gateway.table import ModelEntry, Replica

# The most any count of one request is charged when nothing tighter is known: an
# engine's int32, as ``max_tokens`` is bounded (admission.MAX_INT).
MAX_TOKENS = MAX_INT
# Tokens a chat template may add to a prompt beyond its texts and its per-message
# tokens: a system preamble, the instructions around tools' definitions.
PROMPT_SLACK = 1024


class Most(NamedTuple):
    """The most a request is charged: prompt tokens, completion tokens."""

    prompt: int
    completion: int


def _choices(body: Mapping[str, Any]) -> int:
    """The choices a request asks for (``n``, ``best_of``): 1 unless a whole number in
    bounds says more."""
    most = 1
    for name in ("n", "best_of"):
        value = body.get(name)
        if type(value) is int and most < value <= MAX_INT:
            most = value
    return most


def most(
    req: Request, body: Mapping[str, Any], body_bytes: int, m: ModelEntry, replica: Replica
) -> Most:
    """The most ``req`` (its parsed ``body`` of ``body_bytes``) served by ``replica`` of
    ``m`` may be charged (the module's policy)."""
    window = max(m.context_length, replica.context or 0)
    if req.images or req.media:
        prompt = window or MAX_TOKENS
    else:
        template = TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE * req.messages
        prompt = body_bytes + (template if req.kind == CHAT else 0) + PROMPT_SLACK
        if window:
            prompt = min(prompt, window)
    if req.kind == EMBEDDINGS:
        return Most(prompt, 0)
    if req.max_tokens is not None:
        completion = req.max_tokens
    elif m.max_output:
        completion = m.max_output
    else:
        completion = window or MAX_TOKENS
    return Most(prompt, completion * _choices(body))


def surely(
    req: Request, body_bytes: int, m: ModelEntry, replica: Replica, *, prompt: int, completion: int
) -> bool:
    """Whether ``prompt`` and ``completion`` are surely within ``most`` (True only if
    they are; False says nothing): the common answer, a text prompt within the body's
    bytes and the window and a completion within ``max_tokens``, without reading the
    body for its choices."""
    return (
        req.max_tokens is not None
        and completion <= req.max_tokens
        and req.kind != EMBEDDINGS
        and prompt <= body_bytes
        and prompt <= (max(m.context_length, replica.context or 0) or MAX_TOKENS)
    )


def held(prompt: int, cached: int, completion: int, most: Most) -> tuple[int, int, int]:
    """(prompt, cached, completion) held to ``most`` (cached to the prompt held)."""
    prompt = min(prompt, most.prompt)
    return prompt, min(cached, prompt), min(completion, most.completion)
