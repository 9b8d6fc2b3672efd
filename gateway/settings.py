"""What ``llmgw gateway`` runs with (resolved by ``llmgw.gateway_settings``: flags, then
the environment, then ``[gateway]`` in ``llmgw.toml``, then these defaults)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field


def no_secrets(secret: str) -> str:
    """``GatewaySettings.engine_secret`` of a gateway given no way to look secrets up."""
    raise LookupError(
        f"secret {secret!r}: this gateway has no secrets ([gateway] secrets_dir, "
        "--secrets-dir, or the environment)"
    )


# The longest ``usage_flush_s`` may be set to.
MAX_USAGE_FLUSH_S = 60.0


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    server: str  # the control plane's URL (the first of ``servers``)
    token: str = field(repr=False)  # the gateway token (read from its file)
    # Every replica of the control plane, in order (catalog.forms.servers); (): ``server`` alone.
    servers: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8090
    # Named in signal windows and logs; several gateways run side by side.
    gateway_id: str = field(default_factory=socket.gethostname)
    # A chat body with a long context is a few hundred KB; images in base64 a few MB.
    max_body_bytes: int = 8 << 20
    # Replicas tried per model before its fallbacks (each failure sets one aside).
    attempts: int = 3
    connect_timeout_s: float = 2.0
    # Between two reads from an engine (a long answer's first byte included).
    read_timeout_s: float = 300.0
    # An engine's answer toward the client, at most (a whole answer, or a stream's
    # events): past it the answer is cut (a stream ends with an error event). A long
    # generation's stream is a few MB; an embeddings batch of 2,048 inputs x 4,096
    # dimensions is about 170 MB of JSON.
    max_answer_bytes: int = 256 << 20
    # From sending a request to an engine to its answer's last byte, at most: the read
    # timeout bounds a silence, this an engine that trickles. 32k tokens at 10 tokens/s
    # take 55 min.
    max_answer_s: float = 3600.0
    # A replica that joins a model already served gets a rising share of its weight
    # over this window (Envoy's slow start): 10% at first, all of it at the end. 0: off.
    slow_start_s: float = 30.0
    # The longest a request waits for a starting replica (and its profile's
    # startup_timeout, if shorter); then 503 with Retry-After.
    max_wait_s: float = 300.0
    # Between two signal windows posted to the control plane.
    signals_interval_s: float = 5.0
    # Between two flushes of the usage ledger to the control plane (gateway.ledger): what
    # a SIGKILLed gateway had counted and not flushed is at most this long of its traffic.
    usage_flush_s: float = 1.0
    # Between two full reads of the catalog, placements and client tokens (changes in
    # between come on the event stream).
    resync_s: float = 5.0
    # How long a prompt's token count from an engine's /tokenize is reused.
    tokenize_cache_s: float = 60.0
    # /metrics and /routing without a token (for a port only a private network reaches).
    # Off by default: /routing shows every replica's endpoint and the routing internals.
    admin_open: bool = False
    # Processes serving the port (``--workers``): Python serves from one core per process.
    workers: int = 1
    # Which of them this process is (0 for one): posted with its signal windows, where the
    # control plane counts the token's name and this number as one gateway.
    worker: int = 0
    # Connections one worker holds at once (httpguard's ``HeadLimits.max_connections``).
    max_connections: int = 800
    # The queue per model when every ready replica is full (gateway.stages.queue): its
    # length, the longest a request waits in it (or its client's shorter timeout), and
    # how long a lower class may be passed over before it goes first anyway.
    queue_max_length: int = 1024
    queue_max_wait_s: float = 60.0
    queue_starvation_s: float = 30.0
    # How long a request whose routing profile chose a replica for its cache (``prefix``,
    # ``session`` with a key) waits for that replica's slot before it takes any free one
    # (at most queue_starvation: the no-starvation bound holds). 0: it never waits for it.
    queue_hold_s: float = 5.0
    # This gateway's fixed part of each replica's slots; None (the default): dealt among
    # the live gateways, as the control plane names them (gateway.stages.slotshare).
    slot_share: float | None = None
    # Fill slots of other gateways' deals that their engines say are idle
    # (gateway.stages.borrow); False: never more than the deal.
    borrow: bool = True
    # The value of a secret by its name (``LookupError`` with what to do when this
    # gateway has none): the key an engine was started with (its profile's
    # ``VLLM_API_KEY: {secret: NAME}``), sent as ``Authorization: Bearer`` to its
    # replicas. ``llmgw.gateway_settings`` looks it up as an agent does (``[gateway]
    # secrets_dir``, then ``LLMGW_SECRET_<NAME>``), on every table built, so a key
    # rotated in its file is sent from the next one.
    engine_secret: Callable[[str], str] = field(default=no_secrets, repr=False)

    @property
    def server_list(self) -> tuple[str, ...]:
        return self.servers or (self.server,)
