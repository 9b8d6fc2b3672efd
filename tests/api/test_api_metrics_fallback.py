"""``/metrics`` counts the rounds a baseline placed instead of the spread layout (issue 29):
a fallback is never silent."""

from __future__ import annotations

from llmgw.api.telemetry.metrics import Metrics
from scheduler.daemon.round_runner import RoundOutcome
from scheduler.planner.fleet.placements import Plan


def _outcome(strategy: str) -> RoundOutcome:
    plan = Plan(keep=(), place=(), remove=(), unplaced=(), strategy=strategy)
    return RoundOutcome(plan=plan, catalog_position=1, nodes=(), round_id=None, duration_ms=1.0)


def test_fallback_rounds_are_counted_by_strategy_and_policy_rounds_are_not() -> None:
    metrics = Metrics()
    metrics.observe_round(_outcome("policy"))
    metrics.observe_round(_outcome("best fit"))
    metrics.observe_round(_outcome("best fit"))
    metrics.observe_round(_outcome("first fit"))

    page = metrics.render().decode()

    assert 'llmgw_placement_fallback_rounds_total{strategy="best fit"} 2.0' in page
    assert 'llmgw_placement_fallback_rounds_total{strategy="first fit"} 1.0' in page
    assert 'strategy="policy"' not in page
