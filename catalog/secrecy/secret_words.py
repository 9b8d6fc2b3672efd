"""The words of the secrets rule (catalog.secrecy.secrets), shared with the model's schema. Pure."""

from __future__ import annotations

# The words that make a variable's name a secret's name anywhere in it (matched without
# case): HF_TOKEN, OPENAI_API_KEY, AWSSECRET, DB_PASSWORD.
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
# Words that make a name a secret's only as a whole part of it (parts are split at _ . -):
# MYSQL_PWD, DB_PASS, PG_PASSWD, GOOGLE_CREDENTIALS. As substrings they would catch names
# that hold no secret (NCCL_..._PASSTHROUGH, BYPASS_PROXY, CREDSTORE_DIR).
SECRET_PARTS = ("PASS", "PASSWD", "PWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "CREDS")
# Names that hold one of those parts and are known not to be secrets: the shell's working
# directory.
NOT_SECRET_NAMES = ("PWD", "OLDPWD")
# A secret's name is also a file name in the agent's secrets_dir: no path, no dot first.
SECRET_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


def _blind(word: str) -> str:
    # ECMA 262 (JSON Schema's dialect) has no case-blind flag.
    return "".join(f"[{c.upper()}{c.lower()}]" for c in word)


# The same rule as a JSON Schema (ECMA 262) pattern: a word anywhere, or a part between
# separators, but not one of the known names.
SECRET_NAMES_PATTERN = (
    "^(?!(?:"
    + "|".join(_blind(n) for n in NOT_SECRET_NAMES)
    + ")$)(?:.*(?:"
    + "|".join(_blind(w) for w in SECRET_WORDS)
    + ")|(?:.*[_.-])?(?:"
    + "|".join(_blind(p) for p in sorted(SECRET_PARTS, key=len, reverse=True))
    + ")(?:[_.-].*)?$)"
)
