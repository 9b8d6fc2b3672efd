"""Secrets a hostile review found passing the doors (``check_no_plain_secrets``) and every
reader's redaction (``redact``): credentials inside a URL (in env or args) or a JSON
argument, and a key after its flag that starts with dashes. Each is a value an engine (or
its HTTP client) really uses. (Env names outside the four words, ``MYSQL_PWD``, are not
covered yet: the words are also the API document's pattern.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from catalog.errors import CatalogError
from catalog.secrecy.secrets import check_no_plain_secrets, redact


@dataclass
class Profile:
    name: str = "t4"
    engine: str = "vllm"
    env: dict[str, object] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)


CASES = [
    # huggingface_hub and vLLM download through a proxy with basic auth
    Profile(env={"HTTPS_PROXY": "http://svc:S3cretPass@proxy:3128"}),
    # an AWS secret key (40 chars with /) inside vLLM's JSON loader config
    Profile(
        args=[
            "--model-loader-extra-config",
            '{"aws_secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}',
        ]
    ),
    Profile(args=["--otlp-traces-endpoint=https://admin:hunter2@otel:4317"]),
]


@pytest.mark.parametrize("profile", CASES, ids=lambda p: str(p.env or p.args)[:40])
def test_a_plain_secret_is_refused(profile: Profile) -> None:
    with pytest.raises(CatalogError):
        check_no_plain_secrets([profile], "m")


@pytest.mark.parametrize("profile", CASES, ids=lambda p: str(p.env or p.args)[:40])
def test_a_plain_secret_is_redacted_for_readers(profile: Profile) -> None:
    shown = str(redact({"env": profile.env, "args": profile.args}))
    for secret in ("S3cretPass", "hunter2", "bPxRfiCYEXAMPLEKEY"):
        assert secret not in shown


def test_llamacpp_takes_a_dashed_value_after_api_key_and_redaction_shows_it() -> None:
    # llama-server's parser takes the next argv item whatever it is; a log event stored
    # before the rule replays to readers with the key in it.
    shown = redact({"args": ["--api-key", "--S3cret-llama-key"]})
    assert "--S3cret-llama-key" not in str(shown)


ALLOWED = [
    Profile(env={"HTTPS_PROXY": "http://proxy.internal:3128"}),
    Profile(args=["--otlp-traces-endpoint=https://otel:4317"]),
    Profile(args=["--override-generation-config", '{"max_new_tokens": 100}']),
    Profile(args=["--override-generation-config", '{"pad_token": "<pad>"}']),
    Profile(args=["--tokenizer", "org/model", '{"tokenizer_mode": "mistral_common"}']),
]


@pytest.mark.parametrize("profile", ALLOWED, ids=lambda p: str(p.env or p.args)[:40])
def test_what_only_looks_near_a_secret_is_taken(profile: Profile) -> None:
    check_no_plain_secrets([profile], "m")
    assert redact({"env": profile.env, "args": profile.args}) == {
        "env": profile.env,
        "args": profile.args,
    }


def test_a_url_password_in_env_is_refused_naming_the_variable_not_the_value() -> None:
    with pytest.raises(CatalogError) as caught:
        check_no_plain_secrets([Profile(env={"HTTPS_PROXY": "http://svc:S3cretPass@p:3128"})], "m")
    assert "env HTTPS_PROXY holds a URL with a password" in caught.value.message
    assert "S3cretPass" not in str(caught.value)


def test_a_megabyte_of_url_like_text_is_judged_in_linear_time() -> None:
    """A stored arg is judged on every reader's read (redaction): a megabyte of letters
    around ``://`` must not cost time quadratic in its length (an unbounded scheme did:
    minutes for one item). Run apart, with a bound far above linear's ~1 s and far below
    quadratic's."""
    import subprocess
    import sys

    code = (
        "from catalog.secrecy.secret_args import looks_like_key\n"
        "from catalog.secrecy.secrets import redact\n"
        "for v in ('a://' + 'b' * 10**6, 'b' * 10**6 + '://x', 'a://b:' + 'c' * 10**6):\n"
        "    looks_like_key(v); redact({'env': {'X': v}, 'args': [v]})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
