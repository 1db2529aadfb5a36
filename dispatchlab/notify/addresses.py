"""Which addresses a webhook may be sent to. Django-free: settings parse the allowed networks with it.

Whoever may add an endpoint chooses where the workers POST, from inside the operator's network: an
address that is not on the public internet (loopback, link-local, private, shared, reserved) is refused
unless the operator allows its network (DISPATCHLAB_NOTIFY_ALLOW_NETWORKS=10.20.0.0/16,...). Cloud
metadata addresses are refused even then: no webhook lives there, and they hand out credentials.
A name is resolved once; every address it resolves to must pass, and the request goes to one of those
addresses (so a second lookup cannot answer differently: no DNS rebinding).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# AWS/GCP/Azure/OpenStack/DigitalOcean, AWS over IPv6, Alibaba, Oracle's second one.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "169.254.169.253")
)
NAT64_PREFIX = ipaddress.ip_network("64:ff9b::/96")
SETTING = "DISPATCHLAB_NOTIFY_ALLOW_NETWORKS"


class AddressRefused(Exception):
    """The host is, or resolves to, an address webhooks may not reach; the message says which and why."""


def parse_networks(values: Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDR networks ("10.20.0.0/16", "fd12::/64", a bare address); ValueError names the bad one."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=True))
        except ValueError as error:
            raise ValueError(f"{value!r} is not a network in CIDR notation ({error})") from None
    return tuple(networks)


def _embedded_ipv4(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (::ffff:a.b.c.d, 6to4, NAT64), which is where it leads."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address in NAT64_PREFIX:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def address_refusal(address: IPAddress, allowed: Sequence[IPNetwork]) -> str | None:
    """What kind of address this is when webhooks may not reach it ("a link-local address"); None when
    they may."""
    target = _embedded_ipv4(address)
    if target in METADATA_ADDRESSES or address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if any(target.version == net.version and target in net for net in allowed) or any(
        address.version == net.version and address in net for net in allowed
    ):
        return None
    if target.is_loopback:
        return "a loopback address"
    if target.is_link_local:
        return "a link-local address"
    if target.is_unspecified or target.is_multicast:
        return "not an address a host answers on"
    if not target.is_global:
        return "a private or reserved address"
    return None


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to, in the resolver's order, without repeats. OSError
    (socket.gaierror) when it does not resolve."""
    found: list[IPAddress] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    return found


def checked_addresses(host: str, port: int, allowed: Sequence[IPNetwork]) -> list[IPAddress]:
    """Resolve `host` once and return its addresses; AddressRefused when any of them is refused (a name
    that answers with one internal address among public ones is refused as a whole)."""
    addresses = resolve(host, port)
    for address in addresses:
        kind = address_refusal(address, allowed)
        if kind is not None:
            shown = host if host == str(address) else f"{host} resolves to {address}, which"
            raise AddressRefused(
                f"{shown} is {kind}: webhooks are not sent there"
                + ("." if kind == "a cloud metadata address" else f" unless {SETTING} allows its network.")
            )
    return addresses
