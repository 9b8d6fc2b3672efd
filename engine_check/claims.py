"""Each claim a model makes, judged from what an engine answered. Pure.

A verdict is ``confirmed`` (the engine did it), ``refused`` (it did not, or
answered something else: the line says what), or ``unchecked`` (this tool has no
probe for the claim, or could not reach anything to ask). Only a refusal fails
the check: an unchecked claim is said, not counted against the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from catalog.forms.text import shown

CONFIRMED = "confirmed"
REFUSED = "refused"
UNCHECKED = "unchecked"

# How much of an engine's answer a verdict quotes.
MAX_QUOTE = 300

# The probes' requests. The tool is one a model cannot answer without: a plain
# reply is a model that did not call it.
TOOL_NAME = "get_weather"
CITY = "Paris"
TOOLS_REQUEST: dict[str, Any] = {
    "messages": [
        {
            "role": "user",
            "content": f"What is the weather in {CITY} right now? Use the {TOOL_NAME} tool.",
        }
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": TOOL_NAME,
                "description": "The current weather in a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "description": "the city"}},
                    "required": ["city"],
                },
            },
        }
    ],
    "tool_choice": "auto",
    "max_tokens": 64,
    "temperature": 0,
    "seed": 0,
}
EMBEDDINGS_REQUEST: dict[str, Any] = {"input": "engine-check"}


@dataclass(frozen=True, slots=True)
class Answer:
    """What an engine answered one request: its status (None: no answer at all, and
    ``text`` says why), the parsed JSON body (None when it was not JSON) and the text."""

    status: int | None
    body: Any
    text: str


@dataclass(frozen=True, slots=True)
class Verdict:
    claim: str
    outcome: str
    detail: str

    @property
    def failed(self) -> bool:
        return self.outcome == REFUSED

    def to_json(self) -> dict[str, Any]:
        return {"claim": self.claim, "outcome": self.outcome, "detail": self.detail}

    def line(self) -> str:
        """One line for a terminal: whatever an engine said is escaped (catalog.forms.text)."""
        return f"{self.claim:<15} {self.outcome:<10} {shown(self.detail)}"


def quote(answer: Answer) -> str:
    """What the engine answered, short: its status and the start of its body."""
    if answer.status is None:
        return f"no answer: {answer.text}"
    text = answer.text.strip()
    if len(text) > MAX_QUOTE:
        text = text[:MAX_QUOTE] + "..."
    return f"HTTP {answer.status}: {text}" if text else f"HTTP {answer.status} with no body"


def _first_message(body: Any) -> dict[str, Any] | None:
    if not isinstance(body, dict):
        return None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None


def judge_tools(answer: Answer) -> Verdict:
    """``tools``: confirmed only when the answer calls the tool it was given."""
    message = _first_message(answer.body) if answer.status == 200 else None
    if message is None:
        return Verdict("tools", REFUSED, f"no chat completion; the engine answered {quote(answer)}")
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        names = [
            c.get("function", {}).get("name")
            for c in calls
            if isinstance(c, dict) and isinstance(c.get("function"), dict)
        ]
        if TOOL_NAME in names:
            call = next(c for c in calls if c.get("function", {}).get("name") == TOOL_NAME)
            arguments = call["function"].get("arguments")
            # An engine that constrains its output with a grammar makes even random
            # weights emit a well-formed call; a model that can use tools also fills in
            # the city the prompt names.
            if CITY.lower() in _city(arguments).lower():
                return Verdict(
                    "tools", CONFIRMED, f"called {TOOL_NAME} with {_short(arguments)} as asked"
                )
            return Verdict(
                "tools",
                REFUSED,
                f"called {TOOL_NAME} with {_short(arguments)}, not with the city the prompt "
                f"names ({CITY})",
            )
        return Verdict(
            "tools", REFUSED, f"called {_short(names)}, not the {TOOL_NAME} it was given"
        )
    content = message.get("content")
    return Verdict(
        "tools",
        REFUSED,
        f"answered without tool_calls to a prompt that needs {TOOL_NAME}: "
        f"content {_short(content)}",
    )


def _city(arguments: Any) -> str:
    """The ``city`` argument of a call (arguments are a JSON string in the OpenAI API)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return ""
    city = arguments.get("city") if isinstance(arguments, dict) else None
    return city if isinstance(city, str) else ""


def judge_embeddings(answer: Answer) -> Verdict:
    """``embeddings``: confirmed when /v1/embeddings answers a vector of numbers."""
    data = answer.body.get("data") if isinstance(answer.body, dict) else None
    if answer.status == 200 and isinstance(data, list) and data and isinstance(data[0], dict):
        vector = data[0].get("embedding")
        if (
            isinstance(vector, list)
            and vector
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in vector)
        ):
            return Verdict(
                "embeddings", CONFIRMED, f"/v1/embeddings answered {len(vector)} numbers"
            )
    return Verdict("embeddings", REFUSED, f"/v1/embeddings: the engine answered {quote(answer)}")


def judge_context(declared: int, effective: int | None, detail: str, source: str) -> Verdict:
    """``context_length``: confirmed when one request may use at least what the catalog says."""
    if effective is None:
        return Verdict(
            "context_length", UNCHECKED, f"{source} did not say what one request may use"
        )
    said = detail or f"{effective} tokens a request"
    if effective >= declared:
        return Verdict(
            "context_length", CONFIRMED, f"{said} >= context_length {declared} ({source})"
        )
    return Verdict(
        "context_length",
        REFUSED,
        f"{said} < context_length {declared} ({source}): a request may use {effective} tokens",
    )


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= MAX_QUOTE else text[:MAX_QUOTE] + "..."


def exit_status(verdicts: list[Verdict]) -> int:
    """0 when nothing was refused, 1 otherwise."""
    return 1 if any(v.failed for v in verdicts) else 0
