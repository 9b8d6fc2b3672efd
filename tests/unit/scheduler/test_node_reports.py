"""What an agent may report about its node, and the errors it gets when it is wrong."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta, timezone

import pytest

from bench.placement.openb import load_openb_csv
from scheduler.planner.fleet.inventory import Node, NodeReportError, parse_node_report
from tests.unit.scheduler.placement_builders import NOW, OPENB_CSV_CANDIDATES


def refusal(raw: dict[str, object]) -> str:
    with pytest.raises(NodeReportError) as caught:
        parse_node_report(raw)
    return str(caught.value)


def test_an_accepted_report_becomes_a_node_stamped_with_its_arrival_in_utc() -> None:
    raw = {
        "name": "gpu-7",
        "gpu_class": "A100",
        "gpus": 8,
        "gpus_reserved": 2,
        "memory_gb": 1024,
        "labels": {"zone": "eu"},
        "fabric": "ib-1",
    }
    arrived = datetime(2026, 3, 1, 13, 0, tzinfo=timezone(timedelta(hours=1)))

    node = parse_node_report(raw).to_node(arrived)

    assert node == Node(
        name="gpu-7",
        gpu_class="A100",
        gpus=8,
        memory_gb=1024.0,
        reported_at=datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
        labels={"zone": "eu"},
        fabric="ib-1",
        gpus_reserved=2,
    )


def test_a_cpu_node_reports_no_class_and_no_cards() -> None:
    report = parse_node_report({"name": "cpu-1", "gpu_class": "", "fabric": ""})

    assert (report.gpu_class, report.gpus, report.fabric, report.memory_gb) == (None, 0, None, None)


def test_more_reserved_cards_than_cards_is_refused_with_the_fix() -> None:
    message = refusal({"name": "gpu-7", "gpu_class": "A100", "gpus": 8, "gpus_reserved": 9})

    assert message == (
        'node "gpu-7": gpus_reserved 9 is more than gpus 8; report at most the cards the node has'
    )


def test_a_report_without_a_name_is_refused() -> None:
    assert refusal({"gpus": 0}) == "a node report: name is missing; every report must name its node"


def test_an_empty_name_is_refused() -> None:
    assert refusal({"name": ""}).startswith("a node report: name '' is not accepted")


def test_cards_without_a_class_are_refused() -> None:
    assert refusal({"name": "n", "gpus": 4}) == (
        'node "n": gpus is 4 but gpu_class is missing; '
        "name the card type, or report gpus 0 for a node without cards"
    )


def test_a_class_without_cards_is_refused() -> None:
    assert "gpu_class is T4 but gpus is 0" in refusal({"name": "n", "gpu_class": "T4"})


def test_a_negative_card_count_is_refused() -> None:
    message = refusal({"name": "n", "gpu_class": "T4", "gpus": -1})

    assert message.startswith('node "n": gpus -1 is not accepted')
    assert message.endswith("report the number of cards as an integer, 0 for a node without any")


def test_a_card_count_sent_as_text_is_refused() -> None:
    assert refusal({"name": "n", "gpu_class": "T4", "gpus": "2"}).startswith(
        "node \"n\": gpus '2' is not accepted"
    )


def test_zero_memory_is_refused_because_unknown_is_spelled_by_leaving_it_out() -> None:
    assert "leave it out if unknown" in refusal({"name": "n", "memory_gb": 0})


def test_an_unknown_field_is_refused_naming_the_known_ones() -> None:
    message = refusal({"name": "n", "gpu_count": 8})

    assert message.startswith('node "n": gpu_count is not a field of a node report; the fields are')
    assert "gpus_reserved" in message


def test_every_problem_of_a_report_is_named() -> None:
    with pytest.raises(NodeReportError) as caught:
        parse_node_report({"name": "n", "gpus": -1, "labels": {"zone": 1}})

    assert len(caught.value.problems) == 2
    assert all(problem.startswith('node "n":') for problem in caught.value.problems)


def test_a_node_without_a_time_zone_is_refused() -> None:
    with pytest.raises(ValueError, match="has no time zone"):
        Node("n", None, 0, None, datetime(2026, 3, 1, 12, 0))


def test_the_openb_trace_loads_as_an_inventory() -> None:
    path = next(p for p in OPENB_CSV_CANDIDATES if p.exists())

    nodes = load_openb_csv(path, reported_at=NOW)

    assert len(nodes) == 1213
    assert Counter(n.gpu_class for n in nodes) == {
        "G2": 549,
        "T4": 404,
        "P100": 134,
        "V100M16": 55,
        "G3": 39,
        "V100M32": 30,
        "A10": 2,
    }
    first = nodes[0]
    assert (first.name, first.gpu_class, first.gpus, first.memory_gb) == (
        "openb-node-0000",
        "P100",
        2,
        256.0,
    )
    assert all(n.reported_at == NOW for n in nodes)


def test_replica_states_are_optional_and_absent_means_leave_them_as_they_were() -> None:
    assert parse_node_report({"name": "gpu-7"}).replicas is None
    assert parse_node_report({"name": "gpu-7", "replicas": []}).replicas == []


def test_a_replica_state_report_is_strict_and_names_what_to_send() -> None:
    assert "replicas.0.state 'running' is not accepted" in refusal(
        {"name": "gpu-7", "replicas": [{"model": "m", "replica": 0, "state": "running"}]}
    )
    assert "replicas.0.replica" in refusal(
        {"name": "gpu-7", "replicas": [{"model": "m", "replica": "0", "state": "ready"}]}
    )
    assert "is not a field of a replica's report" in refusal(
        {"name": "gpu-7", "replicas": [{"model": "m", "replica": 0, "state": "ready", "pid": 1}]}
    )
    assert "reported twice" in refusal(
        {"name": "gpu-7", "replicas": [{"model": "m", "replica": 0, "state": "ready"}] * 2}
    )
    assert "must be an http:// or https:// URL" in refusal(
        {
            "name": "gpu-7",
            "replicas": [{"model": "m", "replica": 0, "state": "ready", "endpoint": "file:///x"}],
        }
    )


def test_a_replica_report_is_bounded_and_a_terminal_escape_is_refused_not_stored() -> None:
    many = [{"model": "m", "replica": i, "state": "ready"} for i in range(1025)]
    message = refusal({"name": "gpu-7", "replicas": many})
    assert "replicas" in message and len(message) < 600  # named, not echoed whole
    assert "non-printable" in refusal(
        {
            "name": "gpu-7",
            "replicas": [{"model": "m", "replica": 0, "state": "failed", "message": "\x1b[2J"}],
        }
    )
    assert "at most 1000 characters" in refusal(
        {
            "name": "gpu-7",
            "replicas": [{"model": "m", "replica": 0, "state": "failed", "message": "x" * 1001}],
        }
    )
