"""The agent's loop: observe the engines, report, read the placements, start and stop.

One tick, every ``interval`` seconds:

1. look at each engine: exited (failed, with its exit code and the end of
   its log), answering its health check (ready), or neither yet (starting);
2. report the node with those replica states: the full report when something changed,
   else a heartbeat (``agent.heartbeat``);
3. read the node's placements, only when they may have changed (a full report was
   sent, or the heartbeat's answer tells another placement generation than the one
   they were read under: ``_placements_now``), and apply ``reconcile.decide``; engines
   just started are reported ``starting`` at once.

When the control plane cannot be reached, steps 2 and 3 are skipped and
nothing is stopped: a network partition must not take down replicas that
are serving. The engines are stopped only when the control plane says so,
or when the agent itself is stopped (unless ``leave_engines``).

Back from a time away (a report failed, or the agent's process stood still for
``AWAY_TICKS`` intervals and a second, as when it was frozen: ``agent.liveness``; or
the agent just started), the engines running then are *held* for ``readopt_grace`` seconds: one
no longer placed on this node is not stopped yet. A control plane that gave the
node up meanwhile unplaced its replicas; the agent's report makes the node fresh,
and the next round places the replicas again where they run (the engine kept, its
fingerprint unchanged), unless another node already serves them: then the engine
is stopped once the grace is over.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from agent import context, engines, processes
from agent.client import ControlPlane, Refused, Unreachable
from agent.heartbeat import Accepted, HeartbeatChannel, digest
from agent.inventory import Inventory
from agent.liveness import Liveness
from agent.logfiles import LogLimits, rotate_if_large
from agent.placements import Key, PlacementsError, Want, parse_placements
from agent.reconcile import Backoff, Decision, Have, Start, decide
from agent.secrets import SecretMissing, resolve_env
from agent.state import Record, StateDir
from agent.states import replica_states
from catalog.secrecy.secret_args import redact_args
from catalog.secrecy.secrets import ENGINE_KEY_VARIABLES, REDACTED

log = structlog.get_logger("llmgw.agent")

FORBIDDEN = 403


class ReportsForbidden(Exception):
    """The control plane answered 403 to this node's report: the token may not report
    this node (or is a reader's). That cannot heal by retrying, because a token's nodes
    are fixed when it is issued; the fix is a token issued for this node. (A 401, a
    token the server does not know, can heal: the server takes it once it is added
    to its auth file and restarted, so the agent keeps trying then.)"""


# Back from a time away: engines no longer placed are held this long (seconds).
READOPT_GRACE = 30.0
# No report for this many intervals (and a second) is a time away, though no report
# failed: the agent itself was frozen (SIGSTOP, a suspended machine).
AWAY_TICKS = 3


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: str
    state_dir: Path
    labels: dict[str, str] = field(default_factory=dict)
    fabric: str | None = None
    interval: float = 10.0
    # Between full reports, heartbeats (agent.heartbeat); the full report at least this
    # often anyway, as the kubelet sends its status every 5 minutes.
    full_report_every: float = 300.0
    # Heartbeats as datagrams rather than on a connection (agent.heartbeat).
    heartbeat_datagrams: bool = False
    # Where engines listen, and the address the control plane and routers reach them at.
    engine_host: str = "0.0.0.0"
    advertise: str = "127.0.0.1"
    stop_grace: float = 10.0
    leave_engines: bool = False
    backoff: Backoff = field(default_factory=Backoff)
    logs: LogLimits = field(default_factory=LogLimits)
    # Where the secrets profiles name are, a file each (agent.secrets); else the environment.
    secrets_dir: Path | None = None
    # llama.cpp's server, as found at start (agent.binaries); None: not found, and a
    # llamacpp replica then fails saying where it was looked for.
    llamacpp_server: str | None = "llama-server"
    # How long, back from a time away, an engine no longer placed is held (the module):
    # two rounds' worth at the default 10 s intervals (the report, then the round that
    # places it again, then this agent's next read of its placements), and a margin.
    readopt_grace: float = READOPT_GRACE


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        inventory: Inventory,
        server: ControlPlane,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.inventory = inventory
        self.server = server
        self.clock = clock
        self.state = StateDir(config.state_dir).create()
        self.records: dict[Key, Record] = {}
        self.procs: dict[Key, processes.Engine] = {}
        self.waits: dict[Key, str] = {}
        # Replicas this node runs a worker rank of (set from each tick's placements).
        self.worker_keys: set[Key] = set()
        # Replicas the control plane already holds failed: a worker need not say so again.
        self.known_failed: set[Key] = set()
        self.stopping = threading.Event()
        # Set once the state dir is locked: from then a signal asks for a clean stop.
        self.looping = False
        self._send_replicas = True
        self._send_address = True
        self._send_profiles = True
        self._send_switches = True
        # Time away from the control plane (see the module): True until the first report.
        self._away = True
        self._last_contact: float | None = None
        # Whether the process stood still (frozen) since: agent.liveness.
        self.liveness = Liveness(AWAY_TICKS * config.interval + 1.0, clock)
        # Engines held back from a stop, and until when (the agent's clock).
        self.held: dict[Key, float] = {}
        self._held_logged: set[Key] = set()
        # The last report the control plane accepted, when it takes heartbeats.
        self.accepted: Accepted | None = None
        # What the last placements read said of each replica: a change there (a new
        # version placed, the server's state of it) is reported in full too.
        self.placed: list[tuple[str, int, str | None, str]] = []
        # The node's placement generation as the server last told it (a heartbeat's
        # answer, a report's), and the one the placements kept were read under: while the
        # two are equal the placements are not read again (see ``_placements_now``).
        self._told: int | None = None
        self._wants: list[Want] | None = None
        self._read_under: int | None = None
        self._read_at = 0.0
        self._must_read = True
        # Its host is the server that accepted the last report (with several, it changes).
        self.channel = HeartbeatChannel(
            "", timeout=min(5.0, max(config.interval, 2.0)), datagrams=config.heartbeat_datagrams
        )

    # -- the loop -------------------------------------------------------------

    def run(self) -> None:
        self.state.lock()
        self.liveness.start()
        # From here a signal asks for a clean stop (``llmgw agent``'s handler): the
        # engines adopted are this agent's to stop (unless left). Set after adoption, a
        # signal between the two ended the agent at once with its adopted engines running
        # and their records kept (seen in CI: a stop right after the adoption's log).
        self.looping = True
        try:
            self.adopt()
            self._loop()
        finally:
            self.shutdown()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.tick()
            except ReportsForbidden:
                raise  # cannot heal: the agent ends (llmgw agent exits 1 with the message)
            except Exception:
                # A bug or a full disk must not end the agent (its engines would
                # then go unwatched); it is logged and the next tick tries again.
                log.exception("agent.tick_failed")
            self.stopping.wait(self.config.interval)

    def tick(self) -> None:
        self.observe()
        if not self.report():
            return
        wants = self._placements_now()
        if wants is None:
            return
        if self._gap():
            # Frozen between the report and this read: what it says may be a control
            # plane that gave the node up meanwhile. Nothing is applied; the next tick
            # reports in full and holds the engines (``_back``).
            return
        self.worker_keys = {w.key for w in wants if w.worker}
        self.placed = sorted((w.key.model, w.key.replica, w.server_state, w.version) for w in wants)
        self.known_failed = {w.key for w in wants if w.server_state == "failed"}
        now = self.clock()
        placed = {w.key for w in wants}
        self.held = {k: until for k, until in self.held.items() if until > now and k not in placed}
        decision = decide(
            wants, self.haves(), self.inventory.devices, now, self.config.backoff, hold=self.held
        )
        self._log_held(decision)
        self.apply(decision)
        if decision.starts:
            # Said at once, not at the next tick: an engine that loads within a tick
            # would otherwise go from placed to ready with its start never reported.
            self.report()
        log.debug(
            "agent.reconciled",
            placed=len(wants),
            engines=len(self.procs),
            started=len(decision.starts),
            stopped=len(decision.stops),
            waiting=len(decision.waits),
        )

    # -- adoption -------------------------------------------------------------

    def adopt(self) -> None:
        """Take over the engines a previous run of this agent left running."""
        for record in self.state.load():
            if not record.alive or record.pid <= 0:
                self.records[record.key] = record
                continue
            if not processes.same_process(record.pid, record.start_time, record.argv):
                message = _failure(
                    None, self.state.log_path(record.key), "while the agent was not running"
                )
                self._exited(record, None, message)
                continue
            refused = processes.not_ours(record.pid, record.start_time, record.argv, record.nonce)
            if refused is not None:
                # A record naming a process this agent did not start (forged, or from an
                # agent too old to leave a nonce): adopting it would make the process
                # ours to stop. The record goes; the process is left alone.
                log.warning(
                    "agent.adoption_refused",
                    model=record.model,
                    replica=record.replica,
                    pid=record.pid,
                    record=str(self.state.record_path(record.key)),
                    reason=refused,
                    detail="the record is dropped and the process left running; if it is "
                    "an engine of an older agent, stop it by hand",
                )
                self.state.forget(record.key)
                continue
            self.records[record.key] = record
            self.procs[record.key] = processes.Engine(record.pid, record.start_time, record.argv)
            log.info(
                "agent.engine_adopted",
                model=record.model,
                replica=record.replica,
                pid=record.pid,
                port=record.port,
                devices=list(record.devices),
            )

    # -- observing engines ------------------------------------------------------

    def observe(self) -> None:
        for key, record in list(self.records.items()):
            proc = self.procs.get(key)
            if not record.alive or proc is None:
                continue
            log_path = self.state.log_path(key)
            if rotate_if_large(log_path, self.config.logs):
                log.info(
                    "agent.log_rotated",
                    model=record.model,
                    replica=record.replica,
                    log_path=str(log_path),
                    keep=self.config.logs.keep,
                )
            exited, code = proc.exit_status()
            if exited:
                self._exited(record, code, _failure(code, log_path))
                continue
            if record.worker:
                continue  # a worker serves no API: its head speaks for the replica
            # Health first: it is cheap, and a loading engine fails it; the listener
            # check reads the socket tables (processes.listens_on) once it passes.
            if (
                not record.ready
                and processes.healthy(self._health_url(record))
                and processes.listens_on(proc.pid, record.port) is not False
            ):
                self._save(replace(record, ready=True))
                log.info(
                    "agent.engine_ready",
                    model=record.model,
                    replica=record.replica,
                    endpoint=record.endpoint,
                )
            now = self.records[key]
            if now.ready and now.context_tokens is None and now.context_asks < 3:
                self._read_context(now)

    def _read_context(self, record: Record) -> None:
        """Ask the ready engine what one request may really use (agent.context)."""
        base = self._health_url(record).removesuffix(engines.HEALTH_PATH)
        variable = ENGINE_KEY_VARIABLES.get(record.engine)
        proc = self.procs.get(record.key)
        key = (
            None
            if variable is None or proc is None
            else processes.environ_value(proc.pid, variable)
        )
        found = context.read(record.engine, base, record.model, argv=record.argv, key=key)
        asks = 3 if context.probe_path(record.engine) is None else record.context_asks + 1
        if found is None:
            self._save(replace(record, context_asks=asks))
            if asks == 3 and record.engine != "sim":
                log.warning(
                    "agent.context_unknown",
                    model=record.model,
                    replica=record.replica,
                    engine=record.engine,
                    detail="the engine did not say what one request may use",
                )
            return
        self._save(
            replace(
                record, context_tokens=found.tokens, context_detail=found.detail, context_asks=asks
            )
        )
        log.info(
            "agent.engine_context",
            model=record.model,
            replica=record.replica,
            effective_context_length=found.tokens,
            context_detail=found.detail,
        )

    def _exited(self, record: Record, code: int | None, message: str) -> None:
        record = record.exited(self.clock(), code, message)
        self._save(record)
        self.procs.pop(record.key, None)
        log.warning(
            "agent.engine_failed",
            model=record.model,
            replica=record.replica,
            exit_code=code,
            message=message,
        )

    def _health_url(self, record: Record) -> str:
        host = self.config.engine_host
        local = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
        return f"http://{processes.url_host(local)}:{record.port}{engines.HEALTH_PATH}"

    # -- the control plane ------------------------------------------------------

    def report_body(self) -> dict[str, Any]:
        inv = self.inventory
        body: dict[str, Any] = {
            "gpu_class": inv.gpu_class,
            "gpus": inv.gpus,
            "memory_gb": inv.memory_gb,
            "labels": dict(self.config.labels),
            "fabric": self.config.fabric,
        }
        if self._send_address:
            # Registered with the node's first report: the one host its endpoints may name.
            body["address"] = self.config.advertise
        if self._send_replicas:
            body["replicas"] = self.replica_states()
            if not self._send_profiles:
                for entry in body["replicas"]:
                    entry.pop("profile", None)
        return body

    def replica_states(self) -> list[dict[str, Any]]:
        return replica_states(
            self.records,
            self.waits,
            node=self.config.node,
            worker_keys=self.worker_keys,
            known_failed=self.known_failed,
        )

    def report(self) -> bool:
        body = self.report_body()
        said = digest([body, self.placed])
        # Back from a time away, the report goes in full: the engines it names that are no
        # longer placed here are what the control plane places again (running copies).
        # The gap is judged both before the heartbeat and after its answer: the agent
        # may be frozen anywhere, the heartbeat's round trip too.
        if not self._gap() and self._heartbeat(said) and not self._gap():
            self._last_contact = self.clock()
            return True
        try:
            # The count of server switches is not in ``said``: a move alone sends no full
            # report; the count rides on the next one (at most full_report_every later).
            answer = self.server.report(self.config.node, body, switches=self._send_switches)
            self.accepted = Accepted.of(answer, said, self.clock(), self.server.url)
            # Something changed (or a time away, or a server that asked): read the
            # placements this tick, whatever the generation.
            self._told, self._must_read = _generation(answer), True
        except Unreachable as exc:
            self._away = True
            log.warning(
                "agent.server_unreachable",
                server=self.server.url,
                reason=str(exc),
                engines_running=len(self.procs),
            )
        except Refused as exc:
            if self._send_switches and "server_switches is not a field" in exc.detail:
                # A control plane older than the count (checked first: its refusal lists
                # the fields it knows, "address" among them).
                log.warning("agent.switches_unsupported", detail=exc.detail)
                self._send_switches = False
                return self.report()
            if self._send_address and exc.status == 422 and "address" in exc.detail:
                # A control plane older than registered addresses: report without it.
                log.warning("agent.address_unsupported", detail=exc.detail)
                self._send_address = False
                return self.report()
            if self._send_profiles and exc.status == 422 and "profile" in exc.detail:
                # A control plane older than running copies: report without profiles.
                log.warning("agent.profiles_unsupported", detail=exc.detail)
                self._send_profiles = False
                return self.report()
            if self._send_replicas and exc.status == 422 and "replicas" in exc.detail:
                # A control plane older than replica states: report the node alone.
                log.warning("agent.replicas_unsupported", detail=exc.detail)
                self._send_replicas = False
                return self.report()
            log.error("agent.report_refused", status=exc.status, detail=exc.detail)
            if exc.status == FORBIDDEN:
                raise ReportsForbidden(exc.detail) from None
            return False
        self._gap()
        self._back()
        return True

    def _gap(self) -> bool:
        """Whether the agent is away: a report failed, or the process stood still
        (frozen: SIGSTOP, a paused VM) for ``AWAY_TICKS`` intervals and a second since
        the last report that went through (``agent.liveness``). Not judged by the loop's
        own clock: frozen halfway through a tick, the agent finishes that tick after the
        thaw, and a clock read then hides the time frozen; and a tick that waited on a
        slow control plane (every call went through) is no time away."""
        last = self._last_contact
        if last is not None and self.liveness.stalled_since(last):
            self._away = True
        return self._away

    def _back(self) -> None:
        """After a report went through: hold the engines running now if it ends a time away."""
        now = self.clock()
        if self._away and self.procs:
            until = now + self.config.readopt_grace
            self.held = dict.fromkeys(self.procs, until)
            log.info(
                "agent.back",
                engines=len(self.procs),
                hold_s=self.config.readopt_grace,
                detail="engines no longer placed here are kept that long, for the "
                "control plane to place them again where they run",
            )
        self._away = False
        self._last_contact = now

    def _log_held(self, decision: Decision) -> None:
        self._held_logged &= set(self.held)
        for key in decision.held:
            if key in self._held_logged:
                continue
            self._held_logged.add(key)
            log.info(
                "agent.stop_held",
                model=key.model,
                replica=key.replica,
                until=self.held[key],
                reason="no longer placed on this node, held after a time away from the "
                "control plane: it may place the replica again here",
            )

    def _heartbeat(self, said: str) -> bool:
        """Say "nothing changed since report N" if so; whether the server took it (if
        not, the full report is sent)."""
        accepted = self.accepted
        if accepted is None or accepted.digest != said:
            return False
        if self.clock() - accepted.at >= self.config.full_report_every:
            return False
        where = urllib.parse.urlsplit(accepted.server)
        if where.scheme != "http" or not where.hostname:
            # A heartbeat carries the token in the clear: never beside a server reached by
            # https (its reports go encrypted, in full, every tick, as before heartbeats).
            return False
        if self.channel.host != where.hostname:
            self.channel.close()
            self.channel.host = where.hostname
        try:
            word, reason = self.channel.beat(self.config.node, self.server.token, accepted)
        except Unreachable as exc:
            log.info("agent.heartbeat_failed", reason=str(exc), detail="sending the full report")
            self.accepted = None
            return False
        if word == "OK":
            self._told = _generation(reason)
            return True
        self.accepted = None
        if word == "REPORT":
            log.info("agent.report_asked", detail="the server holds no such report")
        else:
            log.warning("agent.heartbeat_refused", answer=word, reason=reason)
        return False

    def _placements_now(self) -> list[Want] | None:
        """The node's placements: those read before while the server's generation for the
        node is the one they were read under (``llmgw.api.reports.placement_generations``),
        else read now. Read anyway after a full report, at least every
        ``full_report_every``, from a server that tells no generation (one of before), and
        every tick while the node runs a part of a replica spanning nodes (the head's
        endpoint, which its workers start from, is another node's report)."""
        told, now, kept = self._told, self.clock(), self._wants
        if (
            kept is not None
            and not self._must_read
            and told is not None
            and told == self._read_under
            and now - self._read_at < self.config.full_report_every
            and all(w.nnodes <= 1 for w in kept)
        ):
            return kept
        wants = self.placements()
        if wants is not None:
            self._wants, self._read_under, self._read_at = wants, told, now
            self._must_read = False
        return wants

    def placements(self) -> list[Want] | None:
        try:
            return parse_placements(self.server.placements(self.config.node), self.config.node)
        except Unreachable as exc:
            log.warning(
                "agent.server_unreachable",
                server=self.server.url,
                reason=str(exc),
                engines_running=len(self.procs),
            )
        except Refused as exc:
            log.error("agent.placements_refused", status=exc.status, detail=exc.detail)
        except PlacementsError as exc:
            log.error("agent.placements_unreadable", reason=str(exc))
        return None

    # -- acting -----------------------------------------------------------------

    def haves(self) -> list[Have]:
        return [
            Have(r.key, r.fingerprint, r.devices, r.alive, r.exited_at, r.restarts, r.version)
            for r in self.records.values()
        ]

    def apply(self, decision: Decision) -> None:
        self.stop([s.key for s in decision.stops], {s.key: s.reason for s in decision.stops})
        self.waits = {w.key: w.message for w in decision.waits}
        for w in decision.waits:
            log.info("agent.waiting", model=w.key.model, replica=w.key.replica, reason=w.message)
        for start in decision.starts:
            self.start(start)

    def start(self, start: Start) -> None:
        want = start.want
        assert want.launch is not None  # decide() starts only replicas with a launch
        key, cfg = want.key, self.config
        # A head also gathers its workers, at the port after its own (workers
        # derive it from the endpoint it reports): it needs two free in a row.
        port = self._free_port(pair=want.nnodes > 1 and not want.worker)
        log_path = self.state.log_path(key)
        record = Record(
            model=key.model,
            replica=key.replica,
            fingerprint=want.fingerprint,
            version=want.version,
            profile=want.launch.profile,
            engine=want.launch.engine,
            argv=(),
            pid=0,
            start_time=0.0,
            port=port,
            endpoint=f"http://{processes.url_host(cfg.advertise)}:{port}",
            devices=start.devices,
            started_at=self.clock(),
            restarts=start.restarts,
            rank=want.rank,
            nnodes=want.nnodes,
            nonce=secrets.token_hex(16),
        )
        try:
            gang = _gang(want, cfg.advertise, port)
            launch = replace(
                want.launch,
                env=resolve_env(want.launch.env or {}, cfg.secrets_dir),
            )
            cmd = engines.command(
                launch,
                host=cfg.engine_host,
                port=port,
                devices=start.devices,
                gang=gang,
                llamacpp_server=cfg.llamacpp_server,
            )
            if cmd.dropped:
                log.warning(
                    "agent.engine_args_dropped",
                    model=key.model,
                    replica=key.replica,
                    dropped=list(redact_args(list(cmd.dropped), REDACTED)),
                    detail="where an engine listens is the agent's (--engine-host and "
                    "a port it picks); these args were not passed on",
                )
            fd = processes.open_log(log_path)
            # The engine's log is read by whoever reads the node's files: its command
            # line is written there without the secrets an old profile may carry.
            shown = " ".join(str(a) for a in redact_args(list(cmd.argv), REDACTED))
            try:
                os.write(fd, f"llmgw agent: starting {shown}\n".encode())
            finally:
                os.close(fd)
            proc = processes.spawn(cmd, log_path, self.state.root, record.nonce)
        except (engines.UnknownEngine, SecretMissing, OSError) as exc:
            self._exited(record, None, f"cannot start the engine: {processes.printable(str(exc))}")
            return
        record = replace(record, argv=proc.argv, pid=proc.pid, start_time=proc.start_time)
        self.procs[key] = proc
        self._save(record)
        log.info(
            "agent.engine_started",
            model=key.model,
            replica=key.replica,
            engine=want.launch.engine,
            pid=proc.pid,
            port=port,
            devices=list(start.devices),
            restarts=start.restarts,
        )

    def _free_port(self, pair: bool = False) -> int:
        # The system hands out a port nobody listens on; one of our engines still
        # loading is not listening yet, so its ports are skipped by hand.
        host = self.config.engine_host
        taken = {p for r in self.records.values() if r.alive for p in (r.port, r.port + 1)}
        port = processes.free_port(host)
        for _ in range(50):
            if port not in taken and (
                not pair or (port + 1 not in taken and processes.port_free(host, port + 1))
            ):
                break
            port = processes.free_port(host)
        return port

    def stop(self, keys: list[Key], reasons: dict[Key, str]) -> None:
        procs = [self.procs[k] for k in keys if k in self.procs]
        if procs:
            processes.stop(procs, self.config.stop_grace)
        for key in keys:
            self.procs.pop(key, None)
            self.records.pop(key, None)
            self.state.forget(key)
            log.info(
                "agent.engine_stopped",
                model=key.model,
                replica=key.replica,
                reason=reasons.get(key, ""),
            )

    def shutdown(self) -> None:
        self.liveness.stop()
        self.channel.close()
        if self.config.leave_engines:
            log.info(
                "agent.engines_left",
                engines=len(self.procs),
                detail="left running; the next agent on this state dir adopts them",
            )
            return
        self.stop(sorted(self.procs), dict.fromkeys(self.procs, "the agent is stopping"))

    def _save(self, record: Record) -> None:
        self.records[record.key] = record
        self.state.save(record)


def _generation(told: Any) -> int | None:
    """A placement generation as a server tells it (a heartbeat answer's third word, a
    report answer's ``placements_generation``); None if it tells none (a server of before)."""
    if isinstance(told, dict):
        told = told.get("placements_generation")
    if isinstance(told, bool):
        return None
    if isinstance(told, int):
        return told if told >= 0 else None
    if isinstance(told, str) and 0 < len(told) <= 20 and told.isascii() and told.isdigit():
        return int(told)
    return None


def _gang(want: Want, advertise: str, port: int) -> engines.Gang | None:
    """This node's part of a replica spanning nodes; None for a replica on one node.

    The head gathers its workers at the port after its own, on the address it
    advertises; a worker reads both from the endpoint its head's agent reported.
    """
    if want.nnodes <= 1:
        return None
    if not want.worker:
        return engines.Gang(0, want.nnodes, advertise, port + 1)
    head = urllib.parse.urlsplit(want.head_endpoint or "")
    if head.hostname is None or head.port is None:
        raise engines.UnknownEngine(
            f"node {want.head} reported {want.head_endpoint!r} as the head's endpoint: "
            "not a URL with a host and port"
        )
    return engines.Gang(want.rank, want.nnodes, head.hostname, head.port + 1)


def _failure(code: int | None, log_path: Path, when: str = "") -> str:
    what = processes.describe_exit(code)
    if code is None and when:
        what = f"the engine exited {when}"
    last = processes.tail(log_path)
    return f"{what}; last log lines: {last}" if last else what
