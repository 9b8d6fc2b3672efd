"""``llmgw gateway``: the process. Builds the state, the follower, the signals and the
HTTP server, and runs them on one uvloop event loop until SIGTERM or SIGINT.

On SIGTERM the server stops accepting, waits for the requests in flight to finish (up
to ``GRACE_S``), flushes the usage ledger (gateway.ledger), then stops following the
control plane.

``--workers N`` (``run_workers``): one process is one core's worth of Python, so N worker
processes serve one port. The supervisor makes the listening socket, then forks the
workers, which all accept on it (the kernel hands each connection to one of them); each
worker is a whole gateway: it follows the control plane on its own (so each keeps its
routing table fresh whatever the others do), posts its own signal windows as worker
``i`` (the control plane counts them as ``<token name>-w<i>``, and the autoscaler adds
gateways' loads, so each worker counts as one gateway of its share), and writes its
metrics where any worker's ``/metrics`` reads them all (``gateway.metrics``). SIGTERM
or SIGINT to the supervisor is passed to every worker, each drains its requests as
above, and the supervisor exits when all have; a worker that dies otherwise is started
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from types import FrameType

import structlog
import uvicorn

from catalog.forms.servers import ServerList
from gateway.allowance import AllowanceClient
from gateway.engineload import EngineLoad
from gateway.engineslots import EngineSlots
from gateway.follower import Follower
from gateway.ledger import Flusher
from gateway.metrics import Metrics
from gateway.proxy import Proxy
from gateway.server import GatewayApp
from gateway.settings import GatewaySettings
from gateway.signals import Signals
from gateway.stages.quota import Quotas
from gateway.state import State
from gateway.supervise import supervised
from gateway.upstream import Upstream
from httpguard import HeadLimits
from httpguard.protocol import uvicorn_options

log = structlog.get_logger("gateway")
# How long a stop waits for the requests in flight (a long stream may take minutes; a
# deployment that needs more stops new traffic first).
GRACE_S = 60
# How long a stop waits for the background tasks (follower, signals) to end once told,
# and how often it tells them again meanwhile.
STOP_TASKS_S = 10.0
STOP_AGAIN_S = 0.5


def listen(host: str, port: int) -> socket.socket:
    sock = socket.create_server((host, port), reuse_port=False)
    sock.setblocking(False)
    return sock


def run(settings: GatewaySettings, sock: socket.socket, *, multiprocess: bool = False) -> int:
    import uvloop

    return uvloop.run(_serve(settings, sock, multiprocess))


# A worker that dies sooner than this after its start is started again only after this
# long: a worker that cannot start must not become a fork loop.
RESTART_PAUSE_S = 1.0


def run_workers(settings: GatewaySettings, sock: socket.socket, workers: int) -> int:
    """The supervisor of ``workers`` worker processes sharing ``sock`` (see the module)."""
    metrics_dir = tempfile.mkdtemp(prefix="llmgw-gateway-metrics-")
    # Read by prometheus_client when a worker writes its first figure.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    supervisor = _Supervisor(settings, sock, workers, metrics_dir)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, supervisor.stop)
    try:
        failed = supervisor.run()
    finally:
        sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    log.info("gateway.stopped", workers=workers)
    return 1 if failed else 0


class _Supervisor:
    def __init__(
        self, settings: GatewaySettings, sock: socket.socket, workers: int, metrics_dir: str
    ) -> None:
        self.settings, self.sock, self.workers = settings, sock, workers
        self.metrics_dir = metrics_dir
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (worker index, started)
        self.pid = os.getpid()
        self.stopping = False
        self.stopped_by = ""  # the signal that stopped it, logged by the loop
        self.stop_logged = False

    def stop(self, signum: int, frame: FrameType | None) -> None:
        # No log line here: the handler runs between two of the main thread's bytecodes,
        # maybe inside a write to stderr, and writing there again raises (a reentrant
        # call). The loop logs the stop when the next worker's end wakes it.
        del frame
        if not self.stopping:
            self.stopped_by = signal.Signals(signum).name
        self.stopping = True
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def start(self, index: int) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                code = _worker(self.settings, self.sock, index, self.pid)
            finally:
                flush_logs()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.children[pid] = (index, time.monotonic())
        log.info("gateway.worker_started", worker=index, pid=pid)

    def run(self) -> int:
        """Start the workers, start again any that dies, until a stop; how many failed."""
        failed = 0
        for index in range(self.workers):
            self.start(index)
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            found = self.children.pop(pid, None)
            if found is None:
                continue
            index, started = found
            code = os.waitstatus_to_exitcode(status)
            _dead(self.metrics_dir, pid)
            if self.stopping and not self.stop_logged:
                self.stop_logged = True
                log.info("gateway.stopping", signal=self.stopped_by, workers=self.workers)
            if self.stopping:
                failed += code != 0
                log.info("gateway.worker_stopped", worker=index, pid=pid, code=code)
                continue
            log.warning("gateway.worker_died", worker=index, pid=pid, code=code)
            if time.monotonic() - started < RESTART_PAUSE_S:
                time.sleep(RESTART_PAUSE_S)
            if not self.stopping:
                self.start(index)
        return failed


def flush_logs() -> None:
    """Write the log lines that wait (a logger factory that buffers has ``flush``: see
    ``llmgw.logs.BufferedLines``)."""
    flush = getattr(structlog.get_config().get("logger_factory"), "flush", None)
    if callable(flush):
        flush()


def _dead(metrics_dir: str, pid: int) -> None:
    """A worker's live gauges (in flight, ready replicas) stop counting when it ends."""
    from prometheus_client import multiprocess

    with contextlib.suppress(OSError):
        multiprocess.mark_process_dead(pid, metrics_dir)  # type: ignore[no-untyped-call]


def _worker(settings: GatewaySettings, sock: socket.socket, index: int, supervisor: int) -> int:
    # Not the supervisor's handlers. uvicorn installs its own in ``serve`` and raises the
    # signal that stopped it again once it has shut down: this one takes it, so a worker
    # stopped by SIGTERM exits 0.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _ignore)
    # Its own process group: a Ctrl-C at the terminal reaches the supervisor alone, which
    # passes one SIGTERM on (uvicorn takes a SIGINT after a SIGTERM as "stop now").
    os.setpgid(0, 0)
    _die_with_parent(supervisor)
    from prometheus_client import values

    # prometheus_client chose its value class when first imported (in the supervisor,
    # before the shared directory was named); this worker's figures go to the files.
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    own = replace(settings, gateway_id=f"{settings.gateway_id}-w{index}", worker=index)
    return run(own, sock, multiprocess=True)


def _ignore(signum: int, frame: FrameType | None) -> None:
    del signum, frame


def _die_with_parent(supervisor: int) -> None:
    """Linux: SIGTERM this worker when the supervisor dies (even by SIGKILL), so no worker
    outlives it holding the port."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != supervisor:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _switched(state: State) -> Callable[[str, str, str], None]:
    """What a move to the next control-plane replica does: a log line and the counter."""

    def switched(old: str, new: str, reason: str) -> None:
        log.warning("gateway.server_switched", server=old, to=new, reason=reason)
        state.metrics.server_switches.labels(new).inc()

    return switched


async def _serve(settings: GatewaySettings, sock: socket.socket, multiprocess: bool) -> int:
    state = State(
        settings.gateway_id,
        Metrics(multiprocess) if multiprocess else None,
        slow_start_s=settings.slow_start_s,
    )
    # Every client's rate limits and budget are shared with the other gateways through
    # the control plane's accounts, drawn in chunks (gateway.allowance); each of N
    # workers holds 1/N of a gateway's chunks and max_inflight (gateway.stages.quota).
    # Its id in the calls is this process's own: the account's credit is lent to one
    # process at a time, a worker included.
    state.quotas = Quotas(
        share=settings.workers if multiprocess else 1,
        shared=True,
        gateway=f"{settings.gateway_id[:40]}/{os.getpid()}/{secrets.token_hex(4)}",
    )
    upstream = Upstream(
        settings.connect_timeout_s, settings.read_timeout_s, settings.tokenize_cache_s
    )
    servers = ServerList(settings.server_list, on_switch=_switched(state))
    follower = Follower(state, servers, settings.token, settings.resync_s, settings.engine_secret)
    signals = Signals(state, servers, settings.token, settings.signals_interval_s, settings.worker)
    engine_slots = EngineSlots(state, follower.install)
    # The engines' own counts, for the slots another gateway leaves idle (borrowing).
    engine_load = EngineLoad(state)
    allowances = AllowanceClient(state.quotas, servers, follower.session)
    state.prepare = allowances.prepare
    flusher = Flusher(
        state.ledger,
        servers,
        settings.token,
        settings.usage_flush_s,
        worker=settings.worker,
        gateway_id=settings.gateway_id,
    )
    tasks: list[asyncio.Task[None]] = []

    async def startup() -> None:
        # What start-up made (modules, classes, settings: most of the heap) moves out of
        # the collector's reach: a full collection then walks only what requests make,
        # so its pauses, which land on whatever request is in flight, stay short.
        gc.collect()
        gc.freeze()
        # Each loop started again if it fails (gateway.supervise): one that ended for
        # good left its state frozen, the gateway serving on.
        loops = [
            ("follower", follower.run),
            ("signals", signals.run),
            ("engine-slots", engine_slots.run),
            *([("engine-load", engine_load.run)] if settings.borrow else []),
            ("allowances", allowances.run),
            ("usage-flush", flusher.run),
        ]
        for name, run in loops:
            tasks.append(asyncio.create_task(supervised(name, run), name=name))

    async def shutdown() -> None:
        await stop_tasks(tasks)
        with contextlib.suppress(Exception):
            await signals.post_once()
        # Every request has ended (uvicorn drained them first): what is held goes back.
        with contextlib.suppress(Exception):
            await allowances.close()
        # ... and the ledger is whole.
        await flusher.final()
        await follower.close()
        await signals.close()
        await engine_slots.close()
        await engine_load.close()
        await flusher.close()
        await upstream.close()

    app = GatewayApp(state, Proxy(state, upstream, settings), settings, startup, shutdown)
    config = uvicorn.Config(
        app,
        loop="none",
        # Bounded request heads (64 KiB, 100 headers -> 431; header timeout -> 408),
        # bodies (a minimum rate and a total time -> 408) and connections (the cap; the
        # oldest not being served give way), as on every server of ours: httpguard's
        # protocol. An answer's head and body in one system call (``CoalescedTransport``).
        **uvicorn_options(
            HeadLimits(keep_alive_timeout_s=30.0, max_connections=settings.max_connections),
            coalesce_writes=True,
            # Its own answers (408, 431, 503) carry the gateway's ids too.
            request_id=app.new_request_id,
        ),
        lifespan="on",
        # No X-Forwarded-For rewriting: nothing here reads the client's address, and the
        # middleware was a layer of every request (1.5% of its CPU).
        proxy_headers=False,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACE_S,
    )
    server = uvicorn.Server(config)
    host, port = sock.getsockname()[:2]
    log.info(
        "gateway.listening",
        url=f"http://{host}:{port}",
        control_plane=settings.server,
        servers=list(settings.server_list),
    )
    # One write, newline included: with several workers on one stdout (and
    # PYTHONUNBUFFERED, where print writes the text and its newline apart) two workers'
    # lines would otherwise run together ("...:43931llmgw gateway: ...").
    sys.stdout.write(f"llmgw gateway: listening on http://{host}:{port}\n")
    sys.stdout.flush()
    await server.serve(sockets=[sock])
    log.info("gateway.stopped")
    sys.stdout.flush()
    return 0


async def stop_tasks(
    tasks: list[asyncio.Task[None]], within_s: float = STOP_TASKS_S, again_s: float = STOP_AGAIN_S
) -> list[asyncio.Task[None]]:
    """Cancel ``tasks`` and wait for them, telling them again until they end or
    ``within_s`` has passed; the tasks still running then (named in the log).

    Why again: a gateway told to stop once waited on its follower for ever, SIGTERM after
    SIGTERM, its follower still polling (seen in one ``make demo`` of two). The likely
    cause, not confirmed: on Python 3.11 ``asyncio.wait_for`` can swallow a cancellation
    that lands as the awaited read completes (bpo-42130), and the follower reads its
    event stream through it in a loop. Whatever the cause, a stop must never hang on a
    background task."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(again_s, left))
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.warning("gateway.task_failed", task=task.get_name(), error=repr(task.exception()))
    if pending:
        log.warning("gateway.tasks_not_stopped", tasks=sorted(t.get_name() for t in pending))
    return sorted(pending, key=lambda t: t.get_name())
