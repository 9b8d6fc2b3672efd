"""``llmgw engine-check MODEL``: the model's claims held to what a ready replica answers
(engine_check does the asking and judging; this wires it to the catalog and placements)."""

from __future__ import annotations

import argparse
from pathlib import Path

from catalog.forms.text import shown
from catalog.secrecy.secrets import engine_key_secret, sendable_key
from llmgw.cli.shared.context import App, Refused, print_json


def _token(path: Path) -> str:
    try:
        words = path.read_text(errors="replace").split()
    except OSError as exc:
        raise Refused(f"--token-file {path}: {exc.strerror or exc}") from None
    if not words:
        raise Refused(f"--token-file {path} holds no token; write the client token in it")
    return words[0]


def _engine_key(
    model: str, profile: str, secret: str | None, secrets_dir: Path | None
) -> dict[str, str]:
    """The header of the key a replica's engine was started with (its profile's env
    names the secret), looked up as an agent looks it up; none for an engine without."""
    if secret is None:
        return {}
    from agent.secrets import SecretMissing, read_secret

    try:
        key = read_secret(secret, secrets_dir, who="command", put="--secrets-dir DIR")
    except SecretMissing as exc:
        raise Refused(
            f"model {model!r} profile {profile!r} starts its engine with the key of secret "
            f"{secret!r}, and the engine answers nothing without it: {exc}; or check "
            "through a gateway with --gateway URL --token-file FILE"
        ) from None
    # As the gateway sends it (gateway.table.engine_auth): visible ASCII, no space. Not
    # left to urllib, whose refusal quotes the header, the key in it, into the verdicts.
    if not sendable_key(key):
        raise Refused(
            f"secret {secret!r}: its value cannot be sent in a header (empty, or a space "
            "or a control character in it: one line end too many?); the gateway does not "
            "send it either"
        )
    return {"Authorization": f"Bearer {key}"}


def cmd_engine_check(app: App, args: argparse.Namespace) -> int:
    from engine_check.claims import exit_status
    from engine_check.probe import Target, check
    from scheduler.lifecycle.replica_reports import READY
    from scheduler.persistence.store import SchedulerStore

    model = app.service.catalog().resolve(args.model)
    if model is None:
        raise Refused(
            f"model {shown(args.model)!s} is not in the catalog; `llmgw models` lists them"
        )
    replicas = SchedulerStore(app.engine).replicas(model=model.name)
    ready = [
        (p, s)
        for p, s in replicas
        if s.state == READY and s.endpoint and (args.replica is None or p.replica == args.replica)
    ]
    if args.gateway is None and not ready:
        which = "" if args.replica is None else f" {args.replica}"
        states = ", ".join(f"[{p.replica}] {s.shown_state}" for p, s in replicas) or "none placed"
        raise Refused(
            f"model {model.name!r} has no ready replica{which} to check ({states}); wait for "
            f"one (`llmgw placements --model {model.name}`), or check through a gateway "
            "with --gateway URL --token-file FILE"
        )
    engine = "sim"
    engine_args: tuple[str, ...] = ()
    reported: tuple[int | None, str] = (None, "")
    key_secret: str | None = None
    if ready:
        placement, status = ready[0]
        profile = model.profile(placement.profile)
        if profile is not None:
            engine, engine_args = profile.engine, tuple(profile.args)
            key_secret = engine_key_secret(profile.engine, profile.env)
        reported = (status.effective_context_length, status.context_detail)
    if args.gateway is not None:
        if args.token_file is None:
            raise Refused("--gateway needs --token-file: a client token the gateway accepts")
        target = Target(
            base_url=args.gateway,
            model=model.name,
            via=f"gateway {args.gateway}",
            headers={"Authorization": f"Bearer {_token(args.token_file)}"},
            direct=False,
        )
    else:
        placement, status = ready[0]
        assert status.endpoint is not None
        target = Target(
            base_url=status.endpoint,
            model=model.name,
            via=f"replica {model.name}[{placement.replica}] at {status.endpoint}",
            headers=_engine_key(model.name, placement.profile, key_secret, args.secrets_dir),
        )
    verdicts = check(model, target, engine=engine, reported=reported, args=engine_args)
    code = exit_status(verdicts)
    if args.json:
        print_json(
            {
                "model": model.name,
                "via": target.via,
                "ok": code == 0,
                "verdicts": [v.to_json() for v in verdicts],
            }
        )
        return code
    print(f"engine-check {shown(model.name)} via {shown(target.via)}")
    if not verdicts:
        print("  nothing to check: the model claims no capabilities and no context_length")
    for v in verdicts:
        print(f"  {v.line()}")
    failed = sum(v.failed for v in verdicts)
    if failed:
        print(
            f"{failed} claim(s) refused: correct the model's capabilities or context_length "
            "in its definition (the catalog file for a declared model, else `llmgw apply`), "
            "or the engine's args"
        )
    return code
