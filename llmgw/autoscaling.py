"""Wiring the autoscaler into the scheduler: the composition root's part, no rules of its own.

The scheduler does not import ``autoscale``: its daemon takes a ``before_round`` hook
and its placer a ``wanted`` provider, and this module hands it both.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

import structlog
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from autoscale.policy import Policy
from autoscale.runner import Autoscaler, wanted_counts
from autoscale.store import AutoscaleStore
from catalog import Model
from events.catalog_service import CatalogService
from scheduler.persistence.lease_store import Fence, LeadershipLost

log = structlog.get_logger("llmgw.autoscale")


def autoscaler(engine: Engine, catalog: CatalogService, policy: Policy) -> Autoscaler:
    def models() -> tuple[Sequence[Model], int]:
        return catalog.catalog().models(), catalog.position

    return Autoscaler(AutoscaleStore(engine), models, policy)


def hook(scaler: Autoscaler) -> Callable[[datetime, Fence | None], None]:
    """The daemon's ``before_round``: a tick that never stops placement.

    A database error or a bug in a decision is logged (``autoscale.round_failed``) and
    the placement round goes on with the counts last recorded. A tick refused by the
    leadership lease's fence wrote nothing (``autoscale.fenced``); the round's own
    writes are refused by the same fence.
    """

    def tick(now: datetime, fence: Fence | None) -> None:
        try:
            scaler.tick(now, fence)
        except LeadershipLost as lost:
            log.warning("autoscale.fenced", reason=str(lost))
        except DBAPIError as exc:
            log.error("autoscale.round_failed", error=str(exc.orig or exc).strip().splitlines()[0])
        except Exception as exc:  # a bug must not stop placement
            log.error(
                "autoscale.round_failed",
                error=repr(exc),
                traceback="".join(traceback.format_exception(exc)),
            )

    return tick


def wanted(engine: Engine, policy: Policy) -> Callable[[], Mapping[str, int]]:
    """The placer's provider of the autoscaler's counts, read from the recorded decisions."""
    store = AutoscaleStore(engine)
    return lambda: wanted_counts(store, policy)
