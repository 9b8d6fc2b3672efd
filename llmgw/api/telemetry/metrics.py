"""Prometheus metrics (``GET /metrics``), in a registry of the app's own.

A registry per app rather than the process-wide default, so two apps in one
process (tests) do not collide, and the page carries only what is named here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from declared.reload import Outcome
from scheduler.daemon.round_runner import RoundOutcome
from scheduler.planner.fleet.placements import Plan

# Every name here is a classic one, so the page is the 0.0.4 text format that every
# Prometheus (and every other scraper) reads; say so rather than the newest version.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# ``*_created`` series (a timestamp per counter) double the page for nothing a
# dashboard of this service uses.
disable_created_metrics()  # type: ignore[no-untyped-call]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "llmgw_http_requests",
            "HTTP requests answered, by route template, method and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "llmgw_http_request_duration_seconds",
            "Time to answer a request (for a stream: until it closed).",
            ["method", "route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=r,
        )
        self.events_appended = Counter(
            "llmgw_catalog_events_appended",
            "Catalog events appended through this server, by type.",
            ["type"],
            registry=r,
        )
        self.commands_repeated = Counter(
            "llmgw_catalog_commands_repeated",
            "Commands answered from an earlier attempt with the same idempotency key.",
            registry=r,
        )
        self.events_skipped = Gauge(
            "llmgw_catalog_events_skipped",
            "Events this server's replay skipped (since the snapshot it started from); "
            "`llmgw replay` names them.",
            registry=r,
        )
        self.catalog_position = Gauge(
            "llmgw_catalog_position", "The log position this server's catalog is at.", registry=r
        )
        self.change_notifications = Gauge(
            "llmgw_api_change_notifications",
            "1 while this server listens for PostgreSQL's notifications of writes (LISTEN "
            "llmgw_changes: its event streams and token checks are woken at once); 0 while it "
            "polls alone (SQLite, or the listening connection lost).",
            registry=r,
        )
        self.tokens = Gauge(
            "llmgw_api_tokens",
            "Bearer tokens this server accepts, by where they come from: the database, or "
            "the auth file and LLMGW_TOKENS read at start (configured).",
            ["source"],
            registry=r,
        )
        self.node_reports = Counter(
            "llmgw_node_reports", "Node reports recorded through this server.", registry=r
        )
        self.node_report_commits = Counter(
            "llmgw_node_report_commits",
            "Transactions that recorded node reports: reports that arrive together share one.",
            registry=r,
        )
        self.node_heartbeats = Counter(
            "llmgw_node_heartbeats",
            "Heartbeats that renewed a node's lease (nothing changed since its last report).",
            registry=r,
        )
        self.node_heartbeats_refused = Counter(
            "llmgw_node_heartbeats_refused",
            "Heartbeats naming a report this server does not hold: asked for the full report.",
            registry=r,
        )
        self.node_lease_writes = Counter(
            "llmgw_node_lease_writes",
            "Statements that wrote node leases (one a second at most, however many nodes).",
            registry=r,
        )
        self.agent_switches = AgentSwitches()
        r.register(self.agent_switches)
        self.round_seconds = Histogram(
            "llmgw_placement_round_duration_seconds",
            "Duration of the placement rounds run by this server's scheduler.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.replicas_placed = Counter(
            "llmgw_placement_replicas_placed",
            "Replicas placed by this server's scheduler.",
            registry=r,
        )
        self.replicas_removed = Counter(
            "llmgw_placement_replicas_removed",
            "Replicas removed by this server's scheduler.",
            registry=r,
        )
        self.replicas_unplaced = Gauge(
            "llmgw_placement_replicas_unplaced",
            "Replicas that fit nowhere in the last round this server ran.",
            registry=r,
        )
        self.fallback_rounds = Counter(
            "llmgw_placement_fallback_rounds",
            "Rounds whose new replicas were placed by a baseline (best fit, first fit) "
            "because it placed more GPUs than the planner's own spread layout.",
            ["strategy"],
            registry=r,
        )
        self.mass_loss_held = Gauge(
            "llmgw_placement_mass_loss_held_replicas",
            "Replicas kept on nodes that look lost, because so many look lost at once that "
            "the control plane doubts itself (mass-loss protection), in the last round.",
            registry=r,
        )
        self.resilience_nodes = Gauge(
            "llmgw_model_resilience_nodes",
            "The fewest nodes whose loss leaves the model no replica (0: none placed), "
            "after the last round this server's scheduler ran.",
            ["model"],
            registry=r,
        )
        self.resilience_domains = Gauge(
            "llmgw_model_resilience_domains",
            "For a model with placement.spread_by: the fewest values of that label whose "
            "loss leaves it no replica.",
            ["model", "label"],
            registry=r,
        )
        self.leader = Gauge(
            "llmgw_scheduler_leader",
            "1 while this server's scheduler leads (places), else 0 (also without a scheduler).",
            registry=r,
        )
        self.leader.set(0)
        self.leadership_epoch = Gauge(
            "llmgw_scheduler_leadership_epoch",
            "The epoch of the leadership lease this server's scheduler holds (PostgreSQL), "
            "0 while it does not lead; it grows by one at every change of leader.",
            registry=r,
        )
        self.leadership_epoch.set(0)
        self.declared_refused = Gauge(
            "llmgw_declared_catalog_refused",
            "1 while the declared catalog file as it is now was refused (the previous "
            "catalog keeps running; /readyz says where and why), else 0.",
            registry=r,
        )
        self.declared_reloads = Counter(
            "llmgw_declared_catalog_reloads",
            "Changes of the declared catalog file this server looked at, by outcome "
            "(applied, refused, unchanged).",
            ["outcome"],
            registry=r,
        )
        # Set once an app has registered the cluster gauges (llmgw.api.runtime.fleet_gauges) here.
        self.fleet = False

    def observe_round(self, outcome: RoundOutcome) -> None:
        self.round_seconds.observe(outcome.duration_ms / 1000)
        self.replicas_placed.inc(len(outcome.plan.place))
        self.replicas_removed.inc(len(outcome.plan.remove))
        self.replicas_unplaced.set(len(outcome.plan.unplaced))
        if outcome.plan.strategy != "policy":
            self.fallback_rounds.labels(strategy=outcome.plan.strategy).inc()
        self.mass_loss_held.set(held_by_mass_loss(outcome.plan))
        # Cleared first: a model removed from the catalog must not linger at its last figure.
        self.resilience_nodes.clear()
        self.resilience_domains.clear()
        for r in outcome.plan.resilience:
            self.resilience_nodes.labels(model=r.model).set(r.nodes)
            if r.label is not None and r.domains is not None:
                self.resilience_domains.labels(model=r.model, label=r.label).set(r.domains)

    def observe_declared(self, outcome: Outcome) -> None:
        self.declared_reloads.labels(outcome.result).inc()
        self.declared_refused.set(1 if outcome.refusal is not None else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class AgentSwitches(Collector):
    """``llmgw_agent_control_plane_switches_total{node}``: how many times each node's agent
    moved to the next control-plane server, as the last report this server recorded said
    (``server_switches``). A counter kept by the agent, shown here: each replica knows only
    the reports it received, so the highest value across replicas is the current one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # One entry per node that reported a count: as many as the nodes the store holds.
        self._counts: dict[str, int] = {}

    def saw(self, node: str, count: int) -> None:
        with self._lock:
            self._counts[node] = count

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield self._family()  # the family without samples (the metrics reference page)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = self._family()
        with self._lock:
            counts = sorted(self._counts.items())
        for node, count in counts:
            family.add_metric([node], count)
        yield family

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "llmgw_agent_control_plane_switches",
            "Times each node's agent moved to the next control-plane server, as its last "
            "report to this server said (take the max across replicas).",
            labels=["node"],
        )


def held_by_mass_loss(plan: Plan) -> int:
    """Replicas a round kept on lost nodes only because of mass-loss protection."""
    if not plan.mass_loss:
        return 0
    lost = set(plan.lost_nodes)
    return sum(1 for p in plan.keep if lost.intersection(p.nodes))
