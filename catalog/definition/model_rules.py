"""A model's own rules: its defaults (``normalize``) and its checks (``validate``).

Defaults are applied in one place and checks in another, in that order, as the
Go control plane did (see ``catalog.definition.model`` for the fields). The rules between
models (names, aliases, fallbacks) are ``catalog.whole.rules``. Both functions are
pure; what they remember of definitions already checked (by identity of frozen
parts, bounded) only saves work, never changes a verdict: the tests in
``tests/unit/catalog/test_validate_remembered.py`` hold them to that.
"""

from __future__ import annotations

import math

from catalog.definition.identifiers import check_model_names, plainly_valid
from catalog.definition.model import (
    _ZERO,
    DEFAULT_ENGINE,
    DEFAULT_STARTUP_TIMEOUT,
    MAX_MEMORY_GB,
    MAX_PARALLEL,
    MAX_PRIORITY,
    MAX_REPLICAS,
    MAX_SLOTS,
    MAX_SPREAD_BY,
    Model,
    PlacementRules,
    Profile,
    Scaling,
    Seq,
    cpu_capable,
)
from catalog.definition.routing_profiles import check_routing_profile
from catalog.errors import CatalogError
from catalog.forms.printable import printable
from catalog.secrecy.secrets import secret_name_problem


def normalize(model: Model) -> Model:
    """Apply every default, returning a new model. Idempotent.

    A model that is already normalised (every stored definition is: the log
    records ``to_definition()`` of a normalised model) is returned as it is,
    rather than copied field by field into an equal one.
    """
    if model.placement.spread_by is not None:  # else nothing to normalise there
        placement = _normalize_placement(model.placement)
        if placement is not model.placement:
            model = model.model_copy(update={"placement": placement})
    if model.scaling.min >= 0 and model.scaling.max != 0:
        profiles = model.profiles
        if _NORMAL_PROFILES.get(id(profiles)) is profiles:
            return model
        for p in profiles:
            if _normalize_profile(p) is not p:
                break
        else:
            if type(profiles) is tuple:
                if len(_NORMAL_PROFILES) >= _VALID_PROFILES_LIMIT:
                    _NORMAL_PROFILES.clear()
                _NORMAL_PROFILES[id(profiles)] = profiles
            return model
    scaling_min = max(model.scaling.min, 0)
    scaling_max = model.scaling.max if model.scaling.max != 0 else max(scaling_min, 1)
    profiles = tuple(_normalize_profile(p) for p in model.profiles)
    return model.model_copy(
        update={
            "scaling": Scaling(min=scaling_min, max=scaling_max),
            "profiles": profiles,
        }
    )


def _normalize_placement(rules: PlacementRules) -> PlacementRules:
    # An empty label name is how YAML says "none"; surrounding spaces are a
    # copy-paste slip, not part of a label key.
    if rules.spread_by is None:
        return rules
    spread_by = rules.spread_by.strip() or None
    if spread_by == rules.spread_by:
        return rules
    return rules.model_copy(update={"spread_by": spread_by})


def _normalize_profile(p: Profile) -> Profile:
    engine = p.engine or DEFAULT_ENGINE
    tp = p.tp if p.tp > 0 else 1
    nodes = p.nodes if p.nodes > 0 else 1
    gpus_per_node = p.gpus_per_node
    if p.gpu_class == "" and cpu_capable(engine):
        # Nothing to divide up: this profile asks for no cards at all.
        gpus_per_node = 0
    elif gpus_per_node <= 0:
        gpus_per_node = max(tp // nodes, 1)
    startup_timeout = p.startup_timeout if p.startup_timeout > _ZERO else DEFAULT_STARTUP_TIMEOUT
    weight = p.weight if p.weight > 0 else 1.0
    # Each value above is the field itself when no default applies: nothing to copy then.
    if (
        engine is p.engine
        and tp is p.tp
        and nodes is p.nodes
        and gpus_per_node is p.gpus_per_node
        and startup_timeout is p.startup_timeout
        and weight is p.weight
    ):
        return p
    return p.model_copy(
        update={
            "engine": engine,
            "tp": tp,
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "startup_timeout": startup_timeout,
            "weight": weight,
        }
    )


def validate(model: Model) -> None:
    """Refuse a normalised definition that would fail confusingly later.

    Every message names the model, the profile and the field, and says what
    would make it right.
    """
    name = model.name
    # Everything but the names and the source (which differ from model to model)
    # reads only fields that repeat across a log: sections catalog.stored.fast_decode
    # shares between models, and a few values. What passed before passes again;
    # the other checks still run, in their order, so a refusal is the same one.
    profiles = model.profiles
    rest_key = (
        model.routing_profile,
        model.context_length,
        model.max_output,
        id(profiles),
        id(model.scaling),
        id(model.rollout),
        id(model.placement),
        id(model.disruption),
    )
    held = _VALID_REST.get(rest_key)
    rest_known = (
        held is not None
        and held[0] is profiles
        and held[1] is model.scaling
        and held[2] is model.rollout
        and held[3] is model.placement
        and held[4] is model.disruption
    )
    if rest_known and plainly_valid(model):
        # Then every check below passes (the name and source are non-empty, the
        # aliases neither empty, nor the name, nor listed twice): replay's common case.
        return
    stripped = name.strip()
    if not stripped:
        raise CatalogError(
            "a model has no name: set `name` to the name clients will request", field="name"
        )
    if name != stripped:
        raise CatalogError(
            f"model {name!r}: name has leading or trailing spaces; clients would never match it",
            model=name,
            field="name",
        )
    if not model.source:
        raise CatalogError(
            f"model {name!r}: source is required: the weights path or a HuggingFace id",
            model=name,
            field="source",
        )
    if not rest_known:
        if not model.profiles:
            raise CatalogError(
                f"model {name!r}: at least one profile is required, or it can run nowhere",
                model=name,
                field="profiles",
            )
        if model.scaling.max < model.scaling.min:
            raise CatalogError(
                f"model {name!r}: scaling.max {model.scaling.max} is below scaling.min "
                f"{model.scaling.min}; raise max or lower min",
                model=name,
                field="scaling.max",
            )
        # A replica count in the millions is a typo, and the scheduler would try to
        # plan every one of them in each round.
        for bound in ("min", "max"):
            value = getattr(model.scaling, bound)
            if value > MAX_REPLICAS:
                raise CatalogError(
                    f"model {name!r}: scaling.{bound} {value} is more than {MAX_REPLICAS} "
                    "replicas; is it a typo?",
                    model=name,
                    field=f"scaling.{bound}",
                )
        _validate_rollout(model)
        _validate_disruption(model)
    for alias in model.aliases:
        if not alias.strip() or alias == name:
            raise CatalogError(
                f"model {name!r}: alias {alias!r} is empty or repeats the model's own name",
                model=name,
                field="aliases",
            )
    if len(model.aliases) > 1 and len(set(model.aliases)) != len(model.aliases):
        raise CatalogError(
            f"model {name!r}: an alias is listed twice in aliases", model=name, field="aliases"
        )
    if not rest_known:
        # Zero means unknown for both; a negative number or a completion bound larger
        # than the whole window is a typo that clients would size their prompts from.
        if model.context_length < 0 or model.max_output < 0:
            for field_name, value in (
                ("context_length", model.context_length),
                ("max_output", model.max_output),
            ):
                if value < 0:
                    raise CatalogError(
                        f"model {name!r}: {field_name} {value} is negative; use 0 for unknown",
                        model=name,
                        field=field_name,
                    )
        if model.context_length and model.max_output > model.context_length:
            raise CatalogError(
                f"model {name!r}: max_output {model.max_output} exceeds context_length "
                f"{model.context_length}; a completion cannot be longer than the whole window",
                model=name,
                field="max_output",
            )
        profiles_known = _validate_rest(name, profiles, model.placement)
    else:
        profiles_known = True
    # Last, so that the plainer refusals above (no name, no profile name) read as before.
    check_model_names(model, profiles_valid=profiles_known, fields_valid=rest_known)
    if not rest_known:  # after the grammar, so a malformed name is refused as one
        check_routing_profile(name, model.routing_profile)
    # Remembered only now that every check has passed, check_model_names's too.
    if not profiles_known and type(profiles) is tuple:
        if len(_VALID_PROFILES) >= _VALID_PROFILES_LIMIT:
            _VALID_PROFILES.clear()
        _VALID_PROFILES[id(profiles)] = profiles
    if not rest_known:
        if len(_VALID_REST) >= _VALID_PROFILES_LIMIT:
            _VALID_REST.clear()
        _VALID_REST[rest_key] = (
            profiles,
            model.scaling,
            model.rollout,
            model.placement,
            model.disruption,
        )


def _validate_rest(name: str, profiles: Seq[Profile], placement: PlacementRules) -> bool:
    """The profiles and placement; whether the profiles were known valid already."""
    # A list of profiles found valid before is valid again: every profile check
    # reads only the list (the model's name is only in the words of a refusal).
    known = _VALID_PROFILES.get(id(profiles)) is profiles
    if not known:
        seen: set[str] = set()
        for p in profiles:
            _validate_profile(name, p, seen)
    _validate_placement(name, placement)
    return known


# Profile lists that passed ``validate``, by identity, each kept alive by its entry
# (so no other list can take its id). catalog.stored.fast_decode hands out one tuple per
# distinct list of profiles it has read, and a log holds a handful of distinct
# lists among tens of thousands of definitions: replay checks each list once. The
# models are frozen; the dicts inside a profile (env, node_selector) are never
# edited in place (views copy them).
_VALID_PROFILES: dict[int, tuple[Profile, ...]] = {}
_VALID_PROFILES_LIMIT = 4096
# The same for lists ``normalize`` found already normalised (no default to apply).
_NORMAL_PROFILES: dict[int, tuple[Profile, ...]] = {}
# Definitions whose fields other than the names passed ``validate``: the values,
# and the sections by identity (kept alive by the entry, as above).
_VALID_REST: dict[tuple[object, ...], tuple[object, ...]] = {}


def _validate_placement(model: str, rules: PlacementRules) -> None:
    if abs(rules.priority) > MAX_PRIORITY:
        raise CatalogError(
            f"model {model!r}: placement.priority {rules.priority} is beyond +/-{MAX_PRIORITY}; "
            "priorities only order models against each other, so small numbers do",
            model=model,
            field="placement.priority",
        )
    spread_by = rules.spread_by
    # A label key as nodes report it: a typo here would spread over a label no
    # node carries, which is no spread at all, so refuse what cannot be a key.
    if spread_by is not None and (
        len(spread_by) > MAX_SPREAD_BY or " " in spread_by or not printable(spread_by)
    ):
        raise CatalogError(
            f"model {model!r}: placement.spread_by {spread_by[:60]!r} is not a label key "
            "(at most 253 printable characters, no spaces); name the node label to spread "
            "over, such as zone or rack",
            model=model,
            field="placement.spread_by",
        )


def _validate_rollout(model: Model) -> None:
    rollout = model.rollout
    for field_name in ("max_surge", "max_unavailable"):
        value = getattr(rollout, field_name)
        if not 0 <= value <= MAX_REPLICAS:
            raise CatalogError(
                f"model {model.name!r}: rollout.{field_name} {value} must be between 0 and "
                f"{MAX_REPLICAS}",
                model=model.name,
                field=f"rollout.{field_name}",
            )
    # Neither an extra replica nor a missing one: a rollout could never take a step.
    if rollout.max_surge == 0 and rollout.max_unavailable == 0:
        raise CatalogError(
            f"model {model.name!r}: rollout.max_surge and rollout.max_unavailable are both 0, "
            "so a replacement could never start; allow a surge (max_surge: 1) or a missing "
            "replica (max_unavailable: 1)",
            model=model.name,
            field="rollout",
        )


def _validate_disruption(model: Model) -> None:
    value = model.disruption.max_unavailable
    if value is None:
        return
    if isinstance(value, str):
        digits = value[:-1]
        well_formed = value.endswith("%") and digits.isascii() and digits.isdigit()
        if not well_formed or len(digits) > 3 or int(digits) > 100:
            raise CatalogError(
                f"model {model.name!r}: disruption.max_unavailable {value[:20]!r} is neither a "
                'count nor a percentage; write a whole number (2) or "N%" with N from 0 to 100',
                model=model.name,
                field="disruption.max_unavailable",
            )
    elif not 0 <= value <= MAX_REPLICAS:
        raise CatalogError(
            f"model {model.name!r}: disruption.max_unavailable {value} must be between 0 and "
            f"{MAX_REPLICAS}; 0 (or movable: false) never moves the model",
            model=model.name,
            field="disruption.max_unavailable",
        )


def _check_bounds(model: str, p: Profile) -> None:
    """Numbers no real profile has: typos that would otherwise be stored and planned."""
    limits = (
        ("tp", p.tp, MAX_PARALLEL),
        ("pp", p.pp, MAX_PARALLEL),
        ("nodes", p.nodes, MAX_PARALLEL),
        ("gpus_per_node", p.gpus_per_node, MAX_PARALLEL),
        ("min_memory_gb", p.min_memory_gb, MAX_MEMORY_GB),
        ("slots", p.slots, MAX_SLOTS),
    )
    for field_name, value, limit in limits:
        if value > limit:
            raise CatalogError(
                f"{_where(model, p)}: {field_name} {value} is more than {limit}; is it a typo?",
                model=model,
                profile=p.name,
                field=field_name,
            )
    if not math.isfinite(p.weight):
        raise CatalogError(
            f"{_where(model, p)}: weight {p.weight} is not a finite number; use a positive "
            "number, ideally measured by a benchmark",
            model=model,
            profile=p.name,
            field="weight",
        )


def _validate_env(model: str, p: Profile) -> None:
    for name, value in p.env.items():
        if isinstance(value, str):
            continue
        problem = secret_name_problem(value.secret)
        if problem is not None:
            raise CatalogError(
                f"{_where(model, p)}: env {name}: secret {value.secret[:60]!r} {problem}",
                model=model,
                profile=p.name,
                field=f"profiles.env.{name}",
            )


def _validate_profile(model: str, p: Profile, seen: set[str]) -> None:
    if not p.name:
        raise CatalogError(
            f"model {model!r}: a profile has no name; give each profile a name such as 'a100-tp2'",
            model=model,
            field="profiles.name",
        )
    if p.name in seen:
        raise CatalogError(
            f"model {model!r}: profile {p.name!r} is declared twice; profile names must be "
            "unique within a model",
            model=model,
            profile=p.name,
            field="profiles.name",
        )
    seen.add(p.name)
    if p.gpu_class == "" and not cpu_capable(p.engine):
        where = _where(model, p)
        raise CatalogError(
            f"{where}: gpu_class is required for engine {p.engine!r}; only llamacpp can serve "
            "without a GPU",
            model=model,
            profile=p.name,
            field="gpu_class",
        )
    _check_bounds(model, p)
    if p.env:
        _validate_env(model, p)
    if p.slots < 0:
        raise CatalogError(
            f"{_where(model, p)}: slots {p.slots} is negative; use 0 to read it from the "
            "engine's args (--max-num-seqs, --parallel, --slots)",
            model=model,
            profile=p.name,
            field="slots",
        )
    if p.min_memory_gb < 0:
        where = _where(model, p)
        raise CatalogError(
            f"{where}: min_memory_gb {p.min_memory_gb} is negative; use 0 for unconstrained",
            model=model,
            profile=p.name,
            field="min_memory_gb",
        )
    if p.cpu_only:
        if p.nodes > 1:
            where = _where(model, p)
            raise CatalogError(
                f"{where}: a CPU profile cannot span {p.nodes} nodes; set nodes to 1",
                model=model,
                profile=p.name,
                field="nodes",
            )
        return
    # The arithmetic has to add up, or the engine is handed a shard spec it
    # cannot satisfy and fails minutes later, during model loading.
    pp = max(p.pp, 1)
    if p.gpus_per_node * p.nodes != p.tp * pp:
        where = _where(model, p)
        raise CatalogError(
            f"{where}: {p.nodes} nodes x {p.gpus_per_node} GPUs does not match TP {p.tp} x "
            f"PP {pp}; make nodes x gpus_per_node equal tp x pp",
            model=model,
            profile=p.name,
            field="gpus_per_node",
        )


def _where(model: str, p: Profile) -> str:
    # Built only for a refusal: formatting it for every profile checked cost more
    # than the checks themselves.
    return f"model {model!r} profile {p.name!r}"
