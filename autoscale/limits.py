"""What a decision needs of each model, from the catalog and the measured capacities. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from autoscale.decide import Limits
from catalog import Model

# The weight a profile has when it declares none (catalog.definition.model_rules.normalize).
DEFAULT_WEIGHT = 1.0


def _seconds(value: object) -> float | None:
    total = getattr(value, "total_seconds", None)
    seconds = float(total()) if callable(total) else 0.0
    return seconds if seconds > 0 else None


def capacity_of(model: Model, measured: Mapping[tuple[str, str], float]) -> float | None:
    """The measured capacity of the model's highest-priority profile that has one.

    Placement tries profiles from the highest priority down, so that profile is the one
    most replicas run; a model benched on a lower profile only still uses that figure.
    """
    ordered = sorted(enumerate(model.profiles), key=lambda ip: (-ip[1].priority, ip[0]))
    for _, profile in ordered:
        found = measured.get((model.name, profile.name))
        if found is not None:
            return found
    return None


def model_limits(
    models: Iterable[Model], measured: Mapping[tuple[str, str], float]
) -> dict[str, Limits]:
    """Every model's limits, in catalog order."""
    out = {}
    for m in models:
        capacity = capacity_of(m, measured)
        out[m.name] = Limits(
            min=m.scaling.min,
            max=m.scaling.max,
            ttft_p99_s=_seconds(m.slo.ttft_p99),
            tpot_p99_s=_seconds(m.slo.tpot_p99),
            capacity=capacity,
            capacity_source="default" if capacity is None else "bench",
        )
    return out


def effective_weight(
    model: Model, profile: str, measured: Mapping[tuple[str, str], float]
) -> float:
    """The routing weight of a replica: the declared ``weight`` when one was written (it
    stays the override), else the measured capacity, else 1.

    A declared weight of exactly 1 cannot be told from the default after normalisation;
    it is then replaced by a measured capacity (the docs say so).
    """
    declared = model.profile(profile)
    if declared is not None and declared.weight not in (0.0, DEFAULT_WEIGHT):
        return declared.weight
    return measured.get((model.name, profile), DEFAULT_WEIGHT)
