"""The catalog as it was at a log position: ``show --at`` and ``diff``.

Replays the log's prefix, starting from the newest usable snapshot at or
before the position (events.read.snapshots) when one is given, so that looking at
yesterday's catalog on a long log does not replay it from the beginning. The
result is the same either way: a snapshot is the replay state at its position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from catalog import Catalog
from events.read.replay import Replayer
from events.storage.log import Log

if TYPE_CHECKING:
    from events.read.snapshots import Snapshots


def _replayer(
    declared: Catalog,
    config_path: str,
    snapshots: Snapshots | None,
    at_most: int | None,
) -> Replayer:
    if snapshots is not None and at_most != 0:
        restored = snapshots.load(declared, config_path, at_most=at_most)
        if restored.replayer is not None:
            return restored.replayer
    return Replayer.start(declared, config_path)


def catalog_at(
    store: Log,
    declared: Catalog,
    position: int | None,
    *,
    config_path: str = "catalog.yaml",
    snapshots: Snapshots | None = None,
) -> tuple[int, Catalog]:
    """The catalog after the events up to ``position`` (None: the head), and the
    position of the last event it includes."""
    replayer = _replayer(declared, config_path, snapshots, position)
    replayer.apply_all(store.read(after=replayer.position, until=position))
    return replayer.position, replayer.state.snapshot()


def catalogs_at(
    store: Log,
    declared: Catalog,
    positions: Sequence[int],
    *,
    config_path: str = "catalog.yaml",
    snapshots: Snapshots | None = None,
) -> list[Catalog]:
    """The catalog at each position, in one pass over the log."""
    if not positions:
        return []
    wanted = sorted(set(positions))
    replayer = _replayer(declared, config_path, snapshots, wanted[0])
    at: dict[int, Catalog] = {}
    for position in wanted:
        replayer.apply_all(store.read(after=replayer.position, until=position))
        at[position] = replayer.state.snapshot()
    return [at[p] for p in positions]
