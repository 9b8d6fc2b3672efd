"""The policy the CLI's views judge by: the one the server runs, as recorded, and say so.

``llmgw status``, ``nodes list``, ``place`` (and ``--dry-run``), ``explain`` and ``add
--dry-run`` call a node fresh, stale or lost, and plan, by the policy the server last
recorded (``scheduler.persistence.serving_policy``), not by this command's own settings:
a command run without the server's flags or settings file must not contradict it. A flag
given to the command (``--stale-after``, ``--grace``, ``--no-preemption``,
``--no-defragment``, ``--repair-spread``) still wins, for this command only, and the
output says so; with nothing recorded, the command's own settings apply (flags, the
environment, the settings file, the defaults), and the output says that too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from catalog.forms.durations import format_duration
from catalog.forms.text import shown
from llmgw.views import iso

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from llmgw.settings import Settings
    from scheduler.lifecycle.staleness import StalenessPolicy
    from scheduler.persistence.record_format import RecordedRound
    from scheduler.persistence.serving_policy import PolicyInForce, PolicyRecord

# Each field of the policy: its settings section, and the flag that sets it.
FIELDS = {
    "stale_after": ("policy", "--stale-after"),
    "grace": ("policy", "--grace"),
    "preemption": ("policy", "--no-preemption"),
    "defragment": ("scheduler", "--no-defragment"),
    "repair_spread": ("scheduler", "--repair-spread"),
}
# Skipped rows named in the text line (--json lists them all).
SHOWN_SKIPPED = 3


@dataclass(frozen=True, slots=True)
class Judged:
    """The policy to judge by, and how to say where it came from (``json``, ``text``)."""

    policy: StalenessPolicy
    json: dict[str, Any]
    text: str


def judging_policy(settings: Settings, engine: Engine) -> Judged:
    """The policy in force for a command: the recorded one, with the command's flags."""
    from scheduler.persistence.store import SchedulerStore

    return judge(settings, SchedulerStore(engine).policy_in_force())


def judge(settings: Settings, found: PolicyInForce) -> Judged:
    """``found`` (the recorded policy in force), with the flags of ``settings`` over it;
    ``settings`` alone when nothing is recorded."""
    own = settings.policy
    origins = settings.origins
    record = found.record
    flagged = [
        name
        for name, (section, _) in FIELDS.items()
        if origins.get(section, {}).get(name, "").startswith("flag ")
    ]
    if record is None:
        policy = own
        where = "this command's own settings (no server has recorded its policy in this database)"
    else:
        policy = replace(record.policy, **{name: getattr(own, name) for name in flagged})
        where = _source(record)
    out: dict[str, Any] = {
        "source": "settings" if record is None else record.source,
        "round": None if record is None else record.round_id,
        "recorded_at": None if record is None else iso(record.recorded_at),
        "process": None if record is None or not record.process else record.process,
        "host": None if record is None or not record.host else record.host,
        "pid": None if record is None else record.pid,
        **_values(policy),
        "overridden_by_flags": flagged if record is not None else [],
        "skipped": list(found.skipped),
    }
    text = f"judged by {where}: {_summary(policy)}"
    if record is not None and flagged:
        given = ", ".join(
            f"{FIELDS[name][1]} {_value(getattr(own, name))}"
            if name in ("stale_after", "grace")
            else FIELDS[name][1]
            for name in flagged
        )
        verb = "wins over" if len(flagged) == 1 else "win over"
        text += f"; {given} given here {verb} the recorded " + ", ".join(
            f"{_label(n)} {_value(getattr(record.policy, n))}" for n in flagged
        )
    if record is None:
        text += (
            " ("
            + ", ".join(f"{_label(n)}: {_origin(origins, n)}" for n in ("stale_after", "grace"))
            + ")"
        )
    else:
        differ = [
            n
            for n in FIELDS
            if n not in flagged
            and _origin(origins, n) != "default"
            and getattr(own, n) != getattr(record.policy, n)
        ]
        if differ:
            out["own_settings_ignored"] = {n: _value(getattr(own, n)) for n in differ}
            text += (
                "; this command's own settings ("
                + ", ".join(
                    f"{_label(n)} {_value(getattr(own, n))} from {_origin(origins, n)}"
                    for n in differ
                )
                + f") are not what the server runs: give {FIELDS[differ[0]][1]} to judge by them"
            )
    if found.skipped:
        names = "; ".join(shown(s) for s in found.skipped[:SHOWN_SKIPPED])
        more = len(found.skipped) - SHOWN_SKIPPED
        text += f" (skipped, cannot be read: {names}" + (f"; and {more} more)" if more > 0 else ")")
    out["text"] = text
    return Judged(policy, out, text)


def judged_by_round(round_: RecordedRound) -> Judged:
    """``explain --round N``: the policy that round ran with, said the same way."""
    from scheduler.persistence.serving_policy import ROUND, PolicyRecord

    record = PolicyRecord(round_.policy, round_.planned_at, ROUND, round_id=round_.id)
    out: dict[str, Any] = {
        "source": ROUND,
        "round": round_.id,
        "recorded_at": iso(round_.planned_at),
        "process": None,
        "host": None,
        "pid": None,
        **_values(round_.policy),
        "overridden_by_flags": [],
        "skipped": [],
    }
    text = f"judged by {_source(record)}: {_summary(round_.policy)}"
    out["text"] = text
    return Judged(round_.policy, out, text)


def _source(record: PolicyRecord) -> str:
    when = iso(record.recorded_at)
    if record.round_id is not None:
        return f"the policy of round {record.round_id} of {when}"
    who = f"`llmgw {shown(record.process)}` (pid {record.pid} on {shown(record.host)})"
    if record.source == "placing":
        return f"the policy {who} recorded when it placed, at {when}"
    return f"the policy {who} recorded when it started, at {when}"


def _summary(policy: StalenessPolicy) -> str:
    text = f"stale-after {_value(policy.stale_after)}, grace {_value(policy.grace)}"
    if not policy.preemption:
        text += ", no preemption"
    if not policy.defragment:
        text += ", no defragmentation"
    if policy.repair_spread:
        text += ", repairing every spread"
    return text


def _values(policy: StalenessPolicy) -> dict[str, Any]:
    return {
        "stale_after": _value(policy.stale_after),
        "grace": _value(policy.grace),
        "mass_loss_fraction": policy.mass_loss_fraction,
        "preemption": policy.preemption,
        "defragment": policy.defragment,
        "repair_spread": policy.repair_spread,
    }


def _value(value: Any) -> Any:
    return format_duration(value) if isinstance(value, timedelta) else value


def _label(name: str) -> str:
    return name.replace("_", "-")


def _origin(origins: Any, name: str) -> str:
    section = FIELDS[name][0]
    return str(origins.get(section, {}).get(name, "default"))
