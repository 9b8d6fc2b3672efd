"""``llmgw gateway``'s arguments and help (run by ``command``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "gateway",
        parents=[parent],
        help="the data plane: OpenAI traffic to the catalog's ready replicas",
        description="Serves /v1/chat/completions, /v1/completions, /v1/embeddings and "
        "/v1/models to clients with client tokens, routing each request to a ready replica "
        "of the model it names (by its routing_profile), with admission, retries and "
        "fallbacks. Stateless: run several side by side. Reads the catalog and placements "
        "from the control plane with a gateway token, and keeps serving from the last "
        "table it had while the control plane is unreachable. See docs/operator/gateway.md.",
    )
    p.add_argument(
        "--server",
        metavar="URL",
        action="append",
        help="the control plane's URL; its replicas' URLs: repeat it or separate them by "
        "commas (the gateway sticks to one and moves to the next when it fails; env "
        "LLMGW_SERVER; [gateway] server, a string or a list)",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help="file holding the gateway token (env LLMGW_GATEWAY_TOKEN_FILE; see "
        "`llmgw token new NAME --role gateway`)",
    )
    p.add_argument("--host", help="address to listen on ([gateway] host; default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, help="port ([gateway] port; default 8090; 0 picks a free one)"
    )
    p.add_argument(
        "--gateway-id",
        metavar="ID",
        help="this gateway's name in signal windows and logs (default the host name)",
    )
    p.add_argument(
        "--admin-open",
        action="store_const",
        const=True,
        help="serve /metrics and /routing without a token ([gateway] admin_open; by default "
        "they take an operator or reader token of the cluster, as the control plane's "
        "/metrics does): only where no one but your network reaches the port",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="worker processes serving the port ([gateway] workers; default 1, at most 64): "
        "one process uses one core, so N up to the cores you give it; each follows the "
        "control plane, posts its signals as worker N (counted as TOKEN-NAME-wN) and "
        "shares /metrics with the others",
    )
    p.add_argument(
        "--queue-max-length",
        type=int,
        metavar="N",
        help="requests a full model's queue holds ([gateway] queue_max_length; default "
        "1024); past it a request is refused 429 queue_full",
    )
    p.add_argument(
        "--queue-max-wait",
        metavar="DURATION",
        help="the longest a request waits in a full model's queue, or its client's shorter "
        "timeout ([gateway] queue_max_wait; default 60s); then 503 queue_timeout",
    )
    p.add_argument(
        "--queue-starvation",
        metavar="DURATION",
        help="a request of a lower class waiting this long goes first anyway "
        "([gateway] queue_starvation; default 30s)",
    )
    p.add_argument(
        "--queue-hold",
        metavar="DURATION",
        help="how long a request whose prefix or session key chose a full replica waits "
        "for that replica's slot before it takes any free one ([gateway] queue_hold; "
        "default 5s, at most queue_starvation; 0: never)",
    )
    p.add_argument(
        "--slow-start",
        metavar="DURATION",
        help="a replica that joins a model this gateway serves takes its full weight over "
        "this long, from 10%% ([gateway] slow_start; default 30s; 0: at once)",
    )
    p.add_argument(
        "--no-borrow",
        dest="borrow",
        action="store_const",
        const=False,
        help="never send a replica more than this gateway's deal of its slots, even when its "
        "engine says another gateway's are idle ([gateway] borrow = false; default: borrow)",
    )
    p.add_argument(
        "--slot-share",
        type=float,
        metavar="FRACTION",
        help="a fixed part of each replica's slots for this gateway ([gateway] slot_share; "
        "default: none, the slots are dealt among the live gateways, as the control plane "
        "names them)",
    )
    p.add_argument(
        "--secrets-dir",
        metavar="DIR",
        help="where the keys of engines started with one are, a file per secret, as an "
        "agent's ([gateway] secrets_dir; else the environment's LLMGW_SECRET_<NAME>): "
        "a profile's env VLLM_API_KEY: {secret: NAME} is sent as the engine's key",
    )
    p.set_defaults(run="gateway.command:cmd_gateway")
