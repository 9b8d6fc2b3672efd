"""Secrets in a profile's ``env``: held by reference, never by value. Pure.

A profile's ``env`` is served to every reader (``/v1/placements``, the event
log, the catalog) and kept in the log for ever, so a token written there is
public and permanent. A value can instead name a secret the agent holds on
its node::

    env:
      HF_TOKEN: {secret: hf-token}

and the agent resolves it when it starts the engine (its ``secrets_dir``, a
file per secret, or its environment: ``agent.secrets``). The reference is all
the catalog ever stores.

A plain value under a name that looks like a secret (``*TOKEN*``, ``*KEY*``,
``*SECRET*``, ``*PASSWORD*``, in any case, or a part such as ``MYSQL_PWD``, ``DB_PASS``,
``GOOGLE_CREDENTIALS``: catalog.secrecy.secret_words) is refused when a model is added or
applied, and in the declared file; values the log already holds from before
this rule are redacted in every read by anyone but an operator (``redact``).

The same holds for ``args``: a flag that carries a key (``--api-key``, ``--hf-token``,
...) or a value that looks like one (catalog.secrecy.secret_args) is refused, pointing to the
engine's own variable given as a reference (vLLM reads ``VLLM_API_KEY``, llama.cpp
``LLAMA_API_KEY``, both ``HF_TOKEN``), and what the log already holds is redacted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from catalog.errors import CatalogError
from catalog.secrecy.secret_args import URL_CREDENTIALS, SecretArg, redact_args, secret_args
from catalog.secrecy.secret_words import (
    NOT_SECRET_NAMES,
    SECRET_PARTS,
    SECRET_PATTERN,
    SECRET_WORDS,
)

# What a value shown in place of a secret reads as.
REDACTED = "[redacted]"
SECRET_NAME = re.compile(SECRET_PATTERN)
# Where a variable's name splits into the parts SECRET_PARTS are matched against.
_NAME_PARTS = re.compile(r"[_.-]")


def looks_secret(name: str) -> bool:
    """Whether an environment variable of this name is taken to hold a secret."""
    upper = name.upper()
    if any(word in upper for word in SECRET_WORDS):
        return True
    if upper in NOT_SECRET_NAMES:
        return False
    return any(part in SECRET_PARTS for part in _NAME_PARTS.split(upper))


def secret_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a secret, or None."""
    if not isinstance(name, str) or not SECRET_NAME.fullmatch(name):
        return (
            "must be 1-128 letters, digits or ._- starting with a letter or digit "
            "(it is a file name in the agent's secrets_dir)"
        )
    return None


def _holds_credentials(value: str) -> bool:
    """Whether an env value carries a URL's password (``HTTPS_PROXY=http://u:p@proxy``)."""
    return "://" in value and URL_CREDENTIALS.search(value) is not None


def env_var_for(secret: str) -> str:
    """The environment variable an agent reads a secret from: hf-token -> LLMGW_SECRET_HF_TOKEN."""
    return "LLMGW_SECRET_" + re.sub(r"[^A-Za-z0-9]", "_", secret).upper()


def plain_secret_problem(
    model: str, profile: str, name: str, *, credentials: bool = False
) -> CatalogError:
    """The refusal of a plain value under a secret's name, or of a URL with a password in
    it (``credentials``); the value is never repeated."""
    suggestion = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "my-secret"
    said = (
        "holds a URL with a password in it (scheme://user:password@host), in plain text"
        if credentials
        else "holds its value in plain text, and its name says it is a secret"
    )
    return CatalogError(
        f"model {model!r} profile {profile!r}: env {name} {said}; the catalog is shown "
        "to every reader and kept "
        f"in the log for ever. Write `{name}: {{secret: {suggestion}}}` and give the "
        f"agents the value as the file {suggestion} in their secrets_dir (or env "
        f"{env_var_for(suggestion)})",
        model=model,
        profile=profile,
        field=f"profiles.env.{name}",
    )


# The variable each engine reads its API key from, instead of a flag in args. An engine
# started with one answers only requests that carry it (``Authorization: Bearer``), so
# the gateway sends it too (``engine_key_secret``).
ENGINE_KEY_VARIABLES = {
    "vllm": "VLLM_API_KEY",
    "llamacpp": "LLAMA_API_KEY",
    "sim": "LLMGW_SIM_API_KEY",
}
# Both engines (and huggingface_hub under them) read a Hugging Face token from here.
HF_TOKEN_VARIABLE = "HF_TOKEN"


def engine_variable(engine: str, flag: str) -> str:
    """The environment variable ``engine`` reads the secret that ``flag`` would give."""
    flat = flag.lower().replace("_", "-")
    if "hf" in flat.split("-") or flat == "-hft":
        return HF_TOKEN_VARIABLE
    return ENGINE_KEY_VARIABLES.get(engine or "vllm", "VLLM_API_KEY")


def engine_key_secret(engine: str, env: Mapping[str, Any] | None) -> str | None:
    """The secret a profile's ``env`` gives its engine as the engine's API key (vLLM's
    ``VLLM_API_KEY: {secret: NAME}``): NAME, or None when the engine takes no key. Whoever
    sends the engine requests (the gateway, the agent asking what it runs) must send that
    secret's value, looked up as the agent looks it up (its file, or ``env_var_for``).

    A plain value there is refused at the catalog's doors; one stored before that rule
    is shown redacted to all but operators, so it names no secret: None, and the engine
    refuses the requests (the gateway says so)."""
    variable = ENGINE_KEY_VARIABLES.get(engine)
    if variable is None or not env:
        return None
    ref = env.get(variable)
    # A parsed profile's reference (catalog.definition's SecretRef, a floor above this
    # one) or its JSON form.
    name = ref.get("secret") if isinstance(ref, Mapping) else getattr(ref, "secret", None)
    if isinstance(name, str) and secret_name_problem(name) is None:
        return name
    return None


# What an engine key may hold to be sent as ``Authorization: Bearer <key>``: visible ASCII,
# no space. Anything else is never sent (a line end would end the header early).
_SENDABLE_KEY = re.compile(r"[!-~]+")


def sendable_key(value: str) -> bool:
    """Whether an engine key's value can go in a request header as it is."""
    return _SENDABLE_KEY.fullmatch(value) is not None


def plain_secret_arg_problem(
    model: str, profile: str, engine: str, found: SecretArg
) -> CatalogError:
    """The refusal of a secret in ``args`` (the value is never repeated)."""
    where = f"args[{found.index}]"
    if found.flag and found.flag_index is not None:
        what = f"{where} is the value of {found.flag} (args[{found.flag_index}])"
    elif found.flag:
        what = f"{where} is {found.flag}, a flag that carries a secret"
    else:
        what = f"{where} looks like a key or token"
    variable = engine_variable(engine, found.flag)
    secret = re.sub(r"[^a-z0-9]+", "-", variable.lower()).strip("-")
    reader = {"vllm": "vLLM", "llamacpp": "llama.cpp", "sim": "the sim engine"}.get(
        engine or "vllm"
    )
    reads = (
        f"{reader} reads {variable}"
        if reader
        else f"the {engine} engine reads no key; vLLM reads {variable}"
    )
    return CatalogError(
        f"model {model!r} profile {profile!r}: {what}; a secret is never given in plain "
        "text (the catalog is shown to every reader and kept in the log for ever), only by "
        f"reference. Remove it from args and give the engine its own variable: write "
        f"`env: {{{variable}: {{secret: {secret}}}}}` ({reads}) and give "
        f"the agents the value as the file {secret} in their secrets_dir (or env "
        f"{env_var_for(secret)})",
        model=model,
        profile=profile,
        field=f"profiles.args[{found.index}]",
    )


def check_no_plain_secrets(profiles: Any, model: str) -> None:
    """Refuse (``CatalogError``) a profile whose env holds a secret-looking plain value, or
    whose args hold a secret (catalog.secrecy.secret_args).

    ``profiles`` are a model's profiles (anything with ``name``, ``engine``, ``env`` and
    ``args``).
    """
    for p in profiles:
        for name, value in p.env.items():
            if isinstance(value, str) and looks_secret(name):
                raise plain_secret_problem(model, p.name, name)
            if isinstance(value, str) and _holds_credentials(value):
                raise plain_secret_problem(model, p.name, name, credentials=True)
        found = secret_args(list(p.args))
        if found:
            # A flag and its value: name the value, the secret itself.
            first = (
                found[1] if len(found) > 1 and found[1].flag_index == found[0].index else found[0]
            )
            raise plain_secret_arg_problem(model, p.name, p.engine, first)


# A diff's path to an env entry: profiles[t4].env.HF_TOKEN or profiles[t4].env["A.B"].
_ENV_PATH = re.compile(r'\.env(?:\.([^.\[\]"]+)|\["((?:[^"\\]|\\.)*)"\])$')
# A diff's path to a profile's args (a list, changed whole): profiles[t4].args.
_ARGS_PATH = re.compile(r"(?:^|\.)args$")


def redact(value: Any) -> Any:
    """``value`` (JSON-ready) with every plain secret-looking env value, and every secret
    in args (catalog.secrecy.secret_args), replaced.

    Any mapping under an ``env`` key counts (a definition, an engine view, an event's
    payload), and any list of strings under an ``args`` key; so does a diff entry whose
    path ends in such an env variable or in ``args``. References ({secret: name}) are
    shown: they are names, not values.
    """
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "env" and isinstance(item, Mapping):
            out[key] = {
                k: REDACTED
                if isinstance(v, str) and (looks_secret(str(k)) or _holds_credentials(v))
                else redact(v)
                for k, v in item.items()
            }
        elif key == "args" and isinstance(item, list | tuple):
            out[key] = redact_args(list(item), REDACTED)
        else:
            out[key] = redact(item)
    path = value.get("path")
    if isinstance(path, str):
        found = _ENV_PATH.search(path)
        if found is not None and looks_secret(found.group(1) or found.group(2)):
            for side in ("before", "after"):
                if isinstance(out.get(side), str):
                    out[side] = REDACTED
        if _ARGS_PATH.search(path):
            for side in ("before", "after"):
                if isinstance(out.get(side), list | tuple):
                    out[side] = redact_args(list(out[side]), REDACTED)
    return out
