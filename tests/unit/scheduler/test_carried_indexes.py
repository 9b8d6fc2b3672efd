"""A round's indexes patched from the round before's are the indexes built afresh.

When a round keeps the same placements less a few (a node lost), the spread counts
(``SpreadMemo``) and the defragmentation's index (``IndexMemo``) are the round before's
with those few taken out; they must be exactly what counting the rest gives.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.planner.defrag import IndexMemo, _domains, _Index
from scheduler.planner.fleet.placements import Demand, Placement, removed_from
from scheduler.planner.spread import Spread, SpreadMemo
from tests.unit.scheduler.placement_builders import node, profile

NODES = {f"n{i}": node(f"n{i}", labels={"zone": "eu" if i % 3 else "us"}) for i in range(6)}
DEMANDS = [
    Demand("a", 4, (profile("one", "A100", 1),), spread_by="zone", spread_required=True),
    Demand("b", 4, (profile("two", "A100", 2),)),
    Demand("c", 2, (profile("pair", "A100", 4, nodes=2),), spread_by="zone"),
]


@st.composite
def placements(draw: st.DrawFn) -> list[Placement]:
    out = []
    for model, gpus, size in (("a", 1, 1), ("b", 2, 1), ("c", 4, 2)):
        for replica in range(draw(st.integers(min_value=0, max_value=5))):
            nodes = tuple(
                draw(
                    st.lists(
                        st.sampled_from(sorted(NODES)), min_size=size, max_size=size, unique=True
                    )
                )
            )
            out.append(
                Placement(model, replica, "p", nodes, gpus, "A100", draw(st.sampled_from([0, 8])))
            )
    return out


def _index_view(index: _Index) -> tuple[object, ...]:
    return (
        {n: list(map(id, ps)) for n, ps in index.on_node.items()},
        {k: v for k, v in index.spread.count.items() if v},
        index.hosts,
    )


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_indexes_less_the_placements_gone_are_the_indexes_of_the_rest(
    data: st.DataObject,
) -> None:
    draw = data.draw
    before = draw(placements())
    domain = _domains(DEMANDS, NODES)
    required = {"a"}
    spread_memo, index_memo = SpreadMemo(), IndexMemo()
    spread_memo.of(DEMANDS, NODES, before, "v")
    index_memo.index_of(before, DEMANDS, "v", domain, required)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        after = [p for p in before if draw(st.integers(min_value=0, max_value=3)) > 0]
        assert removed_from(before, after) is not None
        got = spread_memo.of(DEMANDS, NODES, after, "v")
        fresh = Spread.of(DEMANDS, NODES, after)
        assert (got.on_node, got.in_domain) == (fresh.on_node, fresh.in_domain)
        index = index_memo.index_of(after, DEMANDS, "v", domain, required)
        assert _index_view(index) == _index_view(_Index(after, domain, required))
        before = after
    assert spread_memo.patched > 0 and index_memo.patched > 0
