"""The planner gives exactly the pinned plans (``reference_rounds``): a change that makes it
faster must not make it different."""

from __future__ import annotations

import json
from functools import cache

import pytest

from tests.unit.scheduler.reference_rounds import REFERENCE, Round, digest, scenarios

EXPECTED: dict[str, str] = json.loads(REFERENCE.read_text())

# The scenarios are built once per process (``rounds``, over a minute of CPU): one xdist
# worker runs them all, or each worker would build them again.
pytestmark = [
    pytest.mark.xdist_group("tests/unit/scheduler/test_plan_reference.py"),
    pytest.mark.slow,
]


@cache
def rounds() -> dict[str, Round]:
    # Built on first use, not at collection: the scenarios plan rounds to get their inputs.
    return dict(scenarios())


def test_every_pinned_round_is_planned() -> None:
    assert sorted(rounds()) == sorted(EXPECTED)


@pytest.mark.parametrize("label", sorted(EXPECTED))
def test_plan_is_the_pinned_one(label: str) -> None:
    assert digest(rounds()[label].plan()) == EXPECTED[label], (
        f"{label}: the plan differs from the pinned one (the planner before issue 13, "
        "re-pinned with the spread repair of issue 15); see "
        "tests/unit/scheduler/reference_rounds.py"
    )
