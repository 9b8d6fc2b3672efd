"""The import graph keeps the architecture's shape: floors, no arrow back up, no circle.

ARCHITECTURE.md draws the packages as floors: ``catalog`` at the bottom, ``events`` and
``scheduler`` on it, ``llmgw`` (the command line and the API) composing them on top,
and ``agent`` beside them, talking to the control plane over HTTP only. Inside
``scheduler`` the same again: ``lifecycle``, ``planner``, ``persistence``, ``daemon``;
inside ``events`` (``database``, ``core``, ``storage``, ``read``, ``write``, ``audit``),
``llmgw.api`` and ``llmgw.cli`` too, each subpackage a floor of its own; so are
``catalog``'s rooms (``forms`` up to ``stored``), ``gateway.stages`` (the request path's
stages, under the proxy) and ``bench``'s rooms (each on ``bench.shared`` only). No folder
holds more than 20 modules (tests aside).
The rules are data (``MAY_IMPORT``, ``NEVER``): a new package is one line in
``MAY_IMPORT``, and the test fails until it has one.

The graph is read from the source as text (``ast``), file to file: an import inside a
function or under ``TYPE_CHECKING`` counts, because a circle is a circle wherever the
import stands.
Reading it takes well under a second and runs nothing of the project.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Everything of ours may import itself; besides, each package (or subpackage) may import
# the packages listed here and nothing else of ours. A module is governed by the longest
# name here that it starts with. ANYTHING is for the composition root and the benches.
ANYTHING = ("*",)
# llmgw's own modules outside api/ and cli/: settings, views, logs and the like, which
# the API's and the CLI's floors share (none of them imports either).
_LLMGW_LEAVES = (
    "llmgw.agent_settings",
    "llmgw.autoscale_view",
    "llmgw.autoscaling",
    "llmgw.declared_watch",
    "llmgw.gateway_settings",
    "llmgw.logs",
    "llmgw.policy_view",
    "llmgw.settings",
    "llmgw.views",
)
_CATALOG_GROUND = ("catalog.errors", "catalog.forms")
# Every package of the product, for the benches' rooms (they may measure any of it).
_PRODUCT = (
    "agent",
    "autoscale",
    "catalog",
    "declared",
    "engine_check",
    "events",
    "gateway",
    "httpguard",
    "llmgw",
    "scheduler",
)
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    # The catalog's own floors, from the ground up; its root holds the errors and the
    # front door (``catalog/__init__.py``, names loaded on first use).
    "catalog": (),
    "catalog.forms": ("catalog.errors",),
    "catalog.secrecy": ("catalog.errors",),
    "catalog.definition": (*_CATALOG_GROUND, "catalog.secrecy"),
    "catalog.whole": (*_CATALOG_GROUND, "catalog.definition"),
    "catalog.changes": (*_CATALOG_GROUND, "catalog.secrecy", "catalog.definition", "catalog.whole"),
    "catalog.reading": (*_CATALOG_GROUND, "catalog.secrecy", "catalog.definition", "catalog.whole"),
    "catalog.stored": (*_CATALOG_GROUND, "catalog.definition", "catalog.reading"),
    # The package's own module is the front door (catalog_service: the read model and
    # the commands over one database); its floors below, from the ground up.
    "events": ("catalog", "events.core", "events.storage", "events.read", "events.write"),
    "events.database": (),
    "events.core": ("catalog",),
    "events.storage": ("catalog", "events.core", "events.database"),
    "events.read": ("catalog", "events.core", "events.database", "events.storage"),
    "events.write": ("catalog", "events.core", "events.database", "events.storage", "events.read"),
    "events.audit": ("catalog", "events.core", "events.database", "events.storage", "events.read"),
    # The package itself is a docstring: it re-exports nothing (import cost at CLI start).
    "scheduler": (),
    "scheduler.lifecycle": ("catalog",),
    "scheduler.planner": ("catalog", "scheduler.lifecycle", "scheduler.planner.fleet"),
    # The planner's ground floor (nodes, placements, fit, capacity): nothing above it.
    "scheduler.planner.fleet": ("catalog", "scheduler.lifecycle"),
    # Rounds planned from what changed (issue 42): above the planner, as pure as it.
    "scheduler.planner.rounds": (
        "catalog",
        "scheduler.lifecycle",
        "scheduler.planner",
        "scheduler.planner.fleet",
    ),
    "scheduler.persistence": (
        "catalog",
        "events.database",
        "scheduler.lifecycle",
        "scheduler.planner",
    ),
    # The exact reference (OR-Tools CP-SAT) the planner is measured against: pure.
    "scheduler.exact": ("catalog", "scheduler.planner"),
    "scheduler.daemon": (
        "catalog",
        "events",
        "scheduler.lifecycle",
        "scheduler.planner",
        "scheduler.persistence",
    ),
    # The bounded request head every server of ours runs (API, sim, gateway): uvicorn only.
    "httpguard": (),
    "agent": ("catalog", "httpguard"),
    # The data plane: pure catalog rules; the control plane only over HTTP.
    "gateway": ("catalog", "httpguard", "gateway.stages"),
    # The request path's stages (admission, routing, set-aside, ...): pure functions of a
    # request, the routing table and the load; the proxy above calls them.
    "gateway.stages": ("catalog", "gateway.table"),
    # The autoscaler: pure decisions on catalog limits; its store is of the log's kind.
    "autoscale": ("catalog", "events.database"),
    # The declared catalog file, watched and reloaded: records its changes in the log.
    "declared": ("catalog", "events.core", "events.database", "scheduler.persistence"),
    # Builds the reference pages of the docs site from the CLI parser and the API document.
    "docsite": ANYTHING,
    # `llmgw engine-check`: verifies an engine's claims over HTTP; the tiny test model.
    "engine_check": ("catalog", "agent"),
    "llmgw": ANYTHING,
    # The API: app and server compose the floors below, from the ground up.
    "llmgw.api": ANYTHING,
    "llmgw.api.rendering": ("catalog", "events"),
    "llmgw.api.telemetry": ("declared", "scheduler"),
    "llmgw.api.guards": ("catalog", "llmgw.api.rendering"),
    "llmgw.api.pages": ("llmgw.api.rendering",),
    "llmgw.api.reports": (
        "catalog",
        "scheduler",
        "llmgw.api.guards",
        "llmgw.api.rendering",
        "llmgw.api.telemetry",
    ),
    "llmgw.api.runtime": (
        *_LLMGW_LEAVES,
        "autoscale",
        "catalog",
        "declared",
        "events",
        "scheduler",
        "llmgw.api.guards",
        "llmgw.api.rendering",
        "llmgw.api.reports",
        "llmgw.api.telemetry",
    ),
    "llmgw.api.routes": (
        *_LLMGW_LEAVES,
        "autoscale",
        "catalog",
        "events",
        "scheduler",
        "llmgw.api.guards",
        "llmgw.api.rendering",
        "llmgw.api.reports",
        "llmgw.api.runtime",
        "llmgw.api.telemetry",
    ),
    # The command line: main and the commands that need the whole parser (completion,
    # settings) compose the command groups; each group is its parser and its commands.
    "llmgw.cli": ANYTHING,
    "llmgw.cli.shared": ("catalog", "events", "llmgw.settings"),
    "llmgw.cli.catalog": (
        "catalog",
        "events",
        "scheduler",
        "llmgw.policy_view",
        "llmgw.views",
        "llmgw.cli.shared",
    ),
    "llmgw.cli.scheduler": (
        *_LLMGW_LEAVES,
        "autoscale",
        "catalog",
        "declared",
        "events",
        "scheduler",
        "llmgw.cli.catalog",
        "llmgw.cli.shared",
    ),
    "llmgw.cli.autoscale": (
        "autoscale",
        "catalog",
        "scheduler",
        "llmgw.autoscale_view",
        "llmgw.cli.shared",
    ),
    "llmgw.cli.gateway": (*_LLMGW_LEAVES, "gateway", "llmgw.cli.shared"),
    "llmgw.cli.operate": (
        *_LLMGW_LEAVES,
        "agent",
        "catalog",
        "declared",
        "engine_check",
        "events",
        "scheduler",
        "llmgw.api",
        "llmgw.cli.autoscale",
        "llmgw.cli.scheduler",
        "llmgw.cli.shared",
    ),
    # The benches measure the whole, as the tests do (bench.api.fleet_ab times llmgw's route).
    # ``bench`` itself (``python -m bench AREA``) calls the rooms; each room measures one
    # part and shares only ``bench.shared`` with the others, which builds on no room.
    "bench": ANYTHING,
    "bench.shared": _PRODUCT,
    "bench.events": (*_PRODUCT, "bench.shared"),
    "bench.placement": (*_PRODUCT, "bench.shared"),
    "bench.autoscale": (*_PRODUCT, "bench.shared"),
    "bench.api": (*_PRODUCT, "bench.shared"),
    "bench.gateway": (*_PRODUCT, "bench.shared"),
}

# What ARCHITECTURE.md forbids, whatever MAY_IMPORT says: (importer, imported, why).
# "*" as the importer is every package but the ones in NEVER_EXCEPT.
NEVER: tuple[tuple[str, str, str], ...] = (
    ("catalog", "events", "catalog holds pure rules that every other package builds on"),
    ("catalog", "scheduler", "catalog holds pure rules that every other package builds on"),
    ("catalog", "llmgw", "catalog holds pure rules that every other package builds on"),
    ("catalog", "agent", "catalog holds pure rules that every other package builds on"),
    ("agent", "events", "an agent talks to the control plane over HTTP only"),
    ("agent", "scheduler", "an agent talks to the control plane over HTTP only"),
    ("agent", "llmgw", "an agent talks to the control plane over HTTP only"),
    ("gateway", "events", "the request path never touches the database"),
    ("gateway", "scheduler", "the request path never touches the database"),
    ("gateway", "agent", "a gateway reaches engines over HTTP only"),
    ("engine_check", "events", "engine-check reaches engines over HTTP only"),
    ("engine_check", "scheduler", "engine-check reaches engines over HTTP only"),
    ("*", "llmgw", "llmgw is the composition root: nothing builds on it"),
    ("scheduler.lifecycle", "scheduler.planner", "lifecycle is the floor under the planner"),
    ("scheduler.lifecycle", "events", "lifecycle is pure and imported at CLI start"),
    ("scheduler.planner.fleet", "scheduler.planner", "fleet is the planner's ground floor"),
    ("scheduler.planner", "events", "the planner is pure: no I/O"),
    ("scheduler.planner", "scheduler.persistence", "the planner is pure: no I/O"),
    ("scheduler.planner", "scheduler.daemon", "the planner is pure: no I/O"),
    ("scheduler.planner", "scheduler.exact", "ortools is optional: the planner never needs it"),
    ("scheduler.daemon", "scheduler.exact", "ortools is optional: the daemon never needs it"),
    ("scheduler.exact", "events", "the exact reference is pure: no I/O"),
    ("scheduler.persistence", "scheduler.daemon", "storage is a floor under the daemon"),
    ("events.core", "events.database", "the core is pure: importable without a database driver"),
    ("events.core", "events.storage", "the core is pure: importable without a database driver"),
    ("events.storage", "events.read", "a log stores events; replay and read models build on it"),
    ("events.read", "events.write", "the read side never changes the log"),
    ("events.read", "events.audit", "audits check the read side, never the other way round"),
    ("events.write", "events.audit", "audits are the operator's, never a command's"),
    ("llmgw.api", "llmgw.cli", "the API serves the same commands, never by running the CLI"),
    ("llmgw.api.rendering", "llmgw.api.runtime", "rendering shapes answers; it holds no state"),
    ("llmgw.api.guards", "llmgw.api.runtime", "guards judge a request before any service"),
    ("llmgw.cli.shared", "llmgw.api", "what every command needs never loads the web framework"),
)
# The benches and the docs site (its reference pages read the CLI parser and the API
# document) stand above the composition root, as the tests do.
NEVER_EXCEPT = {"*": ("llmgw", "bench", "docsite")}

SKIP = {"tests", "alembic", "build", "dist", "node_modules"}


def our_modules(root: Path) -> dict[str, Path]:
    """Every module of ours by dotted name: the top-level packages and what is in them."""
    found: dict[str, Path] = {}
    for init in sorted(root.glob("*/__init__.py")):
        top = init.parent
        if top.name in SKIP or top.name.startswith("."):
            continue
        for path in top.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if any(p.startswith(".") or p == "__pycache__" for p in parts):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, wherever in the file the import stands."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base, *(f"{base}.{a.name}" if base else a.name for a in node.names)]
            else:
                continue
            for imported in targets:
                target = imported
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    out.add(target)
        if path.name == "__init__.py":
            # A package's __init__ composing its own modules is not counted: each of
            # them runs that __init__ first anyway, so every
            # package that builds its front door from its modules would be a circle.
            out = {t for t in out if not t.startswith(name + ".")}
        graph[name] = out
    return graph


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def floor_of(module: str, rules: Mapping[str, object] = MAY_IMPORT) -> str | None:
    """The longest name in ``rules`` that ``module`` is, or is inside of."""
    matches = [key for key in rules if _within(module, key)]
    return max(matches, key=len) if matches else None


def layer_violations(
    graph: Mapping[str, Iterable[str]], rules: Mapping[str, tuple[str, ...]] = MAY_IMPORT
) -> list[str]:
    """Each import that its importer's floor does not allow, as a sentence."""
    found = []
    for importer, targets in sorted(graph.items()):
        floor = floor_of(importer, rules)
        if floor is None:
            continue  # reported by test_every_package_has_a_line
        allowed = rules[floor]
        for target in sorted(targets):
            if allowed == ANYTHING or floor_of(target, rules) == floor:
                continue
            if _within(importer, target):
                # An ancestor package (``from llmgw import views``): Python runs it
                # before the importer anyway, so it is no arrow across floors.
                continue
            if not any(_within(target, a) for a in allowed):
                found.append(
                    f"{importer} imports {target}: {floor} may import "
                    f"{', '.join(allowed) or 'nothing of ours'} (MAY_IMPORT)"
                )
    return found


def forbidden_imports(
    graph: Mapping[str, Iterable[str]],
    never: Iterable[tuple[str, str, str]] = NEVER,
) -> list[str]:
    """Each import that ARCHITECTURE forbids, with why."""
    found = []
    for importer, targets in sorted(graph.items()):
        for who, whom, why in never:
            if who == "*":
                if any(_within(importer, e) for e in NEVER_EXCEPT["*"]):
                    continue
            elif not _within(importer, who):
                continue
            for target in sorted(targets):
                if _within(target, whom) and not _within(importer, whom):
                    found.append(f"{importer} imports {target}: {why}")
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(our_modules(REPO))


def test_there_is_no_import_circle(graph: dict[str, set[str]]) -> None:
    found = [" <-> ".join(c) for c in circles(graph)]
    assert not found, (
        "import circles (move the shared piece down a floor; a function-local import "
        "is still a circle):\n" + "\n".join(found)
    )


def test_every_package_has_a_line_in_may_import(graph: dict[str, set[str]]) -> None:
    homeless = sorted({m.split(".")[0] for m in graph if floor_of(m) is None})
    assert homeless == [], f"add one line per package to MAY_IMPORT in {__file__}"


def test_imports_follow_the_floors(graph: dict[str, set[str]]) -> None:
    found = layer_violations(graph)
    assert not found, "\n".join(found)


def test_nothing_imports_what_the_architecture_forbids(graph: dict[str, set[str]]) -> None:
    found = forbidden_imports(graph)
    assert not found, "\n".join(found)


def test_may_import_grants_nothing_the_architecture_forbids() -> None:
    granted = {
        (floor, target): f"{floor} -> {target}"
        for floor, allowed in MAY_IMPORT.items()
        if allowed != ANYTHING
        for target in allowed
    }
    # Each granted pair, as a one-edge graph, must pass NEVER.
    clashes = [
        text
        for (floor, target), text in granted.items()
        if forbidden_imports({floor + ".x": {target + ".y"}})
    ]
    assert clashes == []


# A folder is a room one can find one's way in: past this many modules it wants rooms of
# its own (bench/ had 40 side by side, catalog/ 26). Tests aside. The migrations
# count too: one history, kept in a folder per area under alembic/versions (log,
# tenants, scheduler), which Alembic reads recursively.
MAX_MODULES = 20
NOT_ROOMS = ("tests/",)


def crowded_folders(files: Iterable[str], limit: int = MAX_MODULES) -> dict[str, int]:
    """Each folder holding more than ``limit`` Python modules (``__init__`` counted)."""
    counts: dict[str, int] = {}
    for rel in files:
        folder, _, name = rel.rpartition("/")
        if not name.endswith(".py") or rel.startswith(NOT_ROOMS):
            continue
        counts[folder or "."] = counts.get(folder or ".", 0) + 1
    return {folder: n for folder, n in sorted(counts.items()) if n > limit}


def test_no_folder_holds_more_than_twenty_modules() -> None:
    assert crowded_folders(_python_files(REPO)) == {}, (
        f"give these folders subpackages along their seams (at most {MAX_MODULES} modules "
        "each; tests/unit/test_architecture.py's MAY_IMPORT then says how they layer)"
    )


# The folders' count enters alembic/ too (its migrations are modules of ours, not a
# package the import rules speak of).
WALK_SKIP = (SKIP - {"alembic"}) | {"__pycache__"}


def _python_files(root: Path) -> list[str]:
    """Every .py file of ours, relative to ``root``; hidden folders (the venv, caches) and
    WALK_SKIP are not entered at all (walking the venv took seconds)."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in WALK_SKIP]
        rel = Path(folder).relative_to(root)
        found += [str(rel / f) if rel.parts else f for f in files if f.endswith(".py")]
    return found


def test_every_package_says_what_it_owns() -> None:
    silent = [
        str(path.relative_to(REPO))
        for name, path in our_modules(REPO).items()
        if path.name == "__init__.py"
        and ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) is None
    ]
    assert silent == [], "each package's __init__ says what it owns and what it may import"


# -- the checker itself: a tree with each fault must be caught ------------------------------


def _tree(root: Path, files: Mapping[str, str]) -> dict[str, set[str]]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return import_graph(our_modules(root))


def test_the_checker_sees_a_circle_through_a_function_local_import(tmp_path: Path) -> None:
    graph = _tree(
        tmp_path,
        {
            "events/__init__.py": '"""x"""',
            "events/a.py": "from events.b import thing\n",
            "events/b.py": "def f():\n    from events import a\n",
        },
    )
    assert circles(graph) == [["events.a", "events.b"]]


def test_the_checker_sees_an_arrow_back_up(tmp_path: Path) -> None:
    graph = _tree(
        tmp_path,
        {
            "catalog/__init__.py": '"""x"""',
            "catalog/rules.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from events.log import Log\n",
            "events/__init__.py": '"""x"""',
            "events/log.py": "from .. import catalog\n",
            "scheduler/__init__.py": '"""x"""',
            "scheduler/planner/__init__.py": '"""x"""',
            "scheduler/planner/fit.py": "import scheduler.persistence.tables\n",
            "scheduler/persistence/__init__.py": '"""x"""',
            "scheduler/persistence/tables.py": "",
            "agent/__init__.py": "from llmgw import cli\n",
            "llmgw/__init__.py": "",
            "llmgw/cli.py": "",
        },
    )
    assert layer_violations(graph) == [
        "agent imports llmgw: agent may import catalog, httpguard (MAY_IMPORT)",
        "agent imports llmgw.cli: agent may import catalog, httpguard (MAY_IMPORT)",
        "catalog.rules imports events.log: catalog may import nothing of ours (MAY_IMPORT)",
        "scheduler.planner.fit imports scheduler.persistence.tables: scheduler.planner may "
        "import catalog, scheduler.lifecycle, scheduler.planner.fleet (MAY_IMPORT)",
    ]
    assert forbidden_imports(graph) == [
        "agent imports llmgw.cli: an agent talks to the control plane over HTTP only",
        "agent imports llmgw.cli: llmgw is the composition root: nothing builds on it",
        "agent imports llmgw: an agent talks to the control plane over HTTP only",
        "agent imports llmgw: llmgw is the composition root: nothing builds on it",
        "catalog.rules imports events.log: catalog holds pure rules that every other "
        "package builds on",
        "scheduler.planner.fit imports scheduler.persistence.tables: the planner is pure: no I/O",
    ]


def test_the_checker_counts_a_crowded_folder() -> None:
    files = [f"bench/m{i}.py" for i in range(21)] + [f"catalog/m{i}.py" for i in range(20)]
    files += [f"tests/unit/t{i}.py" for i in range(30)] + ["bench/data.csv", "setup.py"]
    assert crowded_folders(files) == {"bench": 21}


def test_the_checker_sees_a_bench_room_reaching_into_another() -> None:
    graph = {
        "bench.api.reports": {"bench.shared.common", "llmgw.api.app"},
        "bench.api.batch": {"bench.api.reports", "bench.placement.fleets"},
        "bench.shared.gen": {"bench.events.append", "catalog"},
        "bench.__main__": {"bench.events.append"},
    }
    assert layer_violations(graph) == [
        "bench.api.batch imports bench.placement.fleets: bench.api may import "
        + ", ".join((*_PRODUCT, "bench.shared"))
        + " (MAY_IMPORT)",
        "bench.shared.gen imports bench.events.append: bench.shared may import "
        + ", ".join(_PRODUCT)
        + " (MAY_IMPORT)",
    ]


def test_the_checker_lets_a_module_name_its_own_ancestor(tmp_path: Path) -> None:
    graph = _tree(
        tmp_path,
        {
            "catalog/__init__.py": '"""x"""',
            "catalog/rules.py": "",
            "events/__init__.py": '"""x"""',
            "events/core/__init__.py": '"""x"""',
            "events/core/types.py": "from events import core\nfrom events import catalog_service\n",
            "events/catalog_service.py": "",
        },
    )
    # ``from events import core`` names the package the module runs inside anyway; the
    # front door beside it (events.catalog_service) is a floor above.
    assert layer_violations(graph) == [
        "events.core.types imports events.catalog_service: events.core may import catalog "
        "(MAY_IMPORT)",
    ]
