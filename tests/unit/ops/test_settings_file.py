"""llmgw.toml: one set of settings, resolved flags > environment > file > defaults."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from llmgw.settings import Settings, SettingsError

FILE = """
[database]
url = "sqlite:///cluster.db"

[catalog]
file = "declared.yaml"

[policy]
stale_after = "30s"
grace = "20s"
interval = "2s"

[server]
port = 9000
with_scheduler = true

[auth]
file = "auth.toml"
reads_open = true
"""


def write(tmp_path: Path, text: str = FILE) -> Path:
    path = tmp_path / "llmgw.toml"
    path.write_text(text)
    return path


def test_defaults_apply_without_a_file_or_environment(tmp_path: Path) -> None:
    s = Settings.resolve(env={}, cwd=tmp_path)
    assert s.source is None
    assert s.database_url == "sqlite:///llmgw.db"
    assert s.policy.stale_after == timedelta(seconds=90)
    assert s.policy.grace == timedelta(minutes=5)
    assert s.interval_s == 10
    assert s.server.port == 8080 and not s.server.with_scheduler
    assert s.reads_open is None and s.auth_file is None


def test_the_file_in_the_working_directory_is_read_with_paths_relative_to_it(
    tmp_path: Path,
) -> None:
    write(tmp_path)
    s = Settings.resolve(env={}, cwd=tmp_path)
    assert s.source == tmp_path / "llmgw.toml"
    assert s.database_url == f"sqlite:///{tmp_path}/cluster.db"
    assert s.config_path == tmp_path / "declared.yaml"
    assert s.auth_file == tmp_path / "auth.toml"
    assert s.policy.stale_after == timedelta(seconds=30)
    assert s.policy.grace == timedelta(seconds=20)
    assert s.interval_s == 2
    assert s.server.port == 9000 and s.server.with_scheduler
    assert s.reads_open is True


def test_the_environment_wins_over_the_file_and_flags_win_over_both(tmp_path: Path) -> None:
    path = write(tmp_path)
    env = {"LLMGW_SETTINGS": str(path), "LLMGW_STALE_AFTER": "45", "LLMGW_GRACE": "1m"}
    s = Settings.resolve(env=env, cwd=tmp_path / "elsewhere")
    assert s.policy.stale_after == timedelta(seconds=45)
    assert s.policy.grace == timedelta(minutes=1)
    s = Settings.resolve(env=env, cwd=tmp_path, flags={"stale_after": "7s", "grace": None})
    assert s.policy.stale_after == timedelta(seconds=7)
    assert s.policy.grace == timedelta(minutes=1)  # a flag left unset is no flag


def test_a_settings_flag_names_the_file_to_read(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    path = write(tmp_path / "x")
    s = Settings.resolve(settings_file=str(path), env={}, cwd=tmp_path)
    assert s.server.port == 9000


def test_postgres_urls_as_libpq_writes_them_use_the_installed_driver(tmp_path: Path) -> None:
    s = Settings.resolve(db="postgres://u@h:5432/db", env={}, cwd=tmp_path)
    assert s.database_url == "postgresql+psycopg://u@h:5432/db"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[policy]\nstale = 3\n", "unknown key 'stale' in [policy]"),
        ("[polcy]\n", "unknown section [polcy]"),
        ('[policy]\ngrace = "soon"\n', "[policy] grace: 'soon' is not a duration"),
        ("[server]\nport = 70000\n", "port 70000 is not a port number"),
        ('[server]\nwith_scheduler = "maybe"\n', "'maybe' is not true or false"),
        ("[policy\n", "not valid TOML"),
        ("policy = 3\n", "policy must be a [policy] table"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    write(tmp_path, text)
    with pytest.raises(SettingsError) as refused:
        Settings.resolve(env={}, cwd=tmp_path)
    assert expected in str(refused.value)
    assert "llmgw.toml" in str(refused.value)


def test_an_oversized_file_is_refused_without_being_parsed(tmp_path: Path) -> None:
    write(tmp_path, "# " + "x" * 70_000 + "\n")
    with pytest.raises(SettingsError, match="larger than"):
        Settings.resolve(env={}, cwd=tmp_path)


def test_a_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="LLMGW_GRACE: 'x' is not a duration"):
        Settings.resolve(env={"LLMGW_GRACE": "x"}, cwd=tmp_path)


def test_the_resolved_settings_read_back_in_the_files_shape(tmp_path: Path) -> None:
    write(tmp_path)
    data = Settings.resolve(env={}, cwd=tmp_path).to_json()
    assert data["policy"] == {
        "stale_after": "30s",
        "grace": "20s",
        "interval": "2s",
        "preemption": True,
    }
    assert data["scheduler"] == {
        "defragment": True,
        "repair_spread": False,
        "leadership_lease": "4s",  # twice the interval
    }
    assert set(data) == {
        "settings_file", "database", "catalog", "policy", "scheduler", "server", "auth",
        "autoscale",
    }  # fmt: skip


def test_defragment_is_a_scheduler_setting_the_environment_and_a_flag_override(
    tmp_path: Path,
) -> None:
    (tmp_path / "llmgw.toml").write_text("[scheduler]\ndefragment = false\n")
    assert Settings.resolve(env={}, cwd=tmp_path).policy.defragment is False
    on = Settings.resolve(env={"LLMGW_DEFRAGMENT": "1"}, cwd=tmp_path)
    assert on.policy.defragment is True
    assert Settings.resolve(env={}, cwd=tmp_path / "nowhere").policy.defragment is True
    (tmp_path / "llmgw.toml").write_text("[scheduler]\ndefragment = 3\n")
    with pytest.raises(SettingsError, match="defragment"):
        Settings.resolve(env={}, cwd=tmp_path)


def test_repair_spread_is_a_scheduler_setting_off_unless_asked(tmp_path: Path) -> None:
    assert Settings.resolve(env={}, cwd=tmp_path).policy.repair_spread is False
    (tmp_path / "llmgw.toml").write_text("[scheduler]\nrepair_spread = true\n")
    assert Settings.resolve(env={}, cwd=tmp_path).policy.repair_spread is True
    off = Settings.resolve(env={"LLMGW_REPAIR_SPREAD": "0"}, cwd=tmp_path)
    assert off.policy.repair_spread is False
    (tmp_path / "llmgw.toml").write_text('[scheduler]\nrepair_spread = "yes please"\n')
    with pytest.raises(SettingsError, match="repair_spread"):
        Settings.resolve(env={}, cwd=tmp_path)


def test_preemption_is_a_policy_setting_the_environment_overrides(tmp_path: Path) -> None:
    (tmp_path / "llmgw.toml").write_text("[policy]\npreemption = false\n")
    assert Settings.resolve(env={}, cwd=tmp_path).policy.preemption is False
    on = Settings.resolve(env={"LLMGW_PREEMPTION": "1"}, cwd=tmp_path)
    assert on.policy.preemption is True
