"""The placement generation as a server tells it (a heartbeat answer's third word, a
report answer's ``placements_generation``): a number, or nothing from a server of before
generations, whatever else the answer holds."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agent.runtime import _generation


@given(st.integers(min_value=0, max_value=10**19))
def test_a_generation_told_as_a_word_or_a_field_is_read_as_that_number(told: int) -> None:
    assert _generation(str(told)) == told
    assert _generation({"placements_generation": told, "report_id": "x.1"}) == told


@given(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(max_value=-1),
        st.floats(),
        st.text().filter(lambda t: not (t.isascii() and t.isdigit() and len(t) <= 20)),
        st.lists(st.integers()),
    )
)
def test_anything_else_is_no_generation_and_the_agent_reads_its_placements(told: Any) -> None:
    assert _generation(told) is None
    assert _generation({"placements_generation": told}) is None
    assert _generation({}) is None  # a server of before generations
