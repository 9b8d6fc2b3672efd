"""The control plane's replicas as a client holds them: one in use, the next on failure."""

from __future__ import annotations

import pytest

from catalog.forms.servers import MAX_SERVERS, ServerList, parse_servers


def test_a_string_a_comma_list_or_a_list_give_the_urls_in_order_without_duplicates() -> None:
    assert parse_servers("http://a:1") == ("http://a:1",)
    assert parse_servers(" http://a:1/ , https://b:2,,http://a:1") == ("http://a:1", "https://b:2")
    assert parse_servers(["http://a:1", "http://b:2,http://c:3"]) == (
        "http://a:1",
        "http://b:2",
        "http://c:3",
    )


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("a:1", "is not a server URL"),
        ("ftp://a", "is not a server URL"),
        ("http://", "is not a server URL"),
        (" , ", "no server URL given"),
        (3, "is not a URL or a list"),
        (["http://a:1", None], "is not a URL"),
        ("http://" + "a" * 3000, "longer than"),
        (",".join(f"http://h{i}:1" for i in range(MAX_SERVERS + 1)), f"more than {MAX_SERVERS}"),
    ],
)
def test_what_is_not_a_list_of_server_urls_is_refused_saying_what_to_write(
    raw: object, said: str
) -> None:
    with pytest.raises(ValueError, match=said):
        parse_servers(raw)


def test_a_client_sticks_to_one_server_and_moves_to_the_next_once_per_failure() -> None:
    moves: list[tuple[str, str, str]] = []
    servers = ServerList(("http://a", "http://b", "http://c"), lambda *m: moves.append(m))
    assert servers.current == "http://a"
    assert servers.failed("http://a", "refused") == "http://b"
    # A second request that failed on the same server at the same time moves nothing more.
    assert servers.failed("http://a", "refused") == "http://b"
    assert servers.failed("http://b", "timeout") == "http://c"
    assert servers.failed("http://c", "HTTP 503") == "http://a"  # round again
    assert moves == [
        ("http://a", "http://b", "refused"),
        ("http://b", "http://c", "timeout"),
        ("http://c", "http://a", "HTTP 503"),
    ]
    assert servers.switches == 3


def test_with_one_server_there_is_nowhere_to_move() -> None:
    moves: list[object] = []
    servers = ServerList(("http://a",), lambda *m: moves.append(m))
    assert servers.failed("http://a", "refused") == "http://a"
    assert moves == [] and servers.switches == 0 and not servers.several
