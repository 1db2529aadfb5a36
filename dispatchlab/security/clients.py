"""Who a request comes from: the connection's address, or the one a trusted proxy names."""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.conf import settings

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def _networks(configured: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in configured)


def is_trusted_proxy(address: str) -> bool:
    networks = _networks(tuple(settings.DISPATCHLAB_TRUSTED_PROXIES))
    if not networks:
        return False
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    return any(ip in network for network in networks)


def client_address(peer: str, forwarded: str) -> str:
    """The client's address: `peer` (the connection's), unless `peer` is one of
    DISPATCHLAB_TRUSTED_PROXIES; then the last address of `forwarded` (the value of
    DISPATCHLAB_CLIENT_IP_HEADER, every hop appended by a proxy) that is not itself a trusted proxy."""
    if not forwarded or not is_trusted_proxy(peer):
        return peer
    for hop in reversed([hop.strip() for hop in forwarded.split(",") if hop.strip()]):
        if not is_trusted_proxy(hop):
            return hop
    return peer
