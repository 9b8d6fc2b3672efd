"""``llmgw serve`` (the HTTP API); its bearer tokens are llmgw.cli.operate.tokens.

The web framework is imported only when ``serve`` runs, so the other commands
start as fast as before.
"""

from __future__ import annotations

import argparse
import signal
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import structlog

from llmgw.api.runtime.descriptors import make_room
from llmgw.api.runtime.settings import ApiSettings
from llmgw.cli.shared.context import EXIT_REFUSED, App, Refused
from llmgw.settings import SettingsError

if TYPE_CHECKING:  # the web framework loads only when serve runs (see the module)
    from llmgw.api.runtime.scheduler_thread import SchedulerThread
    from llmgw.api.runtime.services import Services
    from scheduler.daemon.leader import Leadership
    from scheduler.persistence.serving_policy import ServingProcess

log = structlog.get_logger("llmgw.api")


def _scheduler(
    app: App, services: Services, serving: ServingProcess
) -> tuple[SchedulerThread, Leadership]:
    """The scheduler of ``serve --with-scheduler``, and its leadership. Its connections
    are its own, with the leader's keepalives and timeouts (scheduler.daemon.leader),
    not the API's pool."""
    from events.catalog_service import CatalogService
    from llmgw.api.runtime.scheduler_thread import SchedulerThread
    from scheduler.daemon.leader import leadership_for
    from scheduler.persistence.store import SchedulerStore

    conf = app.settings
    scheduler_engine = app.scheduler_engine
    leadership = leadership_for(conf.database_url, conf.lease_s, engine=scheduler_engine)
    scheduler = SchedulerThread.build(
        catalog=CatalogService(
            app.store, app.declared, app.config_label, snapshot_key=app.snapshot_key
        ),
        store=SchedulerStore(scheduler_engine),
        policy=conf.policy,
        leadership=leadership,
        interval=conf.interval_s,
        metrics=services.metrics,
        engine=scheduler_engine,
        autoscale=conf.autoscale,
        serving=serving,
    )
    return scheduler, leadership


def cmd_serve(app: App, args: argparse.Namespace) -> int:
    conf = app.settings
    policy = conf.policy
    # Held to what the descriptor limit leaves beside the API (llmgw.api.runtime.descriptors).
    heartbeat_connections = make_room(
        conf.server.heartbeat_connections, conf.server.limits.max_connections
    )
    try:
        settings = ApiSettings.load(
            conf.auth_file,
            reads_open=conf.reads_open,
            stream_poll_s=conf.server.stream_poll_s,
            catalog_max_age_s=conf.server.catalog_max_age_s,
            policy=policy,
            endpoints=conf.server.endpoints,
            autoscale=conf.autoscale,
            heartbeat_host=conf.server.host,
            heartbeat_port=conf.server.heartbeat_port,
            heartbeat_connections=heartbeat_connections,
        )
    except (SettingsError, ValueError) as exc:
        raise Refused(str(exc)) from None

    from llmgw.api import server
    from llmgw.api.app import create_app
    from llmgw.api.runtime.services import Services
    from scheduler.daemon.leader import LeaseLeadership
    from scheduler.persistence.serving_policy import STARTED, ServingProcess, policy_fields
    from scheduler.persistence.store import SchedulerStore

    engine = app.engine  # migrates an empty database, as every command does
    services = Services.build(
        engine, app.declared, app.config_label, settings, snapshot_key=app.snapshot_key
    )
    if not len(services.book):
        log.warning(
            "api.no_tokens",
            detail="no token is configured yet: every write is refused (401) until one is "
            "issued with `llmgw token new` (taken within a second, no restart)",
        )
    # Recorded before serving, so that the CLI's views judge by what this server runs
    # with even before its first round (scheduler.persistence.serving_policy).
    serving = ServingProcess(
        "serve",
        places=conf.server.with_scheduler,
        interval_s=conf.interval_s if conf.server.with_scheduler else None,
    )
    SchedulerStore(engine).record_policy(serving, policy, why=STARTED, now=datetime.now(UTC))
    log.info("api.policy_recorded", places=serving.places, **policy_fields(policy))
    scheduler, leadership = (
        _scheduler(app, services, serving) if conf.server.with_scheduler else (None, None)
    )
    # The declared file is watched (and SIGHUP looks now): an edit is taken whole or
    # refused whole, by the API's catalog and the scheduler's alike (declared.reload).
    from llmgw.declared_watch import watch_declared

    reloaded = [services.gate.service]
    if scheduler is not None:
        reloaded.append(scheduler.daemon.placer.catalog)
    watcher = watch_declared(
        conf.config_path,
        app.declared,
        reloaded,
        services.gate.service,
        engine=engine,
        role="serve",
        on_outcome=services.metrics.observe_declared,
    )
    if watcher is not None:
        services.declared_watch.reloader = watcher.reloader
    host, port = conf.server.host, conf.server.port
    try:
        sock = server.listen(host, port)
    except OSError as exc:
        raise Refused(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    where = server.url_of(sock)
    if isinstance(leadership, LeaseLeadership):
        # `llmgw status` names the leader by the URL it serves on.
        leadership.holder = f"{where} {leadership.holder}"
    log.info("api.listening", url=where, reads_open=settings.reads_open, tokens=len(services.book))
    # uvicorn raises the signal that stopped it again once it has shut down; this handler
    # takes it, so a stop by SIGTERM or Ctrl-C exits 0, like `llmgw daemon`. A signal
    # that comes before uvicorn's own handlers are in place (after the listening line
    # below and before its start) is remembered, and the server stops as soon as it has started.
    stopping = services.stopping
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stopping.set())
    print(f"llmgw serve: listening on {where}", flush=True)
    if not server.run(
        create_app(services, scheduler=scheduler), sock, services.stopping, conf.server.limits
    ):
        print("error: the API did not start (see the log above)", file=sys.stderr)
        return EXIT_REFUSED
    if watcher is not None:
        watcher.stop()
    log.info("api.stopped")
    return 0
