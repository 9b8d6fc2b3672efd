"""One xdist worker per module-scoped fixture: a pytest plugin (tests/conftest.py loads it).

`make test` runs `pytest -n 4 --dist loadgroup`: a test without an ``xdist_group`` mark
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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: xdist's own hook reads the marks to name each test's group.
    for item in items:
        group = module_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
