"""Properties over generated definitions and generated sequences of catalog changes."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from catalog import Catalog, CatalogError, CatalogState, Model, parse_model
from catalog.definition.model_rules import normalize
from catalog.definition.routing_profiles import KNOWN as KNOWN_ROUTING
from catalog.forms.durations import format_duration, parse_duration

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- building blocks ---------------------------------------------------------------------

_ENDS = "abcdefghijklmnopqrstuvwxyzABC0123456789"


def tokens(extra: str, max_size: int = 12) -> st.SearchStrategy[str]:
    """Identifiers of the grammar (catalog.definition.identifiers): letters or digits at
    both ends."""
    return st.one_of(
        st.sampled_from(_ENDS),
        st.builds(
            lambda a, mid, b: a + mid + b,
            st.sampled_from(_ENDS),
            st.text(alphabet=st.sampled_from(_ENDS + extra), max_size=max_size - 2),
            st.sampled_from(_ENDS),
        ),
    )


names = tokens("-._/:")
profile_names = tokens("-._")
# The routing profiles the catalog knows (any other name is refused at load).
ROUTING_PROFILES = sorted(KNOWN_ROUTING)
# Text an operator might type, quotes, spaces and unicode included.
any_text = st.text(max_size=12)
# The same, printable (catalog.forms.text): what a source or a reason may hold.
printable_text = st.text(
    alphabet=st.characters(exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))
    | st.just(" "),
    max_size=12,
)
durations = st.one_of(
    st.integers(0, 10**6),
    st.floats(0, 10**5, allow_nan=False, allow_infinity=False),
    st.builds(
        lambda h, m, s, ms, us: f"{h}h{m}m{s}s{ms}ms{us}us",
        *(st.integers(0, n) for n in (48, 59, 59, 999, 999)),
    ),
    st.sampled_from(["90s", "20m", "1h30m", "1.5h", "250ms", "0s"]),
)
string_maps = st.dictionaries(names, any_text, max_size=3)
labels = st.dictionaries(tokens("-._/"), st.just("") | tokens("-._:/"), max_size=3)


# Strategies the composites and tests in this module draw, built once (those that depend on
# an earlier draw, once per value it can take): an inline one is built and validated anew.
_BOOL = st.booleans()
_TP = st.integers(1, 8)
_PP = st.integers(0, 4)
_NODES_OF = {
    total: st.sampled_from([n for n in range(1, total + 1) if total % n == 0])
    for total in {tp * max(pp, 1) for tp in range(1, 9) for pp in range(5)}
}


@st.composite
def gpu_shapes(draw: st.DrawFn) -> dict[str, Any]:
    """tp, pp, nodes and gpus_per_node that add up, written or left to defaults."""
    tp = draw(_TP)
    pp = draw(_PP)
    total = tp * max(pp, 1)
    nodes = draw(_NODES_OF[total])
    gpus_per_node = total // nodes
    shape: dict[str, Any] = {"tp": tp}
    if pp or draw(_BOOL):
        shape["pp"] = pp
    if nodes > 1 or draw(_BOOL):
        shape["nodes"] = nodes
    if gpus_per_node != max(tp // nodes, 1) or draw(_BOOL):
        shape["gpus_per_node"] = gpus_per_node
    if tp == 1 and draw(_BOOL):
        del shape["tp"]  # the default
    return shape


# The composites below draw from strategies built once, here, rather than inside each
# draw, where each was built and validated again every time (the same strategies, so
# the same examples, for about half the CPU of drawing them).
_ENGINES = st.sampled_from([None, "vllm", "sglang", "sim", "llamacpp"])
_GPU_CLASSES = st.sampled_from(["A100", "H100", "L4", "T4"])
_PROFILE_OPTIONAL: dict[str, st.SearchStrategy[Any]] = {
    "args": st.lists(any_text, max_size=3),
    "env": string_maps,
    "node_selector": labels,
    "min_memory_gb": st.integers(0, 512),
    "weight": st.floats(-2, 100, allow_nan=False, allow_infinity=False),
    "priority": st.integers(-10, 10),
    "startup_timeout": durations,
}
_GPU_SHAPES = gpu_shapes()
_CPU_NODES = st.integers(-1, 1)
_CPU_GPUS_PER_NODE = st.integers(-2, 8)


@st.composite
def valid_profiles(draw: st.DrawFn, name: str) -> dict[str, Any]:
    profile: dict[str, Any] = {"name": name}
    if draw(_BOOL):
        profile["engine"] = "llamacpp"  # a CPU profile
        if draw(_BOOL):
            profile["nodes"] = draw(_CPU_NODES)
        if draw(_BOOL):
            profile["gpus_per_node"] = draw(_CPU_GPUS_PER_NODE)
    else:
        engine = draw(_ENGINES)
        if engine is not None:
            profile["engine"] = engine
        profile["gpu_class"] = draw(_GPU_CLASSES)
        profile.update(draw(_GPU_SHAPES))
    for key, strategy in _PROFILE_OPTIONAL.items():
        if draw(_BOOL):
            profile[key] = draw(strategy)
    return profile


_PROFILE_NAME_LISTS = st.lists(profile_names, min_size=1, max_size=3, unique_by=str.casefold)
_SOURCES = printable_text.map(str.strip).filter(bool)
_FALLBACK_LISTS = st.lists(names, max_size=3)
_ROUTING_PROFILE_NAMES = st.sampled_from(["", *ROUTING_PROFILES])
_LOW = st.integers(-3, 5)
_HIGH_OVER = {low: st.one_of(st.just(0), st.integers(max(low, 0), 10)) for low in range(-3, 6)}
_CONTEXT_LENGTH = st.integers(0, 10**6)


@st.composite
def valid_definitions(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(names)
    profiles = draw(_PROFILE_NAME_LISTS)
    raw: dict[str, Any] = {
        "name": name,
        "source": draw(_SOURCES),
        "profiles": [draw(valid_profiles(p)) for p in profiles],
    }
    if draw(_BOOL):
        raw["aliases"] = draw(
            st.lists(
                names.filter(lambda a: a.casefold() != name.casefold()),
                max_size=3,
                unique_by=str.casefold,
            )
        )
    if draw(_BOOL):
        raw["fallbacks"] = draw(_FALLBACK_LISTS)
    if draw(_BOOL):
        low = draw(_LOW)
        high = draw(_HIGH_OVER[low])
        raw["scaling"] = {"min": low, "max": high}
    if draw(_BOOL):
        raw["slo"] = {"ttft_p99": draw(durations), "tpot_p99": draw(durations)}
    if draw(_BOOL):
        raw["capabilities"] = {"tools": draw(_BOOL), "vision": draw(_BOOL)}
    if draw(_BOOL):
        raw["context_length"] = draw(_CONTEXT_LENGTH)
        raw["max_output"] = draw(st.integers(0, raw["context_length"]))
    if draw(_BOOL):
        raw["routing_profile"] = draw(_ROUTING_PROFILE_NAMES)
    return raw


# -- (a) a valid definition survives being stored ----------------------------------------


@SETTINGS
@given(valid_definitions())
def test_a_valid_definition_round_trips_through_json_unchanged(raw: dict[str, Any]) -> None:
    m = parse_model(raw)
    stored = json.loads(json.dumps(m.to_definition()))
    assert parse_model(stored) == m
    assert normalize(m) == m


@SETTINGS
@given(valid_definitions())
def test_normalize_is_idempotent_before_validation(raw: dict[str, Any]) -> None:
    once = normalize(Model.model_validate(raw))
    assert normalize(once) == once


@settings(max_examples=300, deadline=None)
@given(st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=10**5)))
def test_every_duration_is_written_in_a_form_that_reads_back_exactly(value: timedelta) -> None:
    assert parse_duration(format_duration(value)) == value


# -- (b) any raw definition is either accepted whole or refused with a CatalogError ------

wild_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.integers(-(10**30), 10**30),
    st.floats(),
    any_text,
    st.sampled_from(["4", "20m", "1h30", "-5s", "9999999999999h", "llamacpp", "A100"]),
)
# Half the time a duration at or past the edge: infinite, NaN, negative, or more days
# than a timedelta holds.
edge_durations = st.sampled_from(
    [float("inf"), float("nan"), -1, 10**20, 1e300, "9999999999999h", "1e3s", "1d", "-5s"]
)
wild_durations = st.booleans().flatmap(lambda edge: edge_durations if edge else wild_scalars)
wild_values = st.one_of(
    wild_scalars,
    st.lists(wild_scalars, max_size=3),
    st.dictionaries(any_text, wild_scalars, max_size=3),
)


_ACTIONS = st.sampled_from(["drop", "wild", "unknown"])


@st.composite
def corrupt(draw: st.DrawFn, target: dict[str, Any]) -> None:
    """Drop a field, give it a value of any type, or add an unknown one, in place."""
    action = draw(_ACTIONS)
    if action == "unknown" or not target:
        target[draw(any_text)] = draw(wild_values)
        return
    key = draw(st.sampled_from(sorted(target)))
    if action == "drop":
        del target[key]
    else:
        target[key] = draw(wild_values)


_COUNT_FIELDS = st.sampled_from(["tp", "pp", "nodes", "gpus_per_node", "min_memory_gb"])
_CORRUPTIONS = st.sampled_from([0, 0, 0, 1, 2])
_ODD_NAMES = st.one_of(any_text, wild_scalars)
_ONE_IN_TEN = st.integers(0, 9)
_ONE_IN_FIVE = st.integers(0, 4)
_ONE_IN_THREE = st.integers(0, 2)
_MISCOUNTS = st.integers(1, 3)
_MISCOUNT = st.integers(-3, 9)
_SCALE = st.integers(-5, 5)
_VALID_DEFINITIONS = valid_definitions()


@st.composite
def arbitrary_definitions(draw: st.DrawFn) -> object:
    """Mostly near-valid definitions with a few things wrong; now and then not a mapping."""
    if draw(_ONE_IN_TEN) == 0:
        return draw(wild_values)
    raw = draw(_VALID_DEFINITIONS)
    profiles: list[dict[str, Any]] = raw["profiles"]
    if draw(_BOOL):
        # Counts that need not add up, negatives included.
        for _ in range(draw(_MISCOUNTS)):
            p = draw(st.sampled_from(profiles))
            key = draw(_COUNT_FIELDS)
            p[key] = draw(_MISCOUNT)
    if draw(_ONE_IN_FIVE) == 0:
        draw(st.sampled_from(profiles)).pop("gpu_class", None)
    if draw(_ONE_IN_THREE) == 0:
        target = draw(st.sampled_from([*profiles, raw.setdefault("slo", {})]))
        key = "startup_timeout" if target is not raw["slo"] else "ttft_p99"
        target[key] = draw(wild_durations)
    if draw(_ONE_IN_TEN) == 0:
        profiles.append(dict(profiles[0]))  # a profile name twice
    if draw(_ONE_IN_FIVE) == 0:
        raw["scaling"] = {"min": draw(_SCALE), "max": draw(_SCALE)}
    if draw(_ONE_IN_TEN) == 0:
        raw["name"] = draw(_ODD_NAMES)
    for _ in range(draw(_CORRUPTIONS)):
        nested = [v for v in raw.values() if isinstance(v, dict)]
        draw(corrupt(draw(st.sampled_from([raw, *profiles, *nested]))))
    return raw


def assert_invariants(m: Model) -> None:
    assert m.name.strip() == m.name != ""
    assert m.source
    assert m.profiles
    assert m.scaling.max >= m.scaling.min >= 0
    assert len({p.name for p in m.profiles}) == len(m.profiles)
    assert all(p.name for p in m.profiles)
    assert len(set(m.aliases)) == len(m.aliases)
    assert m.name not in m.aliases
    for p in m.profiles:
        assert p.engine
        assert p.tp >= 1
        assert p.nodes >= 1
        assert p.weight > 0
        assert p.startup_timeout > timedelta(0)
        assert p.min_memory_gb >= 0
        if p.cpu_only:
            assert p.gpu_class == ""
            assert p.engine == "llamacpp"
            assert (p.nodes, p.gpus_per_node) == (1, 0)
        else:
            assert p.gpu_class
            assert p.gpus_per_node >= 1
            assert p.gpus_per_node * p.nodes == p.tp * max(p.pp, 1)
    assert normalize(m) == m


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arbitrary_definitions())
def test_any_definition_is_accepted_whole_or_refused_with_a_catalog_error(raw: object) -> None:
    try:
        m = parse_model(raw)
    except CatalogError as err:
        event("refused")
        name = raw.get("name") if isinstance(raw, dict) else None
        if isinstance(name, str) and name.strip():
            assert repr(name) in str(err)
            assert err.model == name
        return
    event("accepted")
    assert_invariants(m)


# -- (c) any sequence of changes keeps the catalog consistent ----------------------------
#
# The rules between models are one implementation (catalog.whole.rules), used by Catalog.build
# from nothing and by CatalogState against its indexes. What this still checks is the
# state's own bookkeeping: after any sequence of additions (in dependency order) and
# removals, its incremental indexes judge exactly as a rebuild of the whole catalog does.

# Declared models take their names from the first few, so that runtime changes collide
# with configuration often, but not always.
POOL = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]


def simple_model(name: str, source: str, aliases: list[str], fallbacks: list[str]) -> Model:
    return parse_model(
        {
            "name": name,
            "source": source,
            "aliases": aliases,
            "fallbacks": fallbacks,
            "profiles": [{"name": "p", "gpu_class": "A100"}],
        }
    )


_CHOSEN = st.lists(st.sampled_from(POOL[:4]), max_size=3, unique=True)
_BATCH_SIZE = st.integers(1, 3)
_POOL_NAME = st.sampled_from(POOL)


@st.composite
def declared_catalogs(draw: st.DrawFn) -> Catalog:
    """A valid declared catalog over part of the pool, its fallbacks within itself."""
    chosen = draw(_CHOSEN)
    free = [n for n in POOL[:5] if n not in chosen]
    aliases = draw(st.lists(st.sampled_from(free), max_size=1)) if chosen else []
    owners = {a: draw(st.sampled_from(chosen)) for a in aliases}
    targets = chosen + list(owners)
    return Catalog.build(
        [
            simple_model(
                n,
                f"declared/{n}",
                [a for a, o in owners.items() if o == n],
                draw(st.lists(st.sampled_from(targets), max_size=2)),
            )
            for n in chosen
        ]
    )


def present_keys(state: CatalogState) -> list[str]:
    return [k for m in state.snapshot().models() for k in (m.name, *m.aliases)]


def draw_batch(data: st.DataObject, state: CatalogState) -> list[Model]:
    """One to three models; fallbacks mostly to what exists or to earlier batch members."""
    batch: list[Model] = []
    for _ in range(data.draw(_BATCH_SIZE, label="batch size")):
        name = data.draw(_POOL_NAME, label="name")
        others = [n for n in POOL if n != name]
        aliases = data.draw(st.lists(st.sampled_from(others), max_size=1), label="aliases")
        known = present_keys(state) + [k for m in batch for k in (m.name, *m.aliases)]
        targets = st.sampled_from(known) if known else st.nothing()
        fallbacks = data.draw(
            st.lists(st.one_of(targets, targets, _POOL_NAME), max_size=2),
            label="fallbacks",
        )
        batch.append(simple_model(name, f"runtime/{name}", aliases, fallbacks))
    return batch


def draw_removal(data: st.DataObject, state: CatalogState) -> str:
    """Mostly a runtime model or one others fall back to; sometimes an alias, or anything."""
    snapshot = state.snapshot()
    runtime = [m.name for m in snapshot.models() if not snapshot.is_declared(m.name)]
    depended_on = sorted(
        {t for m in snapshot.models() for t in snapshot.fallbacks_of(m.name) if t != m.name}
    )
    choices = [_POOL_NAME]
    if runtime:
        choices += [st.sampled_from(runtime)] * 3
    if depended_on:
        choices += [st.sampled_from(depended_on)] * 2
    if present_keys(state):
        choices.append(st.sampled_from(present_keys(state)))
    return data.draw(st.one_of(choices), label="remove")


def rebuilds(models: list[Model]) -> bool:
    """Whether the whole-catalog rules accept these models as one catalog."""
    try:
        Catalog.build(models, declared=False)
    except CatalogError:
        return False
    return True


def batch_has_cycle(batch: list[Model]) -> bool:
    """A fallback cycle among batch members, a model falling back to itself aside."""
    owner = {m.name: m.name for m in batch} | {a: m.name for m in batch for a in m.aliases}
    edges = {
        m.name: {owner[f] for f in m.fallbacks if f in owner and owner[f] != m.name} for m in batch
    }
    reachable = {n: set(e) for n, e in edges.items()}
    for _ in batch:
        for targets in reachable.values():
            targets |= {t for r in list(targets) for t in reachable[r]}
    return any(n in r for n, r in reachable.items())


def check_add_agrees_with_a_rebuild(state: CatalogState, batch: list[Model]) -> None:
    """An addition is accepted exactly when the catalog it leaves builds, cycles aside."""
    current = list(state.snapshot().models())
    unique = len({m.name for m in batch}) == len(batch)
    expected = rebuilds(current + batch) and not (unique and batch_has_cycle(batch))
    try:
        ordered = state.check_add(batch)
    except CatalogError:
        assert not expected, f"refused a valid addition of {[m.name for m in batch]}"
        event("add refused")
        return
    assert expected, f"accepted an invalid addition of {[m.name for m in batch]}"
    event("add accepted" if len(batch) == 1 else "batch accepted")
    assert sorted(m.name for m in ordered) == sorted(m.name for m in batch)
    for m in ordered:  # as replay applies them: one at a time, each judged alone
        state.check_add([m])
        state.add(m)


def check_remove_agrees_with_a_rebuild(state: CatalogState, declared: Catalog, name: str) -> None:
    """A removal is accepted exactly when it names a runtime model and the rest builds."""
    current = list(state.snapshot().models())
    expected = (
        any(m.name == name for m in current)
        and not declared.is_declared(name)
        and rebuilds([m for m in current if m.name != name])
    )
    try:
        state.check_remove(name)
    except CatalogError as err:
        assert not expected, f"refused a valid removal of {name!r}"
        event("removal refused: dependents" if "back to it" in str(err) else "removal refused")
        return
    assert expected, f"accepted an invalid removal of {name!r}"
    event("removal accepted")
    state.remove(name)


@pytest.mark.slow  # (tests/xdist_groups.py: handed out first)
@SETTINGS
@given(declared_catalogs(), st.data())
def test_any_sequence_of_changes_agrees_with_the_whole_catalog_rules(
    declared: Catalog, data: st.DataObject
) -> None:
    state = CatalogState(declared)
    for _ in range(data.draw(st.integers(0, 15), label="steps")):
        if data.draw(st.sampled_from(["add", "add", "remove"]), label="change") == "add":
            check_add_agrees_with_a_rebuild(state, draw_batch(data, state))
        else:
            check_remove_agrees_with_a_rebuild(state, declared, draw_removal(data, state))

        snapshot = state.snapshot()
        rebuilt = Catalog.build(snapshot.models(), declared=False)
        for m in snapshot.models():
            for key in (m.name, *m.aliases):
                assert snapshot.resolve(key) == rebuilt.resolve(key) == m
            assert snapshot.is_declared(m.name) == declared.is_declared(m.name)
        for m in declared.models():
            assert snapshot.resolve(m.name) == m
        assert snapshot.models()[: len(declared)] == declared.models()


def test_the_oracles_used_above_tell_valid_from_invalid() -> None:
    # The state property is only as good as its oracles.
    def m(name: str, *fallbacks: str, aliases: tuple[str, ...] = ()) -> Model:
        return simple_model(name, "x", list(aliases), list(fallbacks))

    assert batch_has_cycle([m("a", "b"), m("b", "cc"), m("c", "a", aliases=("cc",))])
    assert not batch_has_cycle([m("a", "a"), m("b", "a"), m("c", "b")])
    assert rebuilds([m("a", "bb"), m("b", aliases=("bb",))])
    assert not rebuilds([m("a", "b")])
    assert not rebuilds([m("a"), m("b", aliases=("a",))])
