"""Which items of a profile's ``args`` hold a secret in plain text. Pure.

``args`` are served to every reader and kept in the log for ever, as ``env`` is, so a key
written there is public and permanent. An engine is given its key by its own environment
variable instead, and that variable takes a secret by reference (catalog.secrecy.secrets). This
module only finds them; catalog.secrecy.secrets refuses them at the doors and redacts them in
every read by anyone but an operator.

Two things make an item a secret:

- **A flag that carries one**, in either form (``--api-key VALUE``, ``--api-key=VALUE``):
  a long flag whose last word is one of ``SECRET_FLAG_WORDS`` (``--api-key``,
  ``--hf-token``, ``--token``, ``--password``; not ``--api-key-file``, ``--ssl-keyfile``,
  ``--max-num-batched-tokens`` or ``--long-prefill-token-threshold``, which carry a path
  or a number), the short aliases in ``SECRET_SHORT_FLAGS`` (llama.cpp's ``-hft``), and
  any abbreviation argparse would take for one (``--api-k``: vLLM's parser accepts a
  unique prefix). The flag's value is the secret; the flag itself, even with no value
  after it, is refused too: the key has one place, the engine's environment.
- **A value that looks like a key** whatever flag it follows (``looks_like_key``): a
  known key prefix (``sk-``, ``hf_``, ``ghp_``, ...) followed by at least
  ``MIN_PREFIXED`` key characters, a JSON Web Token, a private key, or a run of at least
  ``MIN_RANDOM_RUN`` letters and digits mixing upper case, lower case and digits (base62 /
  base64 key material), a URL with a password in it (``https://user:pass@host``), or a
  JSON argument with a member named like a secret holding a key-like string.
  Deliberately allowed, because args carry them every day: paths
  and repositories (a ``/`` or ``.`` stops a prefixed match; a component of a path is
  refused only if it is itself such a run), hex of any length (``--revision`` takes a 40-digit
  commit, files are named by their SHA-256), UUIDs, numbers, and model names such as
  ``Meta-Llama-3.1-70B-Instruct-AWQ-INT4`` (short runs between separators).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

# A long flag whose last word (split on - and _) is one of these carries a secret.
SECRET_FLAG_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd"})
# Known secret-carrying flags, whose argparse abbreviations are secret flags too.
SECRET_FLAGS = ("--api-key", "--hf-token", "--token", "--password")
# Short aliases: llama.cpp's -hft is --hf-token.
SECRET_SHORT_FLAGS = frozenset({"-hft"})

# Key prefixes of the usual providers: OpenAI and most OpenAI-compatible servers (sk-),
# Hugging Face (hf_), GitHub (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_), GitLab (glpat-),
# Slack (xoxb-, xoxp-, xoxa-), AWS access keys (AKIA, ASIA), Google API keys (AIza).
KEY_PREFIXES = (
    "sk-",
    "hf_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "AKIA",
    "ASIA",
    "AIza",
)
# Characters after a prefix: at least this many, of a key's alphabet (no / or . so that
# a path or a repository named sk-something never matches).
MIN_PREFIXED = 8
_PREFIXED = re.compile(
    "(?:" + "|".join(re.escape(p) for p in KEY_PREFIXES) + f")[A-Za-z0-9_-]{{{MIN_PREFIXED},}}"
)
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
# A run of letters and digits this long, mixing all three kinds, is key material: model
# names, words and hashes never make one (hex has no upper case past F and is exempt).
MIN_RANDOM_RUN = 24
_RUN = re.compile(f"[A-Za-z0-9]{{{MIN_RANDOM_RUN},}}")
_HEX = re.compile(r"[0-9a-fA-F]+")
# A URL's password (``https://user:pass@host``: a proxy, a tracing endpoint): an engine
# or its HTTP client uses it as given, so it is a secret wherever it appears.
# Every part bounded: an unbounded scheme made a megabyte of letters before "://" cost
# time quadratic in its length (each letter a start, each start a scan to the end).
URL_CREDENTIALS = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://[^/\s@:]{1,256}:[^/\s@]{1,256}@")
# A member of a JSON argument (vLLM's --model-loader-extra-config, ...) whose name's last
# word is a secret's (``"aws_secret_access_key": "..."``) and whose value is a string of
# key characters: not ``"tokenizer": ...`` (the last word is not a secret's) nor
# ``"pad_token": "<pad>"`` (no key characters).
_JSON_SECRET_MEMBER = re.compile(
    r'"(?:[A-Za-z0-9]+[_-])*(?:key|apikey|token|secret|password|passwd)"\s*:\s*"[^"\s<>]{8,}"',
    re.IGNORECASE,
)


# The shortest value any of the above can match ("sk-" and 8 characters): shorter ones
# (most args: "--max-model-len", "8192") are never looked at further.
_SHORTEST = min(len(p) for p in KEY_PREFIXES) + MIN_PREFIXED
# Every read by anyone but an operator redacts (the gateways' placements included), and
# the same few args repeat across every replica of a profile: the checks are cached, for
# items up to _CACHED_CHARS long (so the caches hold at most ~_CACHED x that: a hostile
# definition's megabyte-long args are checked, not kept).
_CACHED = 4096
_CACHED_CHARS = 256


def looks_like_key(value: str) -> bool:
    """Whether ``value`` (one argv item, or the value of a ``--flag=value``) looks like a key."""
    if len(value) < _SHORTEST:
        return False
    return _looks_like_key(value) if len(value) <= _CACHED_CHARS else _key_like(value)


@lru_cache(maxsize=_CACHED)
def _looks_like_key(value: str) -> bool:
    return _key_like(value)


def _key_like(value: str) -> bool:
    if _PREFIXED.fullmatch(value) or _JWT.search(value) or _PRIVATE_KEY.search(value):
        return True
    if "://" in value and URL_CREDENTIALS.search(value):
        return True
    if '"' in value and _JSON_SECRET_MEMBER.search(value):
        return True
    for run in _RUN.findall(value):
        if _HEX.fullmatch(run):
            continue
        if (
            any(c.isupper() for c in run)
            and any(c.islower() for c in run)
            and any(c.isdigit() for c in run)
        ):
            return True
    return False


def is_secret_flag(flag: str) -> bool:
    """Whether ``flag`` (without any ``=value``) is a flag that carries a secret."""
    return _is_secret_flag(flag) if len(flag) <= _CACHED_CHARS else _secret_flag(flag)


@lru_cache(maxsize=_CACHED)
def _is_secret_flag(flag: str) -> bool:
    return _secret_flag(flag)


def _secret_flag(flag: str) -> bool:
    if flag in SECRET_SHORT_FLAGS:
        return True
    if not flag.startswith("--") or len(flag) < 3:
        return False
    words = re.split(r"[-_]+", flag[2:].lower())
    if words[-1] in SECRET_FLAG_WORDS:
        return True
    # An abbreviation argparse expands: past the last separator of a known secret flag
    # (--api-k, --hf-t), so that --api- (which could be --api-server-count) is not one.
    lower = flag.lower()
    return any(
        known.startswith(lower) and len(lower) > max(known.rfind("-") + 1, 3)
        for known in SECRET_FLAGS
    )


@dataclass(frozen=True, slots=True)
class SecretArg:
    """One item of ``args`` that holds a secret, and why."""

    index: int
    # The secret-carrying flag (as written, without =value), or "" for a value that
    # looks like a key whatever precedes it.
    flag: str = ""
    # Where the flag is when the secret is the item after it; None when it is this item.
    flag_index: int | None = None


def secret_args(args: tuple[str, ...] | list[str]) -> list[SecretArg]:
    """Every item of ``args`` that is, or holds, a secret: a secret flag (whose value is the
    next item unless written ``--flag=value``) and the value that follows it, and any item
    whose value looks like a key."""
    found: list[SecretArg] = []
    taken: set[int] = set()
    for i, item in enumerate(args):
        if not isinstance(item, str) or i in taken:
            continue
        flag, eq, value = item.partition("=")
        if item.startswith("-") and is_secret_flag(flag):
            found.append(SecretArg(i, flag))
            nxt = i + 1
            # The next item is the value whatever it looks like: llama-server's parser
            # takes it even when it starts with dashes (``--api-key --S3cret``).
            if not eq and nxt < len(args):
                found.append(SecretArg(nxt, flag, i))
                taken.add(nxt)
            continue
        shown = value if item.startswith("-") and eq else item
        if looks_like_key(shown):
            found.append(SecretArg(i))
    return found


def redact_args(args: list[object], redacted: str) -> list[object]:
    """``args`` with every secret shown as ``redacted``: the value after a secret flag, the
    ``=value`` part of ``--flag=value``, and any value that looks like a key. Flags stay,
    so a reader still sees that a key is given (and where)."""
    if not all(isinstance(a, str) for a in args):
        return args
    items = tuple(str(a) for a in args)
    small = len(items) <= 64 and sum(map(len, items)) <= 16 * _CACHED_CHARS
    changes = _redactions(items, redacted) if small else _changes(items, redacted)
    if not changes:
        return list(args)
    out = list(args)
    for index, shown in changes:
        out[index] = shown
    return out


@lru_cache(maxsize=1024)
def _redactions(args: tuple[str, ...], redacted: str) -> tuple[tuple[int, str], ...]:
    # Cached: every replica of a profile carries the same args, every read redacts them.
    return _changes(args, redacted)


def _changes(args: tuple[str, ...], redacted: str) -> tuple[tuple[int, str], ...]:
    """What ``redact_args`` replaces in ``args``: (index, shown) pairs."""
    changes: list[tuple[int, str]] = []
    for s in secret_args(args):
        item = args[s.index]
        flag, eq, _ = item.partition("=")
        if s.flag and s.flag_index is None:
            if eq:
                changes.append((s.index, f"{flag}={redacted}"))
            continue
        if item.startswith("-") and eq and not s.flag:
            changes.append((s.index, f"{flag}={redacted}"))
        else:
            changes.append((s.index, redacted))
    return tuple(changes)
