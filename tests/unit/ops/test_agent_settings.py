"""`llmgw agent` reads [agent] in llmgw.toml, under its flags and the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent_settings import resolve_agent
from llmgw.settings import SettingsError

AGENT = """
[agent]
server = "http://cp.internal:8080"
token_file = "agent.token"
node = "gpu-7"
labels = "zone=eu,rack=r7"
interval = "2s"
state_dir = "state"
gpus = "A100:8"
memory_gb = 512
stop_grace = "30s"
log_max_mb = 10
log_keep = 0
leave_engines = true
"""

NO_FLAGS: dict[str, object] = {}


def write(tmp_path: Path, text: str = AGENT) -> Path:
    path = tmp_path / "etc" / "llmgw.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_the_file_sets_every_agent_setting_with_paths_relative_to_it(tmp_path: Path) -> None:
    source = write(tmp_path)
    s = resolve_agent(NO_FLAGS, source, env={})
    assert s.server == ("http://cp.internal:8080",)
    assert s.token_file == source.parent / "agent.token"
    assert s.state_dir == source.parent / "state"
    assert (s.node, s.labels, s.gpus, s.memory_gb) == ("gpu-7", "zone=eu,rack=r7", "A100:8", 512)
    assert (s.interval_s, s.stop_grace_s, s.restart_backoff_s) == (2.0, 30.0, 10.0)
    assert (s.log_max_mb, s.log_keep, s.leave_engines) == (10.0, 0, True)


def test_flags_beat_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    source = write(tmp_path)
    env = {"LLMGW_SERVER": "http://from-env:1", "LLMGW_NODE": "env-node", "LLMGW_LABELS": ""}
    s = resolve_agent({"server": ["http://from-flag:2"], "interval": 0.5}, source, env=env)
    assert s.server == ("http://from-flag:2",)
    assert s.node == "env-node"
    assert s.labels == "zone=eu,rack=r7"  # an empty variable is not a setting
    assert s.interval_s == 0.5


def test_without_a_file_the_defaults_apply(tmp_path: Path) -> None:
    s = resolve_agent(NO_FLAGS, None, env={"LLMGW_NODE": "n1"})
    assert s.server is None and s.token_file is None
    assert s.state_dir == Path.home() / ".local/state/llmgw-agent/n1"
    assert (s.interval_s, s.log_max_mb, s.log_keep, s.leave_engines) == (10.0, 100.0, 3, False)


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ('interval = "0s"', "[agent] interval"),
        ("log_keep = -1", "[agent] log_keep"),
        ('memory_gb = "lots"', "[agent] memory_gb"),
        ("leave_engines = 3", "[agent] leave_engines"),
        ('stop_grace = "soon"', "[agent] stop_grace"),
    ],
)
def test_a_bad_value_is_refused_naming_the_file_and_key(
    tmp_path: Path, line: str, named: str
) -> None:
    source = write(tmp_path, f"[agent]\n{line}\n")
    with pytest.raises(SettingsError) as refused:
        resolve_agent(NO_FLAGS, source, env={})
    assert str(source) in str(refused.value) and named in str(refused.value)


def test_an_unknown_agent_key_is_refused_listing_the_known_ones(tmp_path: Path) -> None:
    source = write(tmp_path, '[agent]\nsevrer = "http://x"\n')
    with pytest.raises(SettingsError, match=r"unknown key 'sevrer' in \[agent\].*server"):
        resolve_agent(NO_FLAGS, source, env={})


def test_a_bad_flag_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="--stop-grace"):
        resolve_agent({"stop_grace": -1.0}, None, env={})


def test_several_servers_from_repeated_or_comma_separated_flags_the_environment_or_a_list(
    tmp_path: Path,
) -> None:
    """The control plane's replicas, in order; each way of giving them gives the same list."""
    both = ("http://cp-a:8080", "http://cp-b:8080")
    flags = {"server": ["http://cp-a:8080", "http://cp-b:8080/"]}
    assert resolve_agent(flags, None, env={"LLMGW_NODE": "n"}).server == both
    comma = {"server": ["http://cp-a:8080, http://cp-b:8080"]}
    assert resolve_agent(comma, None, env={"LLMGW_NODE": "n"}).server == both
    env = {"LLMGW_NODE": "n", "LLMGW_SERVER": "http://cp-a:8080,http://cp-b:8080"}
    assert resolve_agent(NO_FLAGS, None, env=env).server == both
    listed = write(tmp_path, '[agent]\nserver = ["http://cp-a:8080", "http://cp-b:8080"]\n')
    s = resolve_agent(NO_FLAGS, listed, env={"LLMGW_NODE": "n"})
    assert s.server == both
    assert s.to_json()["server"] == list(both)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ('"cp-a:8080"', "is not a server URL"),
        ('["http://cp-a:8080", 3]', "is not a URL"),
        ('""', "no server URL given"),
        ("[" + ", ".join(f'"http://cp-{i}:8080"' for i in range(17)) + "]", "more than 16"),
    ],
)
def test_a_bad_server_list_is_refused_naming_the_key(tmp_path: Path, value: str, said: str) -> None:
    source = write(tmp_path, f"[agent]\nserver = {value}\n")
    with pytest.raises(SettingsError, match=r"\[agent\] server") as refused:
        resolve_agent(NO_FLAGS, source, env={"LLMGW_NODE": "n"})
    assert said in str(refused.value)
