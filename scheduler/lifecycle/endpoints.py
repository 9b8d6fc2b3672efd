"""Which endpoints an agent may claim for its replicas. Pure.

An endpoint an agent reports is handed to clients (``/v1/placements``) and is
where the gateway sends requests: an agent that could report any URL (say
``http://169.254.169.254/latest/meta-data/``) would turn its token into a way
to point traffic anywhere. So an endpoint's host must be its node's own
address, the ``--advertise`` host its agent registered with the node's first
report (kept until ``llmgw nodes forget``), or an address inside a network the
operator allows (``[server] agent_endpoint_networks``).

The registered address itself may not be a link-local, multicast or
unspecified address (cloud metadata services live at link-local ones) unless
an allowed network holds it.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# More networks than this in a settings file is a list pasted by mistake.
MAX_NETWORKS = 256
MAX_ADDRESS = 253


@dataclass(frozen=True, slots=True)
class EndpointPolicy:
    """The networks any agent may report endpoints in, beside its own node's address."""

    networks: tuple[Network, ...] = ()

    def allows(self, ip: Address) -> bool:
        return any(ip.version == n.version and ip in n for n in self.networks)


# Endpoints on each node's own address only: the default.
NO_NETWORKS = EndpointPolicy()


def parse_networks(raw: object) -> tuple[Network, ...]:
    """``["10.0.0.0/8", "fd00::/8"]`` (or one string, comma-separated) as networks.

    A ``ValueError`` names the entry that is not a network.
    """
    items: Iterable[object]
    if isinstance(raw, str):
        items = [part.strip() for part in raw.split(",") if part.strip()]
    elif isinstance(raw, list | tuple):
        items = raw
    else:
        raise ValueError(f"{str(raw)[:60]!r} is not a list of networks such as ['10.0.0.0/8']")
    items = list(items)
    if len(items) > MAX_NETWORKS:
        raise ValueError(f"{len(items)} networks is more than {MAX_NETWORKS}")
    networks = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"{item!r} is not a network such as '10.0.0.0/8'")
        try:
            networks.append(ipaddress.ip_network(item, strict=True))
        except ValueError as exc:
            shown = item[:60]
            raise ValueError(f"{shown!r} is not a network such as '10.0.0.0/8': {exc}") from None
    return tuple(networks)


def _ip(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _same_host(a: str, b: str) -> bool:
    ia, ib = _ip(a), _ip(b)
    if ia is not None or ib is not None:
        return ia == ib
    # Host names compare as DNS does: without case, without the root's trailing dot.
    return a.rstrip(".").lower() == b.rstrip(".").lower()


def address_problem(address: str, policy: EndpointPolicy) -> str | None:
    """Why ``address`` cannot be a node's registered address, or None."""
    if not address or len(address) > MAX_ADDRESS or any(c in address for c in "/@?#[] "):
        return f"{address[:60]!r} is not a host name or an IP address"
    ip = _ip(address)
    if ip is None or policy.allows(ip):
        return None
    if ip.is_link_local or ip.is_multicast or ip.is_unspecified:
        return (
            f"{address} is a link-local, multicast or unspecified address, where no engine "
            "should be reached (cloud metadata services answer at link-local ones); advertise "
            "the node's own address, or allow its network in [server] agent_endpoint_networks"
        )
    return None


def endpoint_problem(endpoint: str, address: str | None, policy: EndpointPolicy) -> str | None:
    """Why an agent of a node registered at ``address`` may not report ``endpoint``, or None."""
    try:
        host = urllib.parse.urlsplit(endpoint).hostname
    except ValueError:
        host = None
    if not host:
        return "it names no host"
    ip = _ip(host)
    if ip is not None and policy.allows(ip):
        return None
    if address is None:
        return (
            "its node has registered no address (its agent predates this check); upgrade "
            "the agent, or allow the network in [server] agent_endpoint_networks"
        )
    if _same_host(host, address) and address_problem(address, policy) is None:
        return None
    return (
        f"host {host} is neither the node's address ({address}) nor in [server] "
        "agent_endpoint_networks; engines must be reached at the node's own address"
    )
