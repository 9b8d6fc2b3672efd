"""What ``bench.gateway.side_by_side`` puts in front of the upstream stub, each started as
its docs say.

- ``direct``: no gateway, the stub itself (the reference every added latency is taken from).
- ``litellm``: LiteLLM's proxy from the peers' venv (``scripts/bench-peers.sh``), one Uvicorn
  worker (``--num_workers 1``, its production checklist's advice: one worker per pod, scale
  out), ``LITELLM_MASTER_KEY`` set, a config whose one model is ``openai/bench-model`` at the
  stub, ``LITELLM_LOG=ERROR`` and the local cost map (this machine has no route to the
  remote one, which would otherwise be fetched at start).
- ``vllm-router``: the Rust router from the peers' venv, the stub as its one
  ``--worker-urls``, every other flag at its default (policy ``cache_aware``).
- ``ours``: ``llmgw gateway`` as the ``--ours`` command line says, following a real control
  plane (``bench.gateway.control``) whose one ready replica is the stub.
- ``cand:KIND``: a minimal pass-through (``bench.gateway.candidates``), to choose our
  gateway's HTTP server and client by measurement.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench.gateway.control import MODEL, ControlPlane, Unavailable, stop_process
from bench.shared import common

LITELLM_KEY = "sk-llmgw-bench"
LITELLM_CONFIG = """\
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {upstream}/v1
      api_key: stub
litellm_settings:
  set_verbose: false
  json_logs: true
general_settings:
  master_key: os.environ/LITELLM_MASTER_KEY
"""
OURS_DEFAULT = (
    "{llmgw} gateway --server {server} --token-file {token_file} --host {host} --port {port}"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Target:
    key: str  # litellm, vllm-router, ours, direct, cand:KIND
    label: str
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    health: str = "/health"
    headers: dict[str, str] = field(default_factory=dict)
    path: str = "/v1/chat/completions"
    start_timeout: float = 180.0
    proc: subprocess.Popen[bytes] | None = None
    control: ControlPlane | None = None
    log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, workdir: Path) -> None:
        if not self.argv:
            return  # direct: the stub, started by the harness
        self.log = workdir / f"{self.key.replace(':', '-')}.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=workdir,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its workers are ours to stop, not the terminal's
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Unavailable(f"{self.label} exited at start: {self.log_tail()}")
            try:
                if httpx.get(self.url + self.health, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise Unavailable(f"{self.label} not healthy after {self.start_timeout:.0f} s")

    def log_tail(self) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")[-600:]

    def process(self) -> psutil.Process | None:
        return None if self.proc is None else psutil.Process(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        if self.control is not None:
            self.control.stop()


def tree_usage(proc: psutil.Process | None) -> tuple[float, int]:
    """CPU seconds (user + system) and RSS bytes of a process and all its descendants:
    LiteLLM's worker and vllm-router's threads are billed to the peer that runs them."""
    if proc is None:
        return 0.0, 0
    cpu, rss = 0.0, 0
    try:
        members = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0
    for p in members:
        try:
            times = p.cpu_times()
            cpu += times.user + times.system
            rss += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return cpu, rss


def peer_version(peers_venv: Path, package: str) -> str:
    done = subprocess.run(
        [
            str(peers_venv / "bin" / "python"),
            "-c",
            f"import importlib.metadata as m; print(m.version({package!r}))",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "?"


def litellm(peers_venv: Path, upstream: str, workdir: Path) -> Target:
    config = workdir / "litellm.yaml"
    config.write_text(LITELLM_CONFIG.format(model=MODEL, upstream=upstream))
    port = free_port()
    return Target(
        key="litellm",
        label=f"LiteLLM proxy {peer_version(peers_venv, 'litellm')}",
        argv=[
            str(peers_venv / "bin" / "litellm"),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        env={
            "LITELLM_MASTER_KEY": LITELLM_KEY,
            "LITELLM_LOG": "ERROR",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        },
        port=port,
        health="/health/liveliness",
        headers={"Authorization": f"Bearer {LITELLM_KEY}"},
    )


def vllm_router(peers_venv: Path, upstream: str, more: tuple[str, ...] = ()) -> Target:
    """``more``: further stubs, each a worker of its own (``--worker-urls`` takes them
    all), the policy still its default."""
    port = free_port()
    return Target(
        key="vllm-router",
        label=f"vllm-router {peer_version(peers_venv, 'vllm-router')}",
        argv=[
            str(peers_venv / "bin" / "vllm-router"),
            "--worker-urls",
            upstream,
            *more,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        port=port,
        health="/health",
    )


def candidate(kind: str, upstream: str) -> Target:
    port = free_port()
    return Target(
        key=f"cand:{kind}",
        label=f"pass-through {kind}",
        argv=[
            sys.executable,
            "-m",
            "bench.gateway.candidates",
            kind,
            "--upstream",
            upstream,
            "--port",
            str(port),
        ],
        env={"PYTHONPATH": str(common.REPO)},
        port=port,
        health="/healthz",
    )


def ours(
    command: str,
    llmgw: str,
    upstream: str,
    workdir: Path,
    *,
    key: str = "ours",
    label: str = "llmgw gateway",
    client_limits: tuple[str, ...] = (),
    more_upstreams: tuple[str, ...] = (),
    routing: str = "",
    slots: int = 0,
) -> Target:
    """Our gateway and the control plane it follows; Unavailable if this llmgw has none.
    ``key``/``label``: another variant of ours (``--variant``), with a control plane of
    its own. ``more_upstreams``: a replica at each of these stubs too; ``routing``: the
    model's routing profile."""
    # The command line is checked before a control plane is started for it: a variant
    # whose command does not format is named at once, and nothing was started to stop
    # (a control plane takes seconds to start and, on a busy machine, a minute).
    _argv(command, llmgw="llmgw", server="http://127.0.0.1:1", token_file="-", port=1, label=label)
    home = "control" if key == "ours" else "control-" + key.replace(":", "-")
    control = ControlPlane(
        llmgw,
        workdir / home,
        upstream,
        client_limits=client_limits,
        more_upstreams=more_upstreams,
        routing=routing,
        slots=slots,
    ).start()
    port = free_port()
    argv = _argv(
        command,
        llmgw=control.llmgw,
        server=control.url,
        token_file=str(control.gateway_token_file),
        port=port,
        label=label,
    )
    return Target(
        key=key,
        label=label,
        argv=argv,
        # Its default log level: one line per request is part of what it costs in production.
        port=port,
        health="/healthz",
        headers={"Authorization": f"Bearer {control.tokens['client']}"},
        control=control,
    )


def _argv(
    command: str, *, llmgw: str, server: str, token_file: str, port: int, label: str
) -> list[str]:
    """``--ours``'s command line with its fields filled in; Unavailable if it does not
    format or split."""
    try:
        return shlex.split(
            command.format(
                llmgw=llmgw, server=server, token_file=token_file, host="127.0.0.1", port=port
            )
        )
    except (KeyError, IndexError, ValueError) as exc:
        raise Unavailable(f"{label}: {command!r} does not format: {exc!r}") from exc


def direct(upstream_port: int) -> Target:
    return Target(key="direct", label="direct to the stub", port=upstream_port)
