"""The gateway's Prometheus metrics, in a registry of its own (``GET /metrics``).

Per model: ``llmgw_gateway_requests_total{model,outcome}``, ``llmgw_gateway_inflight{model}``,
the ``llmgw_gateway_ttft_seconds`` and ``llmgw_gateway_tpot_seconds`` histograms,
``llmgw_gateway_fallbacks_total{model,to}`` and
``llmgw_gateway_refusals_total{model,reason}``,
``llmgw_gateway_prefix_predicted_tokens_total{model}`` (the ``prefix`` profile's guesses,
beside the engines' own counts in ``GET /routing``); per client token and the model that
served, ``llmgw_gateway_tokens_total{client,model,kind}`` (kind: ``prompt``, ``cached``,
``completion``; the engine's own ``usage``, cached being part of prompt, held to what
the request could use: ``llmgw_gateway_usage_implausible_total{model}`` counts the
answers whose counts were held, gateway.stages.plausible); and the
control plane's reachability (``llmgw_gateway_control_plane_up``,
``llmgw_gateway_table_age_seconds``, ``llmgw_gateway_control_plane_switches_total{server}``).
Label children are looked up once per model and kept: a labelled look-up costs more
than the increment.

With ``llmgw gateway --workers N`` (``multiprocess``), each worker writes its figures to
files in a directory the workers share (prometheus_client's multiprocess mode), and any
worker answering a scrape reads them all: counters and histograms are summed over the
workers (dead ones included, so totals never go back), ``inflight`` is summed over the
live workers, ``ready_replicas`` is the highest any live worker's table holds (each
follows the control plane on its own, so they agree but for a moment), and
``control_plane_up`` / ``table_age_seconds`` are those of the worker that answered.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# TTFT from 10 ms to a minute; TPOT from 1 ms to 2 s.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
QUEUE_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2)


@dataclass(slots=True)
class _PerModel:
    inflight: Gauge
    ttft: Histogram
    tpot: Histogram


class _Value:
    """A gauge only the answering worker reports (multiprocess mode): set, then read at
    the scrape by ``_Local``."""

    def __init__(self) -> None:
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = value


class _Local(Collector):
    def __init__(self, up: _Value, age: _Value) -> None:
        self.up, self.age = up, age

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "llmgw_gateway_control_plane_up",
            "1 when the last sync with the control plane succeeded (of the worker that "
            "answered); 0 while serving from the last known routing table",
            value=self.up.value,
        )
        yield GaugeMetricFamily(
            "llmgw_gateway_table_age_seconds",
            "Seconds since the routing table was last confirmed by the control plane (of "
            "the worker that answered)",
            value=self.age.value,
        )


class Metrics:
    """``multiprocess``: this process is one of several workers whose figures a scrape
    of any of them shows together (the caller has pointed prometheus_client at the
    shared directory before this is made; see ``gateway.main``)."""

    def __init__(self, multiprocess: bool = False) -> None:
        self.multiprocess = multiprocess
        # Where the figures are written; ``registry`` is what a scrape reads.
        own = CollectorRegistry()
        r = own
        self.requests = Counter(
            "llmgw_gateway_requests",
            "Requests by the model asked for and outcome (ok, refused, failed, "
            "unavailable, cancelled)",
            ["model", "outcome"],
            registry=r,
        )
        self.inflight = Gauge(
            "llmgw_gateway_inflight",
            "Requests in flight by model",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.ttft = Histogram(
            "llmgw_gateway_ttft_seconds",
            "Time to first token (streams) or to the whole answer, by the model that served",
            ["model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "llmgw_gateway_tpot_seconds",
            "Time per output token after the first (streams), by the model that served",
            ["model"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.fallbacks = Counter(
            "llmgw_gateway_fallbacks",
            "Requests served by a fallback, by the model asked for and the one that served",
            ["model", "to"],
            registry=r,
        )
        self.refusals = Counter(
            "llmgw_gateway_refusals",
            "Requests refused by admission, by model and reason",
            ["model", "reason"],
            registry=r,
        )
        self.queue_length = Gauge(
            "llmgw_gateway_queue_length",
            "Requests waiting for a free slot of a full model, by model and priority class",
            ["model", "priority"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.queue_wait = Histogram(
            "llmgw_gateway_queue_wait_seconds",
            "Time a request waited in its model's queue (queued requests only), by model "
            "and priority class",
            ["model", "priority"],
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "llmgw_gateway_retries",
            "Attempts that failed before the first byte and were retried elsewhere",
            ["model"],
            registry=r,
        )
        self.tokens = Counter(
            "llmgw_gateway_tokens",
            "Tokens the engines counted (their usage), by client token, the model that "
            "served and kind: prompt, cached (the part of prompt the engine reused), "
            "completion",
            ["client", "model", "kind"],
            registry=r,
        )
        self.usage_implausible = Counter(
            "llmgw_gateway_usage_implausible",
            "Answers whose token counts (the engine's usage, else the gateway's count) were "
            "above what the request could use and were charged at that bound "
            "(gateway.stages.plausible), by the model that served",
            ["model"],
            registry=r,
        )
        self.prefix_predicted_tokens = Counter(
            "llmgw_gateway_prefix_predicted_tokens",
            "Prompt tokens the prefix router guessed the engine had cached, by model "
            "(checked answers only: beside the engines' own cached tokens)",
            ["model"],
            registry=r,
        )
        self.server_switches = Counter(
            "llmgw_gateway_control_plane_switches",
            "Moves from one control-plane replica to the next after it failed (no "
            "connection, no answer in time, a 5xx), by the server moved to",
            ["server"],
            registry=r,
        )
        self.control_plane_up: Gauge | _Value
        self.table_age: Gauge | _Value
        if multiprocess:
            from prometheus_client import multiprocess as mp

            self.control_plane_up, self.table_age = _Value(), _Value()
            self.registry = CollectorRegistry()
            mp.MultiProcessCollector(self.registry)  # type: ignore[no-untyped-call]
            self.registry.register(_Local(self.control_plane_up, self.table_age))
        else:
            self.registry = own
            self.control_plane_up = Gauge(
                "llmgw_gateway_control_plane_up",
                "1 when the last sync with the control plane succeeded; 0 while serving "
                "from the last known routing table",
                registry=r,
            )
            self.table_age = Gauge(
                "llmgw_gateway_table_age_seconds",
                "Seconds since the routing table was last confirmed by the control plane",
                registry=r,
            )
        self.ready_replicas = Gauge(
            "llmgw_gateway_ready_replicas",
            "Ready replicas in the routing table, by model",
            ["model"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self._models: dict[str, _PerModel] = {}
        self._requests: dict[tuple[str, str], Counter] = {}
        self._tokens: dict[tuple[str, str], tuple[Counter, Counter, Counter]] = {}
        self._prefix: dict[str, Counter] = {}

    def used(self, client: str, model: str, prompt: int, cached: int, completion: int) -> None:
        """One answer's usage in ``tokens{client,model,kind}`` (children kept per pair)."""
        found = self._tokens.get((client, model))
        if found is None:
            found = self._tokens[client, model] = (
                self.tokens.labels(client, model, "prompt"),
                self.tokens.labels(client, model, "cached"),
                self.tokens.labels(client, model, "completion"),
            )
        # (Each increment takes the counter's lock: none for nothing to add.)
        if prompt:
            found[0].inc(prompt)
        if cached:
            found[1].inc(cached)
        if completion:
            found[2].inc(completion)

    def request(self, model: str, outcome: str) -> Counter:
        """``requests{model,outcome}``'s child, looked up once per pair: ``labels`` took
        1% of a request's CPU (it validates and joins the labels under a lock)."""
        found = self._requests.get((model, outcome))
        if found is None:
            found = self._requests[model, outcome] = self.requests.labels(model, outcome)
        return found

    def implausible(self, model: str) -> Counter:
        """``usage_implausible{model}``'s child (rare: looked up each time)."""
        return self.usage_implausible.labels(model)

    def prefix_predicted(self, model: str) -> Counter:
        found = self._prefix.get(model)
        if found is None:
            found = self._prefix[model] = self.prefix_predicted_tokens.labels(model)
        return found

    def model(self, name: str) -> _PerModel:
        found = self._models.get(name)
        if found is None:
            found = self._models[name] = _PerModel(
                self.inflight.labels(name), self.ttft.labels(name), self.tpot.labels(name)
            )
        return found
