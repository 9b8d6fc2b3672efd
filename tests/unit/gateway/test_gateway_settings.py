"""``[gateway] admin_open``: off unless the flag, the environment or the file says so,
in that order, as every other setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscale.signals import MAX_WORKERS
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


def test_workers_are_held_to_the_identities_a_token_has_in_the_signals(tmp_path: Path) -> None:
    path = settings_file(tmp_path, "")
    assert resolve_gateway({"workers": MAX_WORKERS}, path, env={}).workers == MAX_WORKERS
    with pytest.raises(SettingsError) as caught:
        resolve_gateway({"workers": MAX_WORKERS + 1}, path, env={})
    assert str(caught.value).startswith(
        f"workers {MAX_WORKERS + 1} (--workers, LLMGW_GATEWAY_WORKERS or [gateway] workers): "
        f"at most {MAX_WORKERS}"
    )
