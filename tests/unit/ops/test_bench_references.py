"""The benchmarks compare the validated add with eventsourcing doing the same job.

Issue 30: the reference is ``Application.save`` (an aggregate recorded: event, mapping,
transcoding, insert), not the library's bare ``insert_events``, which stays as context.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from bench.events import append, append_floor

BENCHMARKS = Path(__file__).resolve().parents[3] / "docs" / "benchmarks" / "index.md"


def test_the_floor_bench_divides_by_application_save_and_keeps_the_insert_as_context() -> None:
    names = list(append_floor.SUBJECTS)
    assert names[0].startswith("eventsourcing Application.save") and "reference" in names[0]
    assert any(n.startswith("eventsourcing insert_events") and "context" in n for n in names)


def test_the_append_bench_states_its_ratio_against_application_save_first() -> None:
    source = inspect.getsource(append.run)
    reference = source.index("validated add against the reference")
    assert "best_app, best_ours" in source[reference : reference + 400]
    assert source.index("context, against the library's bare") > reference


def test_the_targets_name_application_save_as_the_reference() -> None:
    text = BENCHMARKS.read_text()
    (row,) = [line for line in text.splitlines() if line.startswith("| the validated add ahead")]
    assert "`Application.save`" in row and "insert_events" in row
