"""The secrets rule for a profile's args (catalog.secrecy.secret_args and .secrets), by
property: a flag that carries a key, in any form, and a value that looks like one are
refused naming the model, the profile, args[i] and the engine's own variable, never
repeating the value; what args carry every day (paths, repositories, hashes, numbers,
model names, vLLM's other flags) is accepted; and redaction leaves no secret behind."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog import CatalogError, parse_model
from catalog.reading.declared import load_declared
from catalog.secrecy.secret_args import (
    KEY_PREFIXES,
    MIN_PREFIXED,
    MIN_RANDOM_RUN,
    SECRET_FLAG_WORDS,
    is_secret_flag,
    looks_like_key,
    secret_args,
)
from catalog.secrecy.secrets import REDACTED, check_no_plain_secrets, redact
from tests.support import dump_yaml

DATA = Path(__file__).parents[2] / "data"
VLLM_FLAGS = json.loads((DATA / "vllm_serve_flags.json").read_text())
LLAMACPP_FLAGS = json.loads((DATA / "llamacpp_server_flags.json").read_text())
ENGINES = {"vllm": "VLLM_API_KEY", "llamacpp": "LLAMA_API_KEY", "": "VLLM_API_KEY"}
KEY_CHARS = string.ascii_letters + string.digits + "_-"


def _model(args: list[str], engine: str = "") -> Any:
    profile = {"name": "p", "gpu_class": "T4", "tp": 1, "args": args}
    if engine:
        profile["engine"] = engine
    return parse_model({"name": "m", "source": "org/m", "profiles": [profile]})


def _refusal(args: list[str], engine: str = "") -> CatalogError:
    model = _model(args, engine)
    with pytest.raises(CatalogError) as caught:
        check_no_plain_secrets(model.profiles, model.name)
    return caught.value


words = st.text(st.sampled_from(string.ascii_lowercase), min_size=1, max_size=6)
# What the composites below draw, built once: built in each draw, each was a new strategy
# that hypothesis validated again every time.
_BOOL = st.booleans()
_KNOWN_FLAG = st.sampled_from(["--api-key", "--hf-token", "--token", "--password", "-hft"])
_HEAD = st.lists(words, max_size=3)
_LAST = st.sampled_from(sorted(SECRET_FLAG_WORDS))
_SEP = st.sampled_from(["-", "_"])


@st.composite
def secret_flags(draw: st.DrawFn) -> str:
    """A long flag whose last word carries a secret (--api-key, --x-y-token, ...), or one
    of the engines' own (llama.cpp's -hft), in any case of its words."""
    if draw(_BOOL):
        return draw(_KNOWN_FLAG)
    head = draw(_HEAD)
    last = draw(_LAST)
    sep = draw(_SEP)
    return "--" + sep.join([*head, last])


values = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=40)
plain_values = values.filter(lambda v: not v.startswith("--") and not looks_like_key(v))


_KEY_PREFIX = st.sampled_from(KEY_PREFIXES)
_KEY_REST = st.text(st.sampled_from(KEY_CHARS), min_size=MIN_PREFIXED, max_size=60)
_KEY_BODY = st.text(
    st.sampled_from(string.ascii_letters + string.digits),
    min_size=MIN_RANDOM_RUN - 3,
    max_size=60,
)


@st.composite
def prefixed_keys(draw: st.DrawFn) -> str:
    prefix = draw(_KEY_PREFIX)
    return prefix + draw(_KEY_REST)


@st.composite
def random_keys(draw: st.DrawFn) -> str:
    """Base62 key material: a run of MIN_RANDOM_RUN or more with upper, lower and digits."""
    body = draw(_KEY_BODY)
    return "".join(draw(st.permutations([*body, "A", "z", "7"])))


@given(secret_flags(), plain_values, st.sampled_from(sorted(ENGINES)))
def test_a_secret_flag_and_its_value_are_refused_naming_the_engines_variable(
    flag: str, value: str, engine: str
) -> None:
    err = _refusal(["--max-model-len", "4096", flag, value], engine)
    assert (err.model, err.profile, err.field) == ("m", "p", "profiles.args[3]")
    assert f"args[3] is the value of {flag} (args[2])" in err.message
    assert "{secret: " in err.message
    assert "secrets_dir" in err.message and "Remove it from args" in err.message
    hf = "hf" in flag.lower().replace("_", "-").split("-") or flag == "-hft"
    assert ("HF_TOKEN" if hf else ENGINES[engine]) in err.message
    # Never the value: the message is the same whatever it is.
    assert _refusal(["--max-model-len", "4096", flag, "x"], engine).message == err.message


@given(secret_flags().filter(lambda f: f.startswith("--")), values)
def test_the_equals_form_is_refused_too(flag: str, value: str) -> None:
    err = _refusal([f"{flag}={value}"])
    assert err.field == "profiles.args[0]"
    assert _refusal([f"{flag}=x"]).message == err.message


@given(st.one_of(prefixed_keys(), random_keys()), st.sampled_from(["", "--any-flag"]))
def test_a_value_that_looks_like_a_key_is_refused_whatever_flag_it_follows(
    key: str, flag: str
) -> None:
    args = [flag, key] if flag else [key]
    err = _refusal(args)
    assert err.field == f"profiles.args[{len(args) - 1}]"
    assert "looks like a key" in err.message
    assert _refusal([f"--any-flag={key}"]).field == "profiles.args[0]"


hex_strings = st.text(st.sampled_from("0123456789abcdefABCDEF"), min_size=1, max_size=128)
# Paths as deployments name them: words, versions, hex digests (a component that is
# itself 24+ letters and digits mixing cases is key material, path or not).
path_parts = st.one_of(
    st.text(st.sampled_from(string.ascii_lowercase + string.digits + "_-."), min_size=1),
    hex_strings,
    st.sampled_from(["Llama-3.1-70B", "Qwen2.5-7B-Instruct", "models--org--Name", "GGUF"]),
)
paths = st.lists(path_parts, min_size=2, max_size=6).map("/".join)
model_names = st.lists(
    st.text(st.sampled_from(string.ascii_letters + string.digits), min_size=1, max_size=12),
    min_size=1,
    max_size=8,
).map("-".join)


@given(st.one_of(hex_strings, paths, model_names, st.uuids().map(str), st.integers().map(str)))
def test_paths_hashes_numbers_and_model_names_are_accepted(value: str) -> None:
    for args in ([value], ["--revision", value], [f"--tokenizer={value}"]):
        model = _model(args)
        check_no_plain_secrets(model.profiles, model.name)


@pytest.mark.parametrize(
    "value",
    [
        "meta-llama/Llama-3.1-70B-Instruct",
        "Meta-Llama-3.1-70B-Instruct-AWQ-INT4",
        "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf",
        "/models/sk-llama/snapshots/0123456789abcdef0123456789abcdef01234567",
        "sk-short",
        "hf_cache",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        '{"max_loras": 4}',
        "0.9",
    ],
)
def test_values_args_carry_every_day_are_accepted(value: str) -> None:
    model = _model(["--some-flag", value])
    check_no_plain_secrets(model.profiles, model.name)


def test_of_the_engines_own_flags_exactly_the_key_flags_are_secret() -> None:
    """vLLM's 205 options (tests/data/vllm_serve_flags.json): exactly --api-key and
    --hf-token carry a secret; --max-num-batched-tokens, --ssl-keyfile, the token
    thresholds and --allow-credentials do not."""
    flags = [*VLLM_FLAGS["value"], *VLLM_FLAGS["switch"]]
    assert sorted(f for f in flags if is_secret_flag(f)) == ["--api-key", "--hf-token"]
    # llama-server's 413 (tests/data/llamacpp_server_flags.json): --api-key and
    # --hf-token / -hft carry one; --api-key-file and --ssl-key-file carry a path.
    llama = [f for f in LLAMACPP_FLAGS["flags"] if is_secret_flag(f)]
    assert sorted(llama) == ["--api-key", "--hf-token", "-hft"]
    assert {"--api-key-file", "--ssl-key-file"} <= set(LLAMACPP_FLAGS["flags"])
    # The variables the refusal points to are the ones llama-server reads.
    assert LLAMACPP_FLAGS["env"]["--api-key"] == ENGINES["llamacpp"]
    # argparse abbreviations of a secret flag are one; --api- could be --api-server-count.
    assert is_secret_flag("--api-k") and is_secret_flag("--hf-t")
    assert not is_secret_flag("--api-") and not is_secret_flag("--api-server-count")


def test_a_secret_flag_with_no_value_is_refused() -> None:
    assert _refusal(["--api-key"]).message.startswith(
        "model 'm' profile 'p': args[0] is --api-key, a flag that carries a secret"
    )


def test_the_refusal_of_the_issues_example() -> None:
    err = _refusal(["--api-key", "sk-plaintext-123"])
    assert err.message.startswith(
        "model 'm' profile 'p': args[1] is the value of --api-key (args[0])"
    )
    assert "`env: {VLLM_API_KEY: {secret: vllm-api-key}}`" in err.message
    assert "LLMGW_SECRET_VLLM_API_KEY" in err.message
    assert "sk-plaintext-123" not in err.message
    llama = _refusal(["--api-key", "sk-plaintext-123"], "llamacpp")
    assert "`env: {LLAMA_API_KEY: {secret: llama-api-key}}` (llama.cpp reads" in llama.message
    sim = _refusal(["--api-key", "sk-plaintext-123"], "sim")
    assert "(the sim engine reads LLMGW_SIM_API_KEY)" in sim.message


def test_the_declared_file_says_where_to_edit(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    model: dict[str, Any] = {
        "name": "m",
        "source": "org/m",
        "profiles": [{"name": "p", "gpu_class": "T4", "args": ["--api-key", "sk-plaintext-123"]}],
    }
    path.write_text(dump_yaml({"models": [model]}))
    with pytest.raises(CatalogError) as caught:
        load_declared(path)
    assert caught.value.message.startswith(f"{path}: model 'm' profile 'p': args[1]")
    assert caught.value.field == "profiles.args[1]"
    assert "sk-plaintext-123" not in caught.value.message


arg_items = st.one_of(
    secret_flags(),
    prefixed_keys(),
    random_keys(),
    plain_values,
    st.builds(lambda f, v: f"{f}={v}", secret_flags(), values),
    st.sampled_from(["--max-model-len", "4096", "--revision", "abc123"]),
)


@given(st.lists(arg_items, max_size=8))
def test_redaction_leaves_no_secret_in_args_and_keeps_the_rest(args: list[str]) -> None:
    shown = redact({"profiles": [{"args": args}], "engine": {"args": args}})
    for out in (shown["profiles"][0]["args"], shown["engine"]["args"]):
        assert len(out) == len(args)
        found = {s.index: s for s in secret_args(args)}
        for i, (before, after) in enumerate(zip(args, out, strict=True)):
            if i not in found:
                assert after == before
            elif found[i].flag and found[i].flag_index is None:
                # The flag stays (a reader sees a key is given); its =value does not.
                assert after == before if "=" not in before else after.endswith("=" + REDACTED)
            else:
                assert after == REDACTED or after.endswith("=" + REDACTED)
        # What is left holds no value that looks like a key, and redacting twice is once.
        assert not any(s.flag == "" for s in secret_args(out))
    assert redact(shown) == shown


def test_a_diff_entry_of_args_is_redacted() -> None:
    change = {
        "path": "profiles[t4].args",
        "before": ["--api-key", "sk-plaintext-123"],
        "after": ["--max-model-len", "4096"],
    }
    assert redact(change) == {**change, "before": ["--api-key", REDACTED]}


def test_long_items_are_judged_as_short_ones_are_without_being_cached() -> None:
    """Items past the caches' 256 characters take the same path uncached."""
    key = "sk-" + "aB3" * 200
    assert looks_like_key(key) and not looks_like_key("/" + "a" * 600)
    assert is_secret_flag("--" + "x-" * 200 + "token")
    args = ["--api-key", key, "--x", "y" * 5000, *(["--max-model-len", "8"] * 40)]
    shown = redact({"args": args})["args"]
    assert shown[:4] == ["--api-key", REDACTED, "--x", "y" * 5000] and key not in shown
