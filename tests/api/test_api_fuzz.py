"""Property-based fuzzing of the API from its own OpenAPI document (schemathesis).

Every operation but the event stream (which never ends; test_api_stream covers
it) gets a bounded number of generated requests, valid and invalid, with an
operator's token. No input may cause a server error or an answer the document
does not describe, and nothing invalid may reach the log: after each write,
replaying the whole log from scratch skips nothing. The document and the server
agree both ways (issue 11, item 10): what it calls invalid is refused
(``negative_data_rejection``) and what it calls valid is not refused with a 4xx
other than 401/403/404/409 (``positive_data_acceptance``), but for the few rules
it states in words (``within_stated_rules``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog import load_declared
from catalog.forms.durations import parse_duration
from events.database.connection import make_engine
from events.read.replay import Replayer
from events.storage.backends import open_log
from llmgw.api.rendering.schemas import HTTP_URL, NODE_LABEL, PRINTABLE
from tests.api.server import ApiServer, Tokens, running

if TYPE_CHECKING:
    import schemathesis
    from schemathesis import BaseSchema

pytestmark = pytest.mark.slow

# The document's printable strings carry their exact pattern (a class of 700 ranges) and
# name the rule in a format. Drawn from the pattern, Hypothesis builds the class code point
# by code point, over a second for each such field; drawn by category it is instant, and
# at Python 3.11's Unicode version the categories are the rule (catalog.forms.printable). The
# pattern still filters every value, so a generator that drifted could only draw less.
_PRINTABLE_CHARACTERS = st.characters(
    exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"), include_characters=" "
)
_NO_SPACE = st.characters(exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))
_WHITESPACE = st.text(st.sampled_from(" \t\u3000\x1f"), max_size=2)


# schemathesis is imported by the fixtures and the test that use it, not when the module is
# collected: every xdist worker collects every module, and schemathesis's import (its
# pytest plugin too, which pyproject's addopts turns off: nothing here uses it) cost each
# of the seven processes of `make test` about 0.5-1 s of CPU for one module's tests.
@functools.cache
def _formats() -> None:
    """schemathesis's formats for the document's own (once a process, before a schema)."""
    import schemathesis

    schemathesis.openapi.format(PRINTABLE, st.text(_PRINTABLE_CHARACTERS, max_size=40))
    schemathesis.openapi.format(
        HTTP_URL,
        st.builds(
            "".join,
            st.tuples(
                st.sampled_from(["http://", "https://"]),
                st.text(_PRINTABLE_CHARACTERS, min_size=1, max_size=30),
            ),
        ),
    )
    schemathesis.openapi.format(
        NODE_LABEL,
        st.builds("".join, st.tuples(_WHITESPACE, st.text(_NO_SPACE, max_size=20), _WHITESPACE)),
    )


EXAMPLES = 12  # per operation and generation mode: the whole module stays well under a minute
# The writes get more valid cases: the more that is accepted, the more the replay check below
# proves. Their invalid cases get the same as every other operation's: one accepted is
# already a failure (negative_data_rejection), so there is no replay for more of them to
# feed, and each costs far more to draw (schemathesis mutates the document's schema anew
# for every case: 60 of them were a third of the whole module's CPU).
MORE = {
    ("POST", "/v1/catalog/models"): 60,
    ("PUT", "/v1/nodes/{name}"): 30,
    ("POST", "/v1/usage"): 30,
}


def _checks() -> list[Callable[..., Any]]:
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        negative_data_rejection,
        positive_data_acceptance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    return [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        negative_data_rejection,
        positive_data_acceptance,
    ]


@pytest.fixture(scope="module")
def fuzzed(module_sqlite_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_sqlite_url, tokens=tokens)) as server:
        yield server


@pytest.fixture(scope="module")
def replay_check(fuzzed: ApiServer) -> LogReplayCheck:
    return LogReplayCheck(fuzzed)


@pytest.fixture(scope="module")
def api_schema(fuzzed: ApiServer, tokens: Tokens) -> BaseSchema:
    # The operator's token through the document's own security scheme: generated
    # requests carry it, and invalid ones are invalid for some other reason.
    import schemathesis

    _formats()
    config = schemathesis.Config.from_dict(
        {"auth": {"openapi": {"bearer": {"bearer": tokens.operator}}}}
    )
    return schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.json", config=config)


# Each operation is its own test (and xdist spreads them); the guard below keeps the
# list equal to what the document describes, so a new route cannot go unfuzzed.
OPERATIONS = [
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("GET", "/v1/fleet"),
    ("GET", "/v1/diff"),
    ("GET", "/v1/catalog"),
    ("GET", "/v1/catalog/{name}"),
    ("GET", "/v1/catalog/models/{name}"),
    ("POST", "/v1/catalog/models"),
    ("PUT", "/v1/catalog/models/{name}"),
    ("DELETE", "/v1/catalog/models/{name}"),
    ("GET", "/v1/events"),
    ("PUT", "/v1/nodes/{name}"),
    ("GET", "/v1/nodes"),
    ("GET", "/v1/placements"),
    ("POST", "/v1/nodes/{name}/cordon"),
    ("POST", "/v1/nodes/{name}/drain"),
    ("POST", "/v1/nodes/{name}/uncordon"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("POST", "/v1/signals"),
    ("GET", "/v1/autoscale"),
    # The tokens' hashes a gateway verifies by (the operator may read them too).
    ("GET", "/v1/gateway/client-tokens"),
    ("GET", "/v1/gateway/reader-tokens"),
    # Chunks of the client tokens' shared allowances a gateway draws and gives back.
    ("POST", "/v1/gateway/allowances"),
    # The usage ledger: a gateway's flush in, the totals out.
    ("POST", "/v1/usage"),
    ("GET", "/v1/usage"),
]
NOT_FUZZED = {("GET", "/v1/events/stream")}  # never ends; see test_api_stream
# Invalid input is generated only where there is input: a path, query or body.
TAKE_INPUT = {op for op in OPERATIONS if "{" in op[1] or op[0] != "GET"} | {
    ("GET", "/v1/events"),
    ("GET", "/v1/placements"),
    ("GET", "/v1/diff"),
    ("GET", "/v1/usage"),
}
# The modes by schemathesis's own names (GenerationMode's values), not imported at collection.
CASES = [
    pytest.param(method, path, mode, id=f"{method} {path} {mode}")
    for method, path in OPERATIONS
    for mode in ("positive", "negative")
    if mode == "positive" or (method, path) in TAKE_INPUT
]


def test_every_operation_of_the_document_is_fuzzed(api_schema: BaseSchema) -> None:
    # An Err (an operation the document describes wrongly) has no ok(): the test fails there.
    results = api_schema.get_all_operations()
    described = {
        (op.method.upper(), op.path)
        for op in (result.ok() for result in results)  # type: ignore[union-attr]  # see above
    }
    assert described == set(OPERATIONS) | NOT_FUZZED


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_no_input_makes_the_api_fail_or_write_an_invalid_model(
    method: str,
    path: str,
    mode: str,
    api_schema: BaseSchema,
    replay_check: LogReplayCheck,
) -> None:
    from schemathesis import GenerationMode

    generation_mode = GenerationMode(mode)
    checks = _checks()
    operation = api_schema[path][method]

    strategy = operation.as_strategy(generation_mode=generation_mode)
    if generation_mode is GenerationMode.POSITIVE:
        strategy = strategy.map(within_stated_rules)

    @given(case=strategy)
    @settings(
        max_examples=MORE.get((method, path), EXAMPLES) if mode == "positive" else EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: schemathesis.Case[Any]) -> None:
        # Not schemathesis's 10 s: on a loaded 2-core CI machine an accepted write can take
        # longer, and the verdict must not depend on the machine's speed.
        response = case.call(timeout=300)
        case.validate_response(response, checks=checks)
        if method in ("POST", "DELETE", "PUT") and response.status_code < 300:
            replay_check.assert_log_replays_cleanly()

    fuzz()


def within_stated_rules(case: schemathesis.Case[Any]) -> schemathesis.Case[Any]:
    """A valid case brought within the rules the document states in words.

    A JSON Schema cannot compare one value with another, bound a sum, or tell 2.0 from
    2, so these few rules are in the document's descriptions and answered with a 422
    naming the field: a body's name is the path's; aliases and profile names are unique
    regardless of case, and no alias is the model's own name; scaling.max is at least
    scaling.min; max_output is at most context_length; nodes x gpus_per_node equals
    tp x pp; a duration written in parts is at most what a timedelta holds;
    ``gpus_reserved`` is at most ``gpus``; a replica is reported once; and an integer
    is written as one; a signal window ends after it starts, within an hour, and has no
    more errors than requests; a usage row's minute is a whole minute in UTC, its served
    and replica both given or both null, its outcomes add up to its requests, its cached
    tokens are at most its prompt tokens and its estimated at most its requests, and
    ``since`` is an ISO-8601 time. Everything else the document calls valid must be accepted: that
    is what ``positive_data_acceptance`` checks, at full strength, on every other field
    and operation (and the negative cases still reach every rule).
    """
    body, name = case.body, (case.path_parameters or {}).get("name")
    if case.path == "/v1/usage" and case.query and "since" in case.query:
        case.query["since"] = "2026-12-07T04:05:00Z"
    if not isinstance(body, dict):
        return case
    body = case.body = _integers(body)
    if case.path == "/v1/catalog/models/{name}" and case.method.upper() == "PUT":
        body["name"] = name
    if case.path == "/v1/nodes/{name}":
        if "name" in body:
            body["name"] = name
        gpus = body.get("gpus", 0)
        if isinstance(gpus, int) and isinstance(body.get("gpus_reserved"), int):
            body["gpus_reserved"] = min(body["gpus_reserved"], gpus)
        if isinstance(body.get("replicas"), list):
            once = {(r.get("model"), r.get("replica")): r for r in body["replicas"]}
            body["replicas"] = list(once.values())
    if case.path == "/v1/signals":
        for window in body.get("windows", []):
            if isinstance(window, dict):
                _window_within_rules(window)
    if case.path == "/v1/usage":
        for row in body.get("rows", []):
            if isinstance(row, dict):
                _usage_row_within_rules(row)
    if case.path.startswith("/v1/catalog/models"):
        for definition in body.get("models", [body]):
            if isinstance(definition, dict):
                _definition_within_rules(definition)
    return case


def _window_within_rules(window: dict[str, Any]) -> None:
    """A signal window's end after its start by at most an hour, its errors within its
    requests (the two rules of ``autoscale.signals`` no schema can say)."""
    window["start"], window["end"] = "2026-12-04T10:00:00Z", "2026-12-04T10:00:05Z"
    if isinstance(window.get("errors"), int) and isinstance(window.get("requests"), int):
        window["errors"] = min(window["errors"], window["requests"])
    elif "errors" in window:
        window["errors"] = 0


def _usage_row_within_rules(row: dict[str, Any]) -> None:
    """A usage row's rules that no schema can say (events.core.usage.check_usage)."""
    row["minute"] = "2026-12-07T04:05:00Z"
    if (row.get("served") is None) != (row.get("replica") is None):
        row["served"] = row["replica"] = None
    requests = row.get("requests", 1)
    row["outcomes"] = {"ok": requests} if isinstance(requests, int) else {}
    prompt = row.get("prompt_tokens", 0)
    if isinstance(row.get("cached_tokens"), int) and isinstance(prompt, int):
        row["cached_tokens"] = min(row["cached_tokens"], prompt)
    if isinstance(row.get("estimated"), int) and isinstance(requests, int):
        row["estimated"] = min(row["estimated"], requests)


def _integers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integers(v) for v in value]
    return value


def _definition_within_rules(definition: dict[str, Any]) -> None:
    name = str(definition.get("name", ""))
    taken = {name.casefold()}
    aliases = []
    for alias in definition.get("aliases", []):
        if alias.casefold() not in taken:
            taken.add(alias.casefold())
            aliases.append(alias)
    if "aliases" in definition:
        definition["aliases"] = aliases
    scaling = definition.get("scaling")
    if isinstance(scaling, dict) and scaling.get("max", 0) != 0:
        # A negative min counts as 0 (catalog.definition.model_rules.normalize).
        scaling["max"] = max(scaling["max"], scaling.get("min", 0), 0)
    if definition.get("context_length", 0) and "max_output" in definition:
        definition["max_output"] = min(definition["max_output"], definition["context_length"])
    profiles, seen = [], set()
    for profile in definition.get("profiles", []):
        if str(profile.get("name")).casefold() in seen:
            continue
        seen.add(str(profile.get("name")).casefold())
        # nodes 1, pp 1 and gpus_per_node from tp: the shard arithmetic adds up.
        for key in ("nodes", "pp", "gpus_per_node"):
            profile.pop(key, None)
        profiles.append(profile)
    definition["profiles"] = profiles
    slo = definition.get("slo")
    places = [(slo, key) for key in ("ttft_p99", "tpot_p99")] if isinstance(slo, dict) else []
    places += [(p, "startup_timeout") for p in profiles]
    for holder, key in places:
        if key in holder:
            try:
                parse_duration(holder[key])
            except ValueError as exc:
                if "too large" in str(exc):
                    holder[key] = "90s"


class LogReplayCheck:
    """Replay of the fuzzed server's log, advanced by what each accepted write appended.

    Replaying the whole log after every accepted write costs time quadratic in the
    accepted writes (small at today's example counts, but it grows with them). Replay
    applies one event at a time in log order (events.read.replay), so the state a check
    leaves is where a full replay would be at that position, and the next check
    applies only the events after it. The events are still read from the server's own
    database, and the skips asserted are all of them since position 0, so every check
    after a skipped event fails too, as a full replay would.
    """

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        # The server never rewrites its configuration: what it declared at start-up is
        # what a full replay at any later check would start from.
        self.replayer = Replayer.start(load_declared(Path(server.env["LLMGW_CONFIG"])))

    def assert_log_replays_cleanly(self) -> None:
        engine = make_engine(self.server.db_url)
        try:
            self.replayer.apply_all(open_log(engine).read(after=self.replayer.position))
        finally:
            engine.dispose()
        skipped = self.replayer.skipped
        assert skipped == [], [s.to_json() for s in skipped]
