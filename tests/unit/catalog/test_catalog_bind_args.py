"""Where an engine listens is the agent's (catalog.definition.bind_args), by property:
--host, --port and vLLM's --uds in args, in any form (``=value``, an abbreviation
argparse expands), are refused at the doors saying the agent chooses them, and dropped by
the agent from the command it runs (for events stored before the rule), whatever
surrounds them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.engines import Launch, command
from catalog import CatalogError, parse_model
from catalog.definition.bind_args import BIND_FLAGS, bind_flag, check_no_bind_args, drop_bind_args
from catalog.reading.declared import load_declared
from tests.support import dump_yaml

# What `bind_items` draws, built once (the cut once per flag): built in the composite,
# each was a new strategy that hypothesis validated again on every draw.
_KNOWN = st.sampled_from(BIND_FLAGS)
_CUT = {known: st.integers(3, len(known)) for known in BIND_FLAGS}
_BOOL = st.booleans()
_VALUE = st.sampled_from(["0.0.0.0", "8000", "/tmp/s"])


@st.composite
def bind_items(draw: st.DrawFn) -> str:
    """A bind flag as args may spell it: whole, abbreviated (--hos), any case, =value."""
    known = draw(_KNOWN)
    flag = known[: draw(_CUT[known])]
    if draw(_BOOL):
        flag = flag.upper()
    return flag + (("=" + draw(_VALUE)) if draw(_BOOL) else "")


other_items = st.sampled_from(
    ["--max-model-len", "4096", "--headless", "--hf-config-path", "x", "--header-timeout", "5"]
)


def _model(args: list[str]) -> Any:
    return parse_model(
        {
            "name": "m",
            "source": "org/m",
            "profiles": [{"name": "p", "gpu_class": "T4", "tp": 1, "args": args}],
        }
    )


@given(st.lists(other_items, max_size=4), bind_items(), st.lists(other_items, max_size=4))
def test_a_bind_flag_in_any_form_is_refused_saying_the_agent_chooses(
    before: list[str], item: str, after: list[str]
) -> None:
    model = _model([*before, item, "0.0.0.0", *after])
    with pytest.raises(CatalogError) as caught:
        check_no_bind_args(model.profiles, model.name)
    err = caught.value
    assert (err.model, err.profile, err.field) == ("m", "p", f"profiles.args[{len(before)}]")
    assert f"args[{len(before)}] sets {bind_flag(item)}" in err.message
    assert "the agent's (`llmgw agent --engine-host`" in err.message


@given(st.lists(other_items, max_size=6))
def test_other_flags_are_accepted(args: list[str]) -> None:
    model = _model(args)
    check_no_bind_args(model.profiles, model.name)


@given(st.lists(other_items, max_size=4), bind_items(), st.lists(other_items, max_size=4))
def test_the_agent_drops_them_from_the_command_it_runs(
    before: list[str], item: str, after: list[str]
) -> None:
    value = [] if "=" in item else ["0.0.0.0"]
    args = (*before, item, *value, *after)
    for engine in ("vllm", "llamacpp", "sim"):
        launch = Launch(engine, "p", "/w/m.gguf", "m", args=args)
        cmd = command(launch, host="127.0.0.1", port=8123, devices=())
        assert cmd.dropped == (item, *value)
        argv = list(cmd.argv)
        # The agent's own --host and --port are the only ones, and 0.0.0.0 is nowhere.
        assert [a for a in argv if bind_flag(a)] == ["--host", "--port"]
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[argv.index("--port") + 1] == "8123"
        assert "0.0.0.0" not in argv
        rest = [*before, *after]  # the profile's other args, last and in order
        assert argv[len(argv) - len(rest) :] == rest


def test_of_the_engines_own_flags_only_host_port_and_uds_are_the_agents() -> None:
    """vLLM's 205 options and llama-server's 413 (tests/data/): only --host, --port and
    vLLM's --uds choose where the engine listens (llama-server's --no-host, --reuse-port
    and --path do not), and the sim engine spells them the same."""
    data = Path(__file__).parents[2] / "data"
    vllm = json.loads((data / "vllm_serve_flags.json").read_text())
    llama = json.loads((data / "llamacpp_server_flags.json").read_text())
    assert sorted(f for f in [*vllm["value"], *vllm["switch"]] if bind_flag(f)) == [
        "--host",
        "--port",
        "--uds",
    ]
    assert sorted(f for f in llama["flags"] if bind_flag(f)) == ["--host", "--port"]
    assert {"--no-host", "--reuse-port", "--path"} <= set(llama["flags"])
    sim = command(Launch("sim", "p", "sim", "m"), host="127.0.0.1", port=1, devices=()).argv
    assert [a for a in sim if bind_flag(a)] == ["--host", "--port"]


def test_drop_keeps_everything_else_in_order() -> None:
    kept, dropped = drop_bind_args(["--a", "1", "--host", "0.0.0.0", "--port=9", "--b", "--por"])
    assert kept == ("--a", "1", "--b")
    assert dropped == ("--host", "0.0.0.0", "--port=9", "--por")


def test_the_declared_file_is_held_to_it_and_says_where_to_edit(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    model = {
        "name": "m",
        "source": "org/m",
        "profiles": [{"name": "p", "gpu_class": "T4", "args": ["--host", "0.0.0.0"]}],
    }
    path.write_text(dump_yaml({"models": [model]}))
    with pytest.raises(CatalogError) as caught:
        load_declared(path)
    assert caught.value.message.startswith(f"{path}: model 'm' profile 'p': args[0] sets --host")
