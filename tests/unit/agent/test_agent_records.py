"""An engine record written by this agent reads back whole: every field of ``Record`` has a
checked type (a field without one made every record unreadable, so a restarted agent could
adopt none of its engines)."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

from agent.state import _TYPES, Record, record_of


def test_every_record_field_has_a_checked_type() -> None:
    assert {f.name for f in fields(Record)} <= set(_TYPES)


def test_a_record_reads_back_as_it_was_written() -> None:
    record = Record(
        model="chat",
        replica=0,
        fingerprint="f",
        engine="sim",
        argv=("python", "-m", "agent.sim"),
        pid=123,
        start_time=1.5,
        port=8000,
        endpoint="http://127.0.0.1:8000",
        devices=(0,),
        started_at=2.5,
    )
    assert record_of(json.loads(json.dumps(asdict(record)))) == record
