"""The serve's usage roll-up: a thread that, every ``INTERVAL_S``, sums the closed
minutes' pending usage rows into ``usage.recorded`` events (events.write.usage.roll_up),
off the request path; and once more when the server stops gracefully, for every row
pending (the minute still open included: a flush of it arriving later is one more
event of that minute, summed on reading).

Several control planes on one database may all run it: each pass is one write section
of the log, so they take turns and a row is summed once. A failed pass (the database
away) is logged and tried again at the next; the rows wait in the table meanwhile,
counted by the ledger's reads.
"""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime, timedelta

import structlog

from events.write.usage import MAX_PASS, RollUp, roll_up
from llmgw.api.runtime.services import Services

log = structlog.get_logger("llmgw.api")

INTERVAL_S = 5.0
# ``LLMGW_USAGE_ROLLUP_S`` sets it (seconds, from 0.05 to 3600); anything else is the default.
ENV = "LLMGW_USAGE_ROLLUP_S"
# A pass at stop sums every pending row: as if every minute were closed.
_ALL = timedelta(days=1)


def interval_from(env: dict[str, str] | os._Environ[str]) -> float:
    try:
        value = float(env.get(ENV, INTERVAL_S))
    except ValueError:
        return INTERVAL_S
    return value if 0.05 <= value <= 3600 else INTERVAL_S


class UsageRollup:
    def __init__(self, services: Services, interval: float | None = None) -> None:
        self.services = services
        self.interval = interval_from(os.environ) if interval is None else interval
        self._stop = threading.Event()
        self._failing = False
        # The unreadable rows already named: each is logged once, not every pass.
        self._named: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="llmgw-usage-rollup", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then roll up every pending row (the graceful stop's pass)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)
        self._pass(datetime.now(UTC) + _ALL, final=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._pass(datetime.now(UTC))

    def _pass(self, now: datetime, *, final: bool = False) -> None:
        try:
            after = 0
            while True:
                with self.services.writing:
                    done = roll_up(self.services.store, now, after=after, most=MAX_PASS)
                self._report(done, final)
                if done.read < MAX_PASS:
                    break
                # A whole pass read: on from where it stopped (rows it skipped stay,
                # and are not read first again).
                after = done.last_id
            if self._failing:
                self._failing = False
                log.info("api.usage_rollup_back")
        except Exception as exc:  # any failure means the same: the rows wait, retry
            if not self._failing or final:
                self._failing = True
                log.warning("api.usage_rollup_failed", error=str(getattr(exc, "orig", exc))[:300])

    def _report(self, done: RollUp, final: bool) -> None:
        if done.events:
            self.services.metrics.events_appended.labels("usage.recorded").inc(done.events)
            log.info(
                "api.usage_rolled_up",
                rows=done.rows,
                events=done.events,
                positions=list(done.positions or ()),
                minutes=done.minutes[:10],
                final=final,
            )
        new = [s for s in done.skipped if s.name not in self._named]
        for skipped in new[:10]:
            log.warning("api.usage_row_skipped", row=skipped.name, reason=skipped.reason)
        self._named.update(s.name for s in new)
