"""The autoscaling policy: ``[autoscale]`` in ``llmgw.toml``, with defaults that work.

Pure: parsing a table into a frozen ``Policy`` and the per-model view the decision
uses. Every refusal names the key, the value and what to write instead, as the
rest of the settings file's refusals do.

    [autoscale]
    enabled = true          # false: every model keeps scaling.min, as before
    interval = "15s"        # between decisions
    window = "60s"          # the signals each decision reads
    target = 0.7            # load per replica as a share of its measured capacity
    up_step = 4             # at most this many replicas added by one decision
    down_step = 1           # at most this many removed by one decision
    up_cooldown = "15s"     # after any change, before the next scale-up
    down_cooldown = "5m"    # after any change, before the next scale-down
    default_capacity = 4    # concurrent requests a replica carries when never benched
    default_queue_wait = "2s"  # queue wait p99 that scales up a model with no slo.ttft_p99
    retention = "168h"      # signal windows and decision rounds older than this go

    [autoscale.models."llama-70b"]
    enabled = false         # opt out: this model keeps scaling.min
    target = 0.5            # any of target, steps, cooldowns, the defaults
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from catalog.forms.durations import format_duration, parse_duration

# What a model's own table may change; the rest is one value for the whole cluster.
MODEL_KEYS = (
    "enabled",
    "target",
    "up_step",
    "down_step",
    "up_cooldown",
    "down_cooldown",
    "default_capacity",
    "default_queue_wait",
)
KEYS = (
    "enabled",
    "interval",
    "window",
    "target",
    "up_step",
    "down_step",
    "up_cooldown",
    "down_cooldown",
    "default_capacity",
    "default_queue_wait",
    "retention",
    "models",
)
# More per-model tables than this is not a settings file someone wrote by hand.
MAX_MODELS = 10_000
# A step or capacity beyond this is a typo (catalog.definition.model's MAX_REPLICAS is 10,000).
MAX_STEP = 10_000
MAX_CAPACITY = 1_000_000.0


class PolicyError(ValueError):
    """The ``[autoscale]`` table cannot be used; the message names the key and the fix."""


@dataclass(frozen=True, slots=True)
class ModelPolicy:
    """What one decision for one model uses: the cluster's policy with the model's overrides."""

    enabled: bool = True
    target: float = 0.7
    up_step: int = 4
    down_step: int = 1
    up_cooldown: timedelta = timedelta(seconds=15)
    down_cooldown: timedelta = timedelta(minutes=5)
    default_capacity: float = 4.0
    # The gateways' queue wait p99 above which a model without ``slo.ttft_p99`` scales up
    # (held for two consecutive windows of one gateway; ``autoscale.decide``).
    default_queue_wait: timedelta = timedelta(seconds=2)

    def to_json(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "target": self.target,
            "up_step": self.up_step,
            "down_step": self.down_step,
            "up_cooldown": format_duration(self.up_cooldown),
            "down_cooldown": format_duration(self.down_cooldown),
            "default_capacity": self.default_capacity,
            "default_queue_wait": format_duration(self.default_queue_wait),
        }


@dataclass(frozen=True, slots=True)
class Policy:
    """The whole ``[autoscale]`` table, parsed."""

    enabled: bool = True
    interval: timedelta = timedelta(seconds=15)
    window: timedelta = timedelta(seconds=60)
    retention: timedelta = timedelta(hours=168)
    defaults: ModelPolicy = field(default_factory=ModelPolicy)
    # Per-model overrides, by catalog name, as written (only the keys given).
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def for_model(self, name: str) -> ModelPolicy:
        """The model's policy: its own table over the cluster's, off when autoscaling is off."""
        own = self.models.get(name)
        base = self.defaults if own is None else replace(self.defaults, **own)
        return base if self.enabled else replace(base, enabled=False)

    def to_json(self) -> dict[str, Any]:
        """The policy as the settings file writes it (recorded with every decision round)."""
        return {
            "enabled": self.enabled,
            "interval": format_duration(self.interval),
            "window": format_duration(self.window),
            "retention": format_duration(self.retention),
            **{k: v for k, v in self.defaults.to_json().items() if k != "enabled"},
            "models": {
                name: {k: _shown(v) for k, v in sorted(own.items())}
                for name, own in sorted(self.models.items())
            },
        }

    def digest(self) -> str:
        """A content address of the policy (equal policies, equal digests)."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


DEFAULT_POLICY = Policy()


def _shown(value: Any) -> Any:
    return format_duration(value) if isinstance(value, timedelta) else value


def parse_policy(data: Mapping[str, Any], where: str = "[autoscale]") -> Policy:
    """The policy from a TOML table (or a JSON object: ``backtest --policy FILE``).

    Keys left out take the defaults above; an unknown key is refused with the known ones,
    so a typo (``taget``) does not silently leave the default in force.
    """
    if not isinstance(data, Mapping):
        raise PolicyError(f"{where} must be a table of autoscaling settings")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise PolicyError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))} (known: {', '.join(KEYS)})"
        )
    defaults = DEFAULT_POLICY
    model_defaults = _model_values(data, where, MODEL_KEYS)
    interval = _duration(data, "interval", where, defaults.interval)
    window = _duration(data, "window", where, defaults.window)
    retention = _duration(data, "retention", where, defaults.retention)
    if window < interval:
        raise PolicyError(
            f"{where}: window {format_duration(window)} is shorter than interval "
            f"{format_duration(interval)}: a decision would ignore signals received since the "
            "last; make window at least the interval (the default is 4 intervals)"
        )
    if retention < window:
        raise PolicyError(
            f"{where}: retention {format_duration(retention)} is shorter than window "
            f"{format_duration(window)}; keep signals at least one window"
        )
    models_raw = data.get("models", {})
    if not isinstance(models_raw, Mapping):
        raise PolicyError(f'{where}: models must be tables: [autoscale.models."NAME"]')
    if len(models_raw) > MAX_MODELS:
        raise PolicyError(f"{where}: more than {MAX_MODELS} [autoscale.models] tables")
    models: dict[str, dict[str, Any]] = {}
    for name, own in models_raw.items():
        at = f'{where.rstrip("]")}.models."{name}"]'
        if not isinstance(own, Mapping):
            raise PolicyError(f"{at} must be a table (e.g. enabled = false)")
        extra = sorted(set(own) - set(MODEL_KEYS))
        if extra:
            raise PolicyError(
                f"{at}: unknown key(s) {', '.join(map(repr, extra))}; a model's table may set "
                f"{', '.join(MODEL_KEYS)}"
            )
        models[str(name)] = _model_values(own, at, MODEL_KEYS)
    return Policy(
        enabled=_bool(data, "enabled", where, defaults.enabled),
        interval=interval,
        window=window,
        retention=retention,
        defaults=replace(defaults.defaults, **model_defaults),
        models=models,
    )


def _model_values(data: Mapping[str, Any], where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """The per-model keys present in ``data``, each checked and converted."""
    out: dict[str, Any] = {}
    for key in keys:
        if key not in data:
            continue
        if key == "enabled":
            out[key] = _bool(data, key, where, True)
        elif key == "target":
            out[key] = _share(data[key], f"{where} target")
        elif key in ("up_step", "down_step"):
            out[key] = _step(data[key], f"{where} {key}")
        elif key in ("up_cooldown", "down_cooldown"):
            out[key] = _duration(data, key, where, timedelta(0), zero=True)
        elif key == "default_queue_wait":
            out[key] = _duration(data, key, where, timedelta(0))
        elif key == "default_capacity":
            out[key] = _capacity(data[key], f"{where} default_capacity")
    return out


def _bool(data: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise PolicyError(f"{where} {key}: {value!r} is not true or false")
    return value


def _duration(
    data: Mapping[str, Any], key: str, where: str, default: timedelta, *, zero: bool = False
) -> timedelta:
    if key not in data:
        return default
    try:
        value = parse_duration(data[key])
    except ValueError as exc:
        raise PolicyError(f"{where} {key}: {exc} (write e.g. 15s, 5m, 1h)") from None
    if value < timedelta(0) or (value == timedelta(0) and not zero):
        raise PolicyError(f"{where} {key}: {data[key]!r} must be a positive duration")
    return value


def _share(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyError(f"{where}: {value!r} is not a number; write a share such as 0.7")
    share = float(value)
    if not (math.isfinite(share) and 0 < share <= 1):
        raise PolicyError(
            f"{where}: {value!r} must be a share of capacity above 0 and at most 1 (e.g. 0.7)"
        )
    return share


def _step(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_STEP:
        raise PolicyError(f"{where}: {value!r} must be a whole number of replicas, 1 to {MAX_STEP}")
    return value


def _capacity(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyError(f"{where}: {value!r} is not a number of concurrent requests")
    capacity = float(value)
    if not (math.isfinite(capacity) and 0 < capacity <= MAX_CAPACITY):
        raise PolicyError(
            f"{where}: {value!r} must be above 0 and at most {MAX_CAPACITY:g} concurrent requests"
        )
    return capacity
