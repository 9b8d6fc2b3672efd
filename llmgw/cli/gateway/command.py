"""``llmgw gateway``: the data plane (see ``gateway/``). This module only wires settings
to it."""

from __future__ import annotations

import argparse
import signal
from types import FrameType

from llmgw import logs
from llmgw.cli.shared.context import App, Refused


def cmd_gateway(app: App, args: argparse.Namespace) -> int:
    logs.configure(default_level="INFO", buffered=True)
    from gateway import main as gateway_main
    from llmgw.gateway_settings import resolve_gateway
    from llmgw.settings import SettingsError

    try:
        settings = resolve_gateway(vars(args), app.settings.source)
    except SettingsError as exc:
        raise Refused(str(exc)) from None
    try:
        sock = gateway_main.listen(settings.host, settings.port)
    except OSError as exc:
        raise Refused(
            f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}"
        ) from None
    if settings.workers > 1:
        return gateway_main.run_workers(settings, sock, settings.workers)
    # uvicorn raises the signal that stopped it again once it has shut down; this handler
    # takes it, so a stop by SIGTERM or Ctrl-C exits 0.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stopped)
    return gateway_main.run(settings, sock)


def _stopped(signum: int, frame: FrameType | None) -> None:
    del signum, frame
