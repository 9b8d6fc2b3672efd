"""Realistic event logs, written straight into the table in bulk, and cached.

A log of a million events takes minutes to write through the commands (each
add validated against the whole catalog and fsynced), so the benchmark logs
are generated: the rows are exactly what ``CatalogService`` would have written
(the payload of an add is ``{"model": m.to_definition(), ...}`` of a
normalised model, written as the commands write it: ``PayloadFormat.text``),
positions are gapless from 1, one
``recorded_at`` and ``command_id`` per command, keyed commands carry the key as
event id and ``KEY#2``... for the rest of a list), and a few rows are bad in
the ways a real log can be: torn JSON, an unknown type, a newer schema
version, an invalid definition from an older release, a model colliding with
one declared since, the removal of an absent or declared model, and a model
whose fallback has since gone. Replay must skip exactly those, which the
replay benchmark checks.

The mix, after a fill-up to a few thousand live models: about half adds and
half removes (churn), some list adds of 2-4 models that fall back to each
other, aliases on a third of the models and fallbacks on a quarter.
"""

from __future__ import annotations

import copy
import json
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import Engine, insert, text

from bench.shared import common
from catalog import Catalog, parse_model
from events.database.connection import make_engine
from events.database.migrate import upgrade
from events.database.tables import EventRow

# Bump when the generated rows change, so cached logs are regenerated.
GEN_VERSION = 4
SEED = 20261202

# Declared models: what catalog.yaml holds. Runtime events collide with them now and then.
_DECLARED_RAW: list[dict[str, Any]] = [
    {
        "name": f"prod-{i}",
        "aliases": [f"prod-{i}-latest"],
        "source": f"org/prod-{i}",
        "scaling": {"min": 1, "max": 4},
        "profiles": [
            {"name": "a100-tp2", "gpu_class": "A100", "tp": 2, "priority": 10},
            {"name": "t4-tp4", "gpu_class": "T4", "tp": 4},
        ],
    }
    for i in range(20)
]

# The shapes runtime models come in: each parsed once, then varied by name.
_TEMPLATES_RAW: list[dict[str, Any]] = [
    {
        "source": "meta-llama/Llama-3.1-8B-Instruct",
        "scaling": {"min": 1, "max": 4},
        "context_length": 131072,
        "max_output": 8192,
        "capabilities": {"tools": True},
        "slo": {"ttft_p99": "2s", "tpot_p99": "80ms"},
        "routing_profile": "latency",
        "profiles": [
            {"name": "a100-tp1", "gpu_class": "A100", "priority": 10},
            {"name": "t4-tp2", "gpu_class": "T4", "tp": 2, "priority": 5},
        ],
    },
    {
        "source": "meta-llama/Llama-3.1-70B-Instruct",
        "scaling": {"min": 2, "max": 6},
        "context_length": 131072,
        "max_output": 8192,
        "profiles": [
            {
                "name": "a100-tp8",
                "gpu_class": "A100",
                "tp": 8,
                "priority": 10,
                "startup_timeout": "40m",
                "args": ["--max-num-seqs", "256", "--enable-prefix-caching"],
                "env": {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"},
            },
            {"name": "g2-2x4", "gpu_class": "G2", "tp": 8, "nodes": 2, "priority": 5},
        ],
    },
    {
        "source": "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
        "profiles": [
            {
                "name": "cpu",
                "engine": "llamacpp",
                "min_memory_gb": 4,
                "node_selector": {"pool": "cpu"},
            }
        ],
    },
    {
        "source": "Qwen/Qwen2.5-7B-Instruct",
        "scaling": {"min": 2},
        "context_length": 32768,
        "profiles": [
            {"name": "t4-tp2", "gpu_class": "T4", "tp": 2, "priority": 10},
            {"name": "p100-tp2", "gpu_class": "P100", "tp": 2, "priority": 5},
            {"name": "v100-tp1", "gpu_class": "V100M32", "min_memory_gb": 32},
        ],
    },
    {
        "source": "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "scaling": {"min": 1, "max": 2},
        "capabilities": {"tools": True, "vision": False},
        "profiles": [
            {"name": "g3-tp4", "gpu_class": "G3", "tp": 4, "node_selector": {"zone": "eu"}},
            {
                "name": "v100-pp2",
                "gpu_class": "V100M32",
                "tp": 4,
                "pp": 2,
                "nodes": 2,
                "gpus_per_node": 4,
            },
        ],
    },
    {
        "source": "BAAI/bge-m3",
        "capabilities": {"embeddings": True},
        "context_length": 8192,
        "profiles": [{"name": "t4", "gpu_class": "T4", "weight": 2.5}],
    },
    {
        "source": "sim/echo",
        "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM"}],
    },
]

_ACTORS = ["alice", "bob", "carol", "ci-deploy", "dave"]
_REASONS = ["", "", "try before review", "load test", "trial over", "rollback", "canary"]
LIVE_TARGET = 3_000  # live runtime models once filled up
BASE_MODELS = 200  # long-lived runtime models that others fall back to; never removed


def declared_catalog() -> Catalog:
    return Catalog.build([parse_model(d) for d in _DECLARED_RAW], declared=True)


# How the commands have written a payload's text, by release: compact JSON in the
# definition's field order (events.write.apply.definition_payload) since issue 13's append
# work, ``json.dumps(..., sort_keys=True)`` before. The probe finds which one the
# tree it runs against writes (bench.shared.ab compares two trees), and the generator
# writes the same bytes.
TEXT_FORMATS: dict[str, Callable[[dict[str, Any]], str]] = {
    "compact": lambda data: msgspec.json.encode(data).decode(),
    "json.dumps sort_keys": lambda data: json.dumps(data, sort_keys=True),
}


@dataclass(frozen=True)
class PayloadFormat:
    """How this release's commands write events, learnt by running them once (``probe``).

    An add's payload is ``{"model": definition, **added_extra}`` written as
    ``text`` says (``TEXT_FORMATS``); the generator writes exactly that, so when
    the commands change what they record (a new key, a new schema version, how
    the text is written) the generated logs follow, and the cache stamp changes
    with them.
    """

    added_extra: dict[str, Any]
    added_version: int
    removed_version: int
    hash_chain: bool
    text: str

    def payload(self, data: dict[str, Any]) -> str:
        return TEXT_FORMATS[self.text](data)

    def stamp(self) -> str:
        return json.dumps(
            [
                self.added_extra,
                self.added_version,
                self.removed_version,
                self.hash_chain,
                self.text,
            ],
            sort_keys=True,
        )


@cache
def probe() -> PayloadFormat:
    """Add and remove one model through ``CatalogService`` on a scratch SQLite file, and read
    back what was written: the shape every generated event then takes."""
    open_log = log_opener()

    common.CACHE.mkdir(exist_ok=True)
    path = common.CACHE / "probe.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    engine = make_engine(f"sqlite:///{path}")
    try:
        upgrade(engine)
        store = open_log(engine)
        service = make_service(store, declared_catalog())
        probe_model = parse_model({"name": "probe", **_TEMPLATES_RAW[0]})
        service.add([probe_model], actor="bench")
        service.remove("probe", actor="bench")
        added, removed = list(store.read())
        data = json.loads(added.payload)
        definition = data.pop("model")
        if definition != probe_model.to_definition():
            raise AssertionError("an add no longer records to_definition() under 'model'")
        texts = [
            name
            for name, write in TEXT_FORMATS.items()
            if added.payload == write({"model": definition, **data})
        ]
        if not texts:
            raise AssertionError("an add's payload is written in a form the generator lacks")
        if removed.payload != json.dumps({"name": "probe"}):
            raise AssertionError("a removal's payload is no longer {'name': ...}")
        columns = set(EventRow.__table__.c.keys())
        found = PayloadFormat(
            added_extra=data,
            added_version=added.schema_version,
            removed_version=removed.schema_version,
            hash_chain={"prev_hash", "hash"} <= columns,
            text=texts[0],
        )
    finally:
        engine.dispose()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return found


def log_opener() -> Any:
    """``open_log`` (or, in a release before it, the ``EventStore`` class): engine -> log."""
    try:
        from events.storage.backends import open_log
    except ImportError:  # a release before the log's modules were split
        from events import EventStore  # type: ignore[attr-defined]

        return EventStore
    return open_log


def make_service(store: Any, declared: Catalog, **kwargs: Any) -> Any:
    """A ``CatalogService`` that takes no snapshots unless asked (where the release has them)."""
    try:
        from events.catalog_service import CatalogService
    except ImportError:  # a release before the read model and commands were split
        from events import CatalogService  # type: ignore[attr-defined,no-redef]

    try:
        return CatalogService(store, declared, "catalog.yaml", **{"snapshot_every": None, **kwargs})
    except TypeError:
        return CatalogService(store, declared, "catalog.yaml")


def templates() -> list[dict[str, Any]]:
    """Each template as ``to_definition`` gives it: normalised, every default applied."""
    return [parse_model({"name": "template", **raw}).to_definition() for raw in _TEMPLATES_RAW]


@dataclass
class LogStats:
    events: int = 0
    adds: int = 0
    removes: int = 0
    list_commands: int = 0
    bad: int = 0
    bad_kinds: dict[str, int] = field(default_factory=dict)
    bad_positions: list[int] = field(default_factory=list)
    live_at_end: int = 0

    def bad_until(self, position: int) -> int:
        """How many deliberately bad events the first ``position`` events hold."""
        return sum(1 for p in self.bad_positions if p <= position)


class _Generator:
    def __init__(self, total: int, seed: int, *, adds_only: bool = False) -> None:
        self.total = total
        self.adds_only = adds_only
        self.rng = random.Random(seed)
        self.templates = templates()
        self.declared = declared_catalog()
        self.declared_names = [m.name for m in self.declared.models()]
        self.declared_aliases = [a for m in self.declared.models() for a in m.aliases]
        self.position = 0
        self.serial = 0
        self.now = datetime(2026, 1, 1, tzinfo=UTC)
        self.live: dict[str, tuple[str, ...]] = {}  # name -> its aliases
        self.removable: list[str] = []  # live, not base, nobody falls back to them
        self.removable_at: dict[str, int] = {}
        self.base: list[str] = []
        self.gone: list[str] = []  # removed names, for "fallback has since gone"
        self.unlocks: dict[str, str] = {}  # removing the key frees the value for removal
        self.stats = LogStats()
        self.format = probe()

    # -- ids and rows -------------------------------------------------------

    def _uuid(self) -> str:
        return uuid.UUID(int=self.rng.getrandbits(128), version=4).hex

    def _command(self, events: list[tuple[str, str | None, str, int]]) -> list[dict[str, Any]]:
        """Rows for one command: (type, model, payload, schema_version) each."""
        self.now += timedelta(milliseconds=self.rng.randint(1, 30_000))
        keyed = self.rng.random() < 0.1
        key = f"deploy-{self.serial}-{self._uuid()[:8]}" if keyed else None
        command_id = key or self._uuid()
        actor = self.rng.choice(_ACTORS)
        reason = self.rng.choice(_REASONS)
        rows = []
        for i, (type_, model, payload, version) in enumerate(events, start=1):
            self.position += 1
            event_id = (key if i == 1 else f"{key}#{i}") if key else self._uuid()
            rows.append(
                {
                    "position": self.position,
                    "event_id": event_id,
                    "command_id": command_id,
                    "type": type_,
                    "schema_version": version,
                    "model": model,
                    "payload": payload,
                    "actor": actor,
                    "reason": reason,
                    "recorded_at": self.now,
                }
            )
        self.stats.events += len(rows)
        return rows

    def _definition(self, name: str, aliases: list[str], fallbacks: list[str]) -> dict[str, Any]:
        body = dict(self.rng.choice(self.templates))
        body["name"] = name
        body["aliases"] = aliases
        body["fallbacks"] = fallbacks
        body["source"] = f"{body['source']}@rev{self.serial}"
        return body

    def _added(self, body: dict[str, Any]) -> tuple[str, str | None, str, int]:
        payload = self.format.payload({"model": body, **self.format.added_extra})
        return ("model.added", body["name"], payload, self.format.added_version)

    def _removed(self, name: str) -> tuple[str, str | None, str, int]:
        return ("model.removed", name, json.dumps({"name": name}), self.format.removed_version)

    def _new_name(self) -> str:
        self.serial += 1
        return f"m{self.serial:07d}-{self.rng.choice(['llama', 'qwen', 'mixtral', 'bge', 'phi'])}"

    def _aliases(self, name: str) -> list[str]:
        roll = self.rng.random()
        if roll < 0.25:
            return [f"{name}-latest"]
        if roll < 0.33:
            return [f"{name}-latest", f"{name}-stable"]
        return []

    def _fallbacks(self) -> list[str]:
        roll = self.rng.random()
        if roll < 0.18 and self.base:
            return [self.rng.choice(self.base)]
        if roll < 0.25:
            return [self.rng.choice(self.declared_names + self.declared_aliases)]
        return []

    def _accept(self, name: str, aliases: list[str], *, base: bool, depended: bool) -> None:
        self.live[name] = tuple(aliases)
        if base:
            self.base.append(name)
        elif not depended:
            self.removable_at[name] = len(self.removable)
            self.removable.append(name)
        self.stats.adds += 1

    def _take_removable(self) -> str:
        index = self.rng.randrange(len(self.removable))
        name = self.removable[index]
        last = self.removable.pop()
        if last != name:
            self.removable[index] = last
            self.removable_at[last] = index
        del self.removable_at[name]
        return name

    # -- commands -----------------------------------------------------------

    def add_one(self) -> list[dict[str, Any]]:
        name = self._new_name()
        aliases = self._aliases(name)
        fallbacks = self._fallbacks()
        base = len(self.base) < BASE_MODELS
        body = self._definition(name, aliases, [] if base else fallbacks)
        self._accept(name, aliases, base=base, depended=False)
        return self._command([self._added(body)])

    def add_list(self) -> list[dict[str, Any]]:
        """2-4 models in one command; each after the first falls back to the one before."""
        count = self.rng.randint(2, 4)
        events = []
        previous: str | None = None
        names = []
        for _ in range(count):
            name = self._new_name()
            aliases = self._aliases(name)
            fallbacks = [previous] if previous else self._fallbacks()
            events.append(self._added(self._definition(name, aliases, fallbacks)))
            names.append((name, aliases))
            previous = aliases[0] if aliases and self.rng.random() < 0.5 else name
        # Only the last can be removed without stranding a fallback; removing it
        # frees the one before it, and so on down the chain.
        for i, (name, aliases) in enumerate(names):
            self._accept(name, aliases, base=False, depended=i < len(names) - 1)
            if i > 0:
                self.unlocks[name] = names[i - 1][0]
        self.stats.list_commands += 1
        return self._command(events)

    def remove_one(self) -> list[dict[str, Any]]:
        name = self._take_removable()
        del self.live[name]
        freed = self.unlocks.pop(name, None)
        if freed is not None:
            self.removable_at[freed] = len(self.removable)
            self.removable.append(freed)
        self.gone.append(name)
        self.stats.removes += 1
        return self._command([self._removed(name)])

    def bad_one(self) -> list[dict[str, Any]]:
        kinds = [
            "torn_json",
            "unknown_type",
            "newer_schema",
            "invalid_model",
            "declared_collision",
            "remove_absent",
            "remove_declared",
            "fallback_gone",
            "not_normalised_invalid",
        ]
        kind = self.rng.choice(kinds)
        self.stats.bad += 1
        self.stats.bad_kinds[kind] = self.stats.bad_kinds.get(kind, 0) + 1
        name = self._new_name()
        if kind == "torn_json":
            type_, model, text, version = self._added(self._definition(name, [], []))
            return self._command([(type_, model, text[: len(text) // 2], version)])
        if kind == "unknown_type":
            return self._command([("model.renamed", name, json.dumps({"name": name}), 1)])
        if kind == "newer_schema":
            newer = self.format.added_version + 5
            return self._command([(*self._added(self._definition(name, [], []))[:3], newer)])
        if kind == "invalid_model":
            # Written by an older release: 3 nodes x 1 GPU does not add up to TP 4.
            body = self._definition(name, [], [])
            body["profiles"] = [
                {
                    **body["profiles"][0],
                    "gpu_class": "A100",
                    "tp": 4,
                    "nodes": 3,
                    "gpus_per_node": 1,
                }
            ]
            return self._command([self._added(body)])
        if kind == "not_normalised_invalid":
            # A tampered row: a field of the wrong type.
            body = self._definition(name, [], [])
            body["context_length"] = "131072"
            return self._command([self._added(body)])
        if kind == "declared_collision":
            # A model declared since this was added: configuration wins.
            clash = self.rng.choice(self.declared_aliases)
            return self._command([self._added(self._definition(name, [clash], []))])
        if kind == "remove_absent":
            return self._command([self._removed(name)])
        if kind == "remove_declared":
            victim = self.rng.choice(self.declared_names)
            return self._command([self._removed(victim)])
        # fallback_gone: falls back to a model removed earlier (or never added).
        target = self.rng.choice(self.gone) if self.gone else "never-added"
        return self._command([self._added(self._definition(name, [], [target]))])

    def commands(self) -> Iterator[list[dict[str, Any]]]:
        if self.adds_only:
            while self.position < self.total:
                yield self.add_one()
            self.stats.live_at_end = len(self.live)
            return
        while self.position < self.total:
            live = len(self.live)
            roll = self.rng.random()
            if roll < 0.001:
                rows = self.bad_one()
                self.stats.bad_positions.append(rows[-1]["position"])
            elif live < LIVE_TARGET or not self.removable:
                rows = self.add_list() if roll < 0.05 else self.add_one()
            elif roll < 0.03:
                rows = self.add_list()
            elif roll < (0.44 if live > LIVE_TARGET else 0.56):
                rows = self.add_one()
            else:
                rows = self.remove_one()
            overflow = self.position - self.total
            if overflow > 0:
                # A list add ran past the end: cut the log at the size asked for.
                # (What was cut is not counted; a prefix of a log is a log.)
                rows = rows[: len(rows) - overflow]
                self.position = self.total
                self.stats.events -= overflow
            yield rows
        self.stats.live_at_end = len(self.live)


def generate(
    total: int, seed: int = SEED, *, adds_only: bool = False
) -> tuple[Iterator[list[dict[str, Any]]], LogStats]:
    """The rows of a log of ``total`` events, command by command, and its (filling) stats.

    ``adds_only``: a catalog of ``total`` models, one add each, nothing removed.
    """
    gen = _Generator(total, seed, adds_only=adds_only)
    return gen.commands(), gen.stats


# -- writing to the stores ---------------------------------------------------------


def _chain(rows: list[dict[str, Any]], prev_hash: str) -> str:
    """Fill in ``prev_hash`` and ``hash`` as ``SqlLog.append`` does; the last hash."""
    from events.core.chain import event_hash

    for row in rows:
        row["prev_hash"] = prev_hash
        prev_hash = event_hash(
            prev_hash,
            row["position"],
            row["event_id"],
            row["command_id"],
            row["type"],
            row["schema_version"],
            row["model"],
            row["payload"],
            row["actor"],
            row["reason"],
            row["recorded_at"],
        )
        row["hash"] = prev_hash
    return prev_hash


def _write(engine: Engine, total: int, *, adds_only: bool = False) -> LogStats:
    upgrade(engine)
    commands, stats = generate(total, adds_only=adds_only)
    table: Any = EventRow.__table__
    chained = probe().hash_chain
    prev_hash = ""
    if chained:
        from events.core.chain import GENESIS

        try:
            from events.storage.chain_rows import read_seal
        except ImportError:  # a release before the log's modules were split
            from events import EventStore  # type: ignore[attr-defined]

            def read_seal(engine: Engine) -> Any:  # type: ignore[misc]
                return EventStore(engine).seal()

        seal = read_seal(engine)
        prev_hash = GENESIS if seal is None else seal.hash
    batch: list[dict[str, Any]] = []
    with engine.begin() as conn:
        for rows in commands:
            if chained:
                prev_hash = _chain(rows, prev_hash)
            batch.extend(rows)
            if len(batch) >= 20_000:
                conn.execute(insert(table), batch)
                batch = []
                common.progress(f"  ... {rows[-1]['position']:,} events")
        if batch:
            conn.execute(insert(table), batch)
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE events"))
    return stats


def _stamp(total: int, kind: str = "log") -> str:
    from events.database.migrate import head_revision

    fmt = probe().stamp()
    return (
        f"llmgw-bench-{kind} v{GEN_VERSION} seed {SEED} events {total} "
        f"schema {head_revision()} format {fmt}"
    ).replace("'", "")


def _parse_stats(stamp_text: str) -> LogStats | None:
    _, _, payload = stamp_text.partition("\n")
    if not payload:
        return None
    data = json.loads(payload)
    return LogStats(**data)


def _stats_json(stats: LogStats) -> str:
    return json.dumps(stats.__dict__, sort_keys=True)


def sqlite_log(total: int, *, adds_only: bool = False) -> tuple[str, LogStats]:
    """A SQLite file holding a generated log of ``total`` events (cached under bench/.cache)."""
    common.CACHE.mkdir(exist_ok=True)
    kind = "catalog" if adds_only else "log"
    path = common.CACHE / f"{kind}-{total}.sqlite"
    stamp_path = Path(f"{path}.stamp")
    url = f"sqlite:///{path}"
    if path.exists() and stamp_path.exists():
        stamp_text = stamp_path.read_text(encoding="utf-8")
        stats = _parse_stats(stamp_text)
        if stamp_text.startswith(_stamp(total, kind) + "\n") and stats is not None:
            return url, stats
    common.progress(f"generating a {kind} of {total:,} events into {path} (once; cached)")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    stamp_path.unlink(missing_ok=True)
    engine = make_engine(url)
    try:
        stats = _write(engine, total, adds_only=adds_only)
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        engine.dispose()
    stamp_path.write_text(_stamp(total, kind) + "\n" + _stats_json(stats), encoding="utf-8")
    return url, stats


def pg_log(total: int, *, adds_only: bool = False) -> tuple[str, LogStats]:
    """A PostgreSQL database ``llmgw_bench_log_N`` holding the same generated log (cached)."""
    kind = "catalog" if adds_only else "log"
    database = f"llmgw_bench_{kind}_{total}"
    stamp_text = common.pg_comment(database)
    if stamp_text is not None:
        stats = _parse_stats(stamp_text)
        if stamp_text.startswith(_stamp(total, kind) + "\n") and stats is not None:
            return common.pg_url(database), stats
    common.progress(f"generating a {kind} of {total:,} events into PostgreSQL {database} (cached)")
    common.pg_recreate(database)
    engine = make_engine(common.pg_url(database))
    try:
        stats = _write(engine, total, adds_only=adds_only)
    finally:
        engine.dispose()
    common.pg_set_comment(database, _stamp(total, kind) + "\n" + _stats_json(stats))
    return common.pg_url(database), stats


def copy_sqlite(source_url: str, name: str) -> str:
    """A scratch copy of a cached SQLite log (for benchmarks that write)."""
    import shutil

    source = Path(source_url.removeprefix("sqlite:///"))
    target = common.CACHE / name
    for suffix in ("", "-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    shutil.copy(source, target)
    return f"sqlite:///{target}"


def sample_check(total: int = 2_000) -> None:
    """Generated adds are byte for byte what ``CatalogService.add`` would write."""
    commands, _ = generate(total)
    checked = 0
    for rows in commands:
        for row in rows:
            if row["type"] != "model.added":
                continue
            try:
                data = json.loads(row["payload"])
                written = parse_model(copy.deepcopy(data["model"]))
            except Exception:  # a deliberately bad row
                continue
            extra = {k: v for k, v in data.items() if k != "model"}
            expected = probe().payload({"model": written.to_definition(), **extra})
            if expected != row["payload"]:
                raise AssertionError(f"generated payload at {row['position']} is not canonical")
            checked += 1
    if checked == 0:
        raise AssertionError("no adds checked")
