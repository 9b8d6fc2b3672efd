"""``[gateway] admin_open``: off unless the flag, the environment or the file says so,
in that order, as every other setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscale.signals import MAX_WORKERS
from llmgw.cli import build_parser
from llmgw.gateway_settings import resolve_gateway
from llmgw.settings import SettingsError


def settings_file(tmp_path: Path, table: str) -> Path:
    (tmp_path / "gw.token").write_text("llmgw_x\n")
    path = tmp_path / "llmgw.toml"
    path.write_text(f'[gateway]\nserver = "http://cp:8080"\ntoken_file = "gw.token"\n{table}')
    return path


def test_admin_routes_are_closed_by_default(tmp_path: Path) -> None:
    assert resolve_gateway({}, settings_file(tmp_path, ""), env={}).admin_open is False


def test_admin_open_from_the_file_the_environment_or_the_flag(tmp_path: Path) -> None:
    opened = settings_file(tmp_path, "admin_open = true\n")
    assert resolve_gateway({}, opened, env={}).admin_open is True
    closed = settings_file(tmp_path, "admin_open = false\n")
    assert resolve_gateway({}, closed, env={"LLMGW_GATEWAY_ADMIN_OPEN": "true"}).admin_open
    assert resolve_gateway({"admin_open": True}, closed, env={}).admin_open is True


def test_a_value_that_is_not_a_boolean_is_refused_naming_where(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"\[gateway\] admin_open"):
        resolve_gateway({}, settings_file(tmp_path, 'admin_open = "maybe"\n'), env={})


def test_an_answers_bounds_default_and_come_from_the_file(tmp_path: Path) -> None:
    default = resolve_gateway({}, settings_file(tmp_path, ""), env={})
    assert (default.max_answer_bytes, default.max_answer_s) == (256 << 20, 3600.0)
    given = settings_file(tmp_path, 'max_answer_mb = 1.5\nmax_answer_time = "30s"\n')
    bounded = resolve_gateway({}, given, env={})
    assert (bounded.max_answer_bytes, bounded.max_answer_s) == (3 << 19, 30.0)
    with pytest.raises(SettingsError, match=r"\[gateway\] max_answer_time"):
        resolve_gateway({}, settings_file(tmp_path, 'max_answer_time = "0s"\n'), env={})


def test_workers_are_held_to_the_identities_a_token_has_in_the_signals(tmp_path: Path) -> None:
    path = settings_file(tmp_path, "")
    assert resolve_gateway({"workers": MAX_WORKERS}, path, env={}).workers == MAX_WORKERS
    with pytest.raises(SettingsError) as caught:
        resolve_gateway({"workers": MAX_WORKERS + 1}, path, env={})
    assert str(caught.value).startswith(
        f"workers {MAX_WORKERS + 1} (--workers, LLMGW_GATEWAY_WORKERS or [gateway] workers): "
        f"at most {MAX_WORKERS}"
    )


def test_the_control_planes_replicas_as_a_list_a_comma_separated_variable_or_flags(
    tmp_path: Path,
) -> None:
    both = ("http://cp-a:8080", "http://cp-b:8080")
    one = resolve_gateway({}, settings_file(tmp_path, ""), env={})
    assert one.server_list == ("http://cp:8080",) and one.server == "http://cp:8080"
    env = {"LLMGW_SERVER": "http://cp-a:8080,http://cp-b:8080"}
    assert resolve_gateway({}, settings_file(tmp_path, ""), env=env).server_list == both
    flags = {"server": ["http://cp-a:8080", "http://cp-b:8080"]}
    got = resolve_gateway(flags, settings_file(tmp_path, ""), env={})
    assert got.server_list == both and got.server == "http://cp-a:8080"
    (tmp_path / "list.toml").write_text(
        '[gateway]\nserver = ["http://cp-a:8080", "http://cp-b:8080"]\ntoken_file = "gw.token"\n'
    )
    assert resolve_gateway({}, tmp_path / "list.toml", env={}).server_list == both


def test_the_usage_flush_is_a_second_by_default_and_at_most_a_minute(tmp_path: Path) -> None:
    assert resolve_gateway({}, settings_file(tmp_path, ""), env={}).usage_flush_s == 1.0
    quick = settings_file(tmp_path, 'usage_flush = "250ms"\n')
    assert resolve_gateway({}, quick, env={}).usage_flush_s == 0.25
    with pytest.raises(SettingsError, match=r"usage_flush 120s .* at most 60s: what a killed"):
        resolve_gateway({}, settings_file(tmp_path, 'usage_flush = "2m"\n'), env={})
    with pytest.raises(SettingsError, match=r"\[gateway\] usage_flush"):
        resolve_gateway({}, settings_file(tmp_path, 'usage_flush = "0s"\n'), env={})


def test_slow_start_from_the_flag_over_the_file(tmp_path: Path) -> None:
    path = settings_file(tmp_path, 'slow_start = "10s"\n')
    assert resolve_gateway({}, path, env={}).slow_start_s == 10.0
    args = build_parser().parse_args(["gateway", "--slow-start", "0"])
    assert resolve_gateway(vars(args), path, env={}).slow_start_s == 0.0
    with pytest.raises(SettingsError, match="--slow-start"):
        resolve_gateway(vars(build_parser().parse_args(["gateway", "--slow-start", "x"])), path)


def test_an_engines_key_is_looked_up_in_the_secrets_dir_then_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "engine-key").write_text("from-the-file\n")
    path = settings_file(tmp_path, f'secrets_dir = "{secrets}"\n')
    lookup = resolve_gateway({}, path, env={}).engine_secret
    assert lookup("engine-key") == "from-the-file"
    monkeypatch.setenv("LLMGW_SECRET_OTHER_KEY", "from-the-environment")
    assert lookup("other-key") == "from-the-environment"
    with pytest.raises(LookupError) as caught:
        lookup("absent")
    assert str(caught.value).startswith(f"secret 'absent' is on neither the file {secrets}/absent")
    assert "[gateway] secrets_dir, --secrets-dir" in str(caught.value)
    flag = resolve_gateway({"secrets_dir": str(tmp_path)}, path, env={}).engine_secret
    with pytest.raises(LookupError):
        flag("engine-key")  # the flag's directory, over the file's
