"""The words of the secrets rule (catalog.secrecy.secrets), shared with the model's schema. Pure."""

from __future__ import annotations

# The words that make a variable's name a secret's name (matched without case).
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
# A secret's name is also a file name in the agent's secrets_dir: no path, no dot first.
SECRET_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
# The same words as a JSON Schema (ECMA 262) pattern, which has no case-blind flag.
SECRET_NAMES_PATTERN = "|".join(
    "".join(f"[{c.upper()}{c.lower()}]" for c in word) for word in SECRET_WORDS
)
