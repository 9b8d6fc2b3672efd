"""Which endpoints an agent may claim (scheduler.lifecycle.endpoints), by property."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.lifecycle.endpoints import (
    NO_NETWORKS,
    EndpointPolicy,
    address_problem,
    endpoint_problem,
    parse_networks,
)

ipv4 = st.ip_addresses(v=4)
ports = st.integers(1, 65535)
hostnames = st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,20}){0,3}", fullmatch=True)


def _usable(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return not (ip.is_link_local or ip.is_multicast or ip.is_unspecified)


@given(ipv4.filter(_usable), ports)
def test_an_endpoint_on_the_nodes_own_address_is_allowed(
    ip: ipaddress.IPv4Address, port: int
) -> None:
    assert endpoint_problem(f"http://{ip}:{port}/v1", str(ip), NO_NETWORKS) is None


@given(ipv4, ipv4, ports)
def test_an_endpoint_on_another_address_is_refused_without_an_allowed_network(
    host: ipaddress.IPv4Address, address: ipaddress.IPv4Address, port: int
) -> None:
    if host != address:
        problem = endpoint_problem(f"http://{host}:{port}", str(address), NO_NETWORKS)
        assert problem is not None and str(address) in problem


@given(ipv4, st.integers(8, 30), ports, hostnames)
def test_an_endpoint_in_an_allowed_network_is_allowed_whatever_the_node(
    ip: ipaddress.IPv4Address, prefix: int, port: int, address: str
) -> None:
    network = ipaddress.ip_network(f"{ip}/{prefix}", strict=False)
    policy = EndpointPolicy(parse_networks([str(network)]))
    inside = network.network_address + 1
    assert endpoint_problem(f"http://{inside}:{port}", address, policy) is None
    assert endpoint_problem(f"http://{inside}:{port}", None, policy) is None


@given(hostnames, ports)
def test_a_host_name_matches_without_case_or_the_roots_dot(name: str, port: int) -> None:
    assert endpoint_problem(f"http://{name.upper()}.:{port}", name, NO_NETWORKS) is None
    assert endpoint_problem(f"http://{name}x:{port}", name, NO_NETWORKS) is not None


@pytest.mark.parametrize("address", ["169.254.169.254", "fe80::1", "0.0.0.0", "224.0.0.1"])
def test_a_link_local_multicast_or_unspecified_address_is_no_nodes_own(address: str) -> None:
    assert address_problem(address, NO_NETWORKS) is not None
    host = f"[{address}]" if ":" in address else address
    assert endpoint_problem(f"http://{host}:80/", address, NO_NETWORKS) is not None
    allowed = EndpointPolicy(parse_networks([address + ("/128" if ":" in address else "/32")]))
    assert address_problem(address, allowed) is None


def test_a_node_without_a_registered_address_may_claim_only_allowed_networks() -> None:
    assert "registered no address" in (
        endpoint_problem("http://10.0.0.1:1", None, NO_NETWORKS) or ""
    )


@pytest.mark.parametrize("raw", ["10.0.0.0/33", "10.0.0.1/8", "nonsense", 7, ["10.0.0.0/8", 3]])
def test_a_network_setting_that_is_not_networks_is_refused_naming_it(raw: object) -> None:
    with pytest.raises(ValueError, match="network"):
        parse_networks(raw)
