"""Address plans shared by both clouds.

The VPC is cut into 2**ZONE_PREFIX_DIFF equal blocks (a /20 each of a /16): the first ones hold
one public subnet / vSwitch per zone, the last one is the stack's services subnet (private: the
monitoring host). Its address is fixed by the plan, not handed out by the cloud, so the bundle's
group vars can name it before the host exists (a node ships its journal there) and the bundle
stays a function of the config alone."""

from __future__ import annotations

import ipaddress

ZONE_PREFIX_DIFF = 4  # each block is 1/16 of the VPC (a /20 of a /16)
BLOCKS = 2**ZONE_PREFIX_DIFF
MAX_ZONES = BLOCKS - 1  # the last block is the services subnet; the config refuses more zones
# The monitoring host's offset in the services subnet: past the addresses either cloud reserves
# at the start of a subnet (AWS the first four, Alibaba the first one).
MONITORING_HOST_OFFSET = 10


def split_cidrs(cidrs: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(IPv4, IPv6): the clouds take the two families in different fields."""
    v4 = [c for c in cidrs if ipaddress.ip_network(c).version == 4]
    v6 = [c for c in cidrs if ipaddress.ip_network(c).version == 6]
    return v4, v6


def _blocks(vpc_cidr: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return list(ipaddress.ip_network(vpc_cidr).subnets(prefixlen_diff=ZONE_PREFIX_DIFF))


def zone_subnets(vpc_cidr: str, count: int) -> list[str]:
    """One block per zone, each 1/16 of the VPC (a /20 of a /16): room for MAX_ZONES zones."""
    if count > MAX_ZONES:
        raise ValueError(f"{count} zones but the address plan has {MAX_ZONES} zone blocks")
    return [str(s) for s in _blocks(vpc_cidr)[:count]]


def services_subnet(vpc_cidr: str) -> str:
    """The last block: private, no zone's nodes in it."""
    return str(_blocks(vpc_cidr)[-1])


def monitoring_address(vpc_cidr: str) -> str:
    return str(ipaddress.ip_network(services_subnet(vpc_cidr))[MONITORING_HOST_OFFSET])
