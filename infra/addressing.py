"""Address plans shared by both clouds."""

from __future__ import annotations

import ipaddress

ZONE_PREFIX_DIFF = 4  # each zone gets 1/16 of the VPC (a /20 of a /16)
MAX_ZONES = 2**ZONE_PREFIX_DIFF  # the config refuses more zones than the plan has blocks


def split_cidrs(cidrs: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(IPv4, IPv6): the clouds take the two families in different fields."""
    v4 = [c for c in cidrs if ipaddress.ip_network(c).version == 4]
    v6 = [c for c in cidrs if ipaddress.ip_network(c).version == 6]
    return v4, v6


def zone_subnets(vpc_cidr: str, count: int) -> list[str]:
    """One block per zone, each 1/16 of the VPC (a /20 of a /16): room for MAX_ZONES zones."""
    if count > MAX_ZONES:
        raise ValueError(f"{count} zones but the address plan has {MAX_ZONES} blocks")
    net = ipaddress.ip_network(vpc_cidr)
    return [str(s) for s in list(net.subnets(prefixlen_diff=ZONE_PREFIX_DIFF))[:count]]
