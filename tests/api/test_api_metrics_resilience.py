"""``/metrics`` exports each model's resilience after a round the server's scheduler ran."""

from __future__ import annotations

from llmgw.api.telemetry.metrics import Metrics
from scheduler.daemon.round_runner import RoundOutcome
from scheduler.planner.fleet.placements import Plan, Resilience


def _outcome(*figures: Resilience) -> RoundOutcome:
    plan = Plan(keep=(), place=(), remove=(), unplaced=(), resilience=figures)
    return RoundOutcome(plan=plan, catalog_position=1, nodes=(), round_id=None, duration_ms=1.0)


def test_the_last_round_s_resilience_is_exported_and_a_removed_model_disappears() -> None:
    metrics = Metrics()
    metrics.observe_round(_outcome(Resilience("llama", 2, 2, "zone", 1), Resilience("trial", 1, 1)))
    metrics.observe_round(_outcome(Resilience("llama", 2, 2, "zone", 2)))

    page = metrics.render().decode()

    assert 'llmgw_model_resilience_nodes{model="llama"} 2.0' in page
    assert 'llmgw_model_resilience_domains{label="zone",model="llama"} 2.0' in page
    assert 'model="trial"' not in page
