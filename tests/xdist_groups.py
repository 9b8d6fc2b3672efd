"""One xdist worker per module-scoped fixture: a pytest plugin (tests/conftest.py loads it).

`make test` runs `pytest -n 6 --dist loadgroup`: a test without an ``xdist_group`` mark
goes to whichever worker is free, so a module whose tests share a module-scoped fixture
(a server, a cluster of server, agents and gateway) had it built on both workers. Each
such test gets its module's group here, so the fixture is built once. A module-scoped
parameter (``module_db_url``: sqlite, postgres) is part of the group: each back end's
server is built once, and the two may still run side by side. A mark written in the
module (``pytest.mark.xdist_group``, for state a module caches in the process rather
than in a fixture) is kept as it is.

The groups only take on a pytest whose test ids xdist can still suffix (see the pin in
pyproject.toml); tests/unit/ops/test_xdist_groups.py runs a small suite under xdist and
fails if they stop taking.

The order the work is handed out in: the longest first, so that the run does not end
with one worker still busy with a long test the others could have run beside it.
xdist hands out whole work units (a group, or a test alone) in the order they were
collected, and by default first sorts them by how many tests they hold, which says
little of their time: a test alone that waits a minute on a cluster came after every
group of two quick tests, and the suite's long unit tests (collected last) ended it.
Here, under ``--dist loadgroup``, a unit with a ``slow`` test comes first, then the
larger units before the smaller ones, each kept in collection order otherwise; xdist's
own sort is turned off so that this order is the one it follows.
"""

from __future__ import annotations

import pytest


def module_group(item: pytest.Item) -> str | None:
    """The xdist group of a test that uses a module- or class-scoped fixture, else None."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None or item.get_closest_marker("xdist_group") is not None:
        return None
    shared = {
        name
        for name, defs in info.name2fixturedefs.items()
        if defs and defs[-1].scope in ("module", "class", "package")
    }
    if not shared:
        return None
    group = item.nodeid.split("::", 1)[0]
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        scoped = sorted(
            f"{name}={callspec.params[name]}" for name in callspec.params if name in shared
        )
        if scoped:
            # No brackets: xdist takes a nodeid ending in "]" for one without a group.
            group += ":" + ",".join(scoped)
    return group


def _by_group(config: pytest.Config) -> bool:
    """Run with ``--dist loadgroup`` (a worker's own ``dist`` is "no"; xdist notes it as
    ``loadgroup`` there)."""
    return bool(
        config.getoption("dist", "no") == "loadgroup" or getattr(config.option, "loadgroup", False)
    )


def pytest_configure(config: pytest.Config) -> None:
    if _by_group(config):
        # The workers' collection is already in the order to hand the units out in
        # (``longest_first``); xdist's sort by tests per unit would undo it.
        config.option.loadscopereorder = False


def unit_of(item: pytest.Item) -> str:
    """The work unit xdist hands out with ``item``: its group, else the test alone."""
    marker = item.get_closest_marker("xdist_group")
    if marker is None:
        return item.nodeid
    return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))


def longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with the work units holding a ``slow`` test first, then the larger units
    before the smaller; a unit's tests together, and collection order otherwise."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of(item), []).append(item)
    ordered = sorted(
        units.values(),
        key=lambda tests: (
            not any(t.get_closest_marker("slow") is not None for t in tests),
            -len(tests),
        ),
    )
    return [item for tests in ordered for item in tests]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: xdist's own hook reads the marks to name each test's group.
    for item in items:
        group = module_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if _by_group(config):
        items[:] = longest_first(items)
