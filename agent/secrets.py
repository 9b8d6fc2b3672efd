"""Secrets a profile names (``{secret: hf-token}``), resolved on this node when an engine starts.

The control plane stores and serves only a secret's name (catalog.secrecy.secrets). The
agent looks the value up, first as the file ``NAME`` in its ``secrets_dir`` (one
file per secret, as Kubernetes and systemd credentials lay them out; a final
newline is dropped), then in its own environment as ``LLMGW_SECRET_NAME``
(upper case, other characters as ``_``). The value goes into the engine's
environment only: it is never written to the agent's records, its log or a
report, and a refusal names the secret and where it was looked for, never a value.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from catalog.secrecy.secrets import env_var_for, secret_name_problem

# A token or a password is short; a file larger than this is not one.
MAX_SECRET_BYTES = 64 * 1024


class SecretMissing(LookupError):
    """A secret the profile names that this node cannot supply; the message says where to put it."""


def resolve_env(
    env: Mapping[str, str | Mapping[str, str]],
    secrets_dir: Path | None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``env`` with each ``{"secret": name}`` replaced by the secret's value."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for name, value in env.items():
        out[name] = value if isinstance(value, str) else _secret(name, value, secrets_dir, environ)
    return out


def _secret(
    var: str, ref: Mapping[str, str], secrets_dir: Path | None, environ: Mapping[str, str]
) -> str:
    try:
        return read_secret(ref.get("secret", ""), secrets_dir, environ)
    except SecretMissing as exc:
        raise SecretMissing(f"env {var}: {exc}") from None


def _read_regular(path: Path) -> bytes | None:
    """At most ``MAX_SECRET_BYTES + 1`` bytes of the regular file at ``path`` (links
    followed: Kubernetes lays secrets out as links); None for anything else. Opened
    without blocking: a FIFO with no writer (or a one-shot FIFO already read) blocked
    its reader's open for ever, and the gateway reads its engines' keys on its event
    loop at every table, the agent on its loop when it starts an engine."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = b""
        while len(data) <= MAX_SECRET_BYTES:
            chunk = os.read(fd, MAX_SECRET_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
        return data
    finally:
        os.close(fd)


def read_secret(
    secret: str,
    secrets_dir: Path | None,
    environ: Mapping[str, str] | None = None,
    *,
    who: str = "agent",
    put: str | None = None,
) -> str:
    """The value of ``secret``: the file ``secrets_dir/secret``, else the environment's
    ``LLMGW_SECRET_<NAME>``. ``who`` (agent, gateway) names the settings a refusal
    points to (``put``, when they are other than ``[who] secrets_dir, --secrets-dir``).
    The gateway looks up the key of an engine started with one (its ``VLLM_API_KEY:
    {secret: NAME}``) the same way: ``llmgw.gateway_settings``."""
    environ = os.environ if environ is None else environ
    problem = secret_name_problem(secret)
    if problem is not None:
        raise SecretMissing(f"the secret's name {secret[:60]!r} {problem}")
    if secrets_dir is not None:
        path = secrets_dir / secret
        try:
            data = _read_regular(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise SecretMissing(f"secret {secret!r}: cannot read {path}: {exc.strerror}") from None
        else:
            if data is None:
                raise SecretMissing(
                    f"secret {secret!r}: {path} is not a regular file (a FIFO, a device, a "
                    "socket); a secret file holds the value alone"
                )
            if len(data) > MAX_SECRET_BYTES:
                raise SecretMissing(
                    f"secret {secret!r}: {path} is larger than {MAX_SECRET_BYTES} "
                    "bytes; a secret file holds the value alone"
                )
            text = data.decode("utf-8", "replace").removesuffix("\n").removesuffix("\r")
            if "\0" in text:
                raise SecretMissing(
                    f"secret {secret!r}: {path} holds a NUL byte, which no environment variable can"
                )
            return text
    variable = env_var_for(secret)
    if variable in environ:
        return environ[variable]
    where = f"the file {secrets_dir / secret}" if secrets_dir is not None else "a secrets_dir"
    raise SecretMissing(
        f"secret {secret!r} is on neither {where} nor this {who}'s environment "
        f"({variable}); put the value in one of them "
        f"({put or f'[{who}] secrets_dir, --secrets-dir'})"
    )
