"""GPU instance types of both clouds: what each one holds and what it costs.

This module and compat/matrix.yml are the only places that know such facts. GPU memory and
compute capability are not repeated here: they belong to the GPU model and come from the
matrix (see `InstanceType.gpu`).

Prices are REFERENCE FIGURES for estimates and spot caps, not quotes:
- AWS: on-demand Linux USD/hour in us-east-1, public price list as of 2024-06. AWS cut P4d/P5
  on-demand prices in mid-2025; check current pricing before relying on p4d/p5 figures.
- Alibaba Cloud: pay-as-you-go USD/hour on the international site in ap-southeast-1
  (Singapore), approximate list prices as of 2024-06 (about +/-20%). Accounts on the China site
  are billed in CNY: set `torchfleet:spot.on_demand_prices` so spot caps use your real prices.
- `typical_spot_ratio`: a rough long-run spot/on-demand price ratio per family (AWS Spot
  Instance Advisor and Alibaba's spot price history, 2024), used only for the "typical" column
  of the cost estimate. The cap the stacks enforce never depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.matrix import GpuModel, load_matrix

PRICE_SOURCES = {
    "aws": "AWS EC2 on-demand Linux price list, us-east-1, 2024-06 (reference figures)",
    "alicloud": "Alibaba Cloud ECS pay-as-you-go list, ap-southeast-1, USD, 2024-06 "
    "(approximate reference figures)",
}
REFERENCE_REGION = {"aws": "us-east-1", "alicloud": "ap-southeast-1"}
# A stopped instance costs its volumes only: gp3 USD per GiB-month, us-east-1 price list,
# 2024-06 (reference figure), for the warm pool's share of the estimate.
EBS_GP3_USD_PER_GB_MONTH = 0.08
# The monitoring host's disk (AWS gp3; Alibaba ESSD PL1, approximate), same sources and dates.
DISK_USD_PER_GB_MONTH = {"aws": EBS_GP3_USD_PER_GB_MONTH, "alicloud": 0.07}
# The NAT gateway its private subnet reaches the package archive and the cloud APIs through,
# with its public address, per hour before traffic (AWS NAT gateway 0.045 + public IPv4 0.005;
# Alibaba enhanced Internet NAT gateway instance fee + EIP, approximate), same sources and dates.
NAT_USD_PER_HOUR = {"aws": 0.05, "alicloud": 0.05}


@dataclass(frozen=True)
class HostType:
    """A general-purpose type for the stack's monitoring host (no GPU)."""

    cloud: str
    name: str
    vcpu: int
    ram_gib: float
    usd_per_hour: float


# roles/monitoring/README.md sizes the host: 2 vCPU and 4 GiB hold tens of nodes at 15 s
# scrapes; the larger ones are for bigger fleets or Grafana beside Prometheus. Prices as above.
HOST_TYPES: dict[str, dict[str, HostType]] = {
    cloud: {name: HostType(cloud, name, vcpu, ram, price) for name, vcpu, ram, price in rows}
    for cloud, rows in {
        "aws": [
            ("t3.medium", 2, 4, 0.0416),
            ("t3.large", 2, 8, 0.0832),
            ("m6i.large", 2, 8, 0.096),
            ("m6i.xlarge", 4, 16, 0.192),
        ],
        "alicloud": [
            ("ecs.c7.large", 2, 4, 0.088),
            ("ecs.g7.large", 2, 8, 0.109),
            ("ecs.g7.xlarge", 4, 16, 0.218),
        ],
    }.items()
}
DEFAULT_HOST_TYPE = {"aws": "t3.medium", "alicloud": "ecs.g7.large"}


@dataclass(frozen=True)
class InstanceType:
    cloud: str
    name: str
    family: str
    gpu_model: str
    gpu_count: int
    vcpu: int
    ram_gib: float
    usd_per_hour: float
    typical_spot_ratio: float

    @property
    def gpu(self) -> GpuModel:
        return load_matrix().gpu(self.gpu_model)

    @property
    def compute_capability(self) -> str:
        return self.gpu.compute_capability

    @property
    def gpu_memory_gib(self) -> int:
        return self.gpu.memory_gib * self.gpu_count


def _family(
    cloud: str, family: str, gpu: str, spot: float, rows: list[tuple]
) -> list[InstanceType]:
    return [
        InstanceType(cloud, name, family, gpu, count, vcpu, ram, price, spot)
        for name, count, vcpu, ram, price in rows
    ]


# (name, GPUs, vCPU, RAM GiB, on-demand USD/hour)
_AWS = [
    *_family(
        "aws",
        "g4dn",
        "T4",
        0.35,
        [
            ("g4dn.xlarge", 1, 4, 16, 0.526),
            ("g4dn.2xlarge", 1, 8, 32, 0.752),
            ("g4dn.4xlarge", 1, 16, 64, 1.204),
            ("g4dn.8xlarge", 1, 32, 128, 2.176),
            ("g4dn.12xlarge", 4, 48, 192, 3.912),
            ("g4dn.16xlarge", 1, 64, 256, 4.352),
        ],
    ),
    *_family(
        "aws",
        "g5",
        "A10G",
        0.40,
        [
            ("g5.xlarge", 1, 4, 16, 1.006),
            ("g5.2xlarge", 1, 8, 32, 1.212),
            ("g5.4xlarge", 1, 16, 64, 1.624),
            ("g5.8xlarge", 1, 32, 128, 2.448),
            ("g5.12xlarge", 4, 48, 192, 5.672),
            ("g5.16xlarge", 1, 64, 256, 4.096),
            ("g5.24xlarge", 4, 96, 384, 8.144),
            ("g5.48xlarge", 8, 192, 768, 16.288),
        ],
    ),
    *_family(
        "aws",
        "g6",
        "L4",
        0.45,
        [
            ("g6.xlarge", 1, 4, 16, 0.8048),
            ("g6.2xlarge", 1, 8, 32, 0.9776),
            ("g6.4xlarge", 1, 16, 64, 1.3232),
            ("g6.8xlarge", 1, 32, 128, 2.0144),
            ("g6.12xlarge", 4, 48, 192, 4.6016),
            ("g6.48xlarge", 8, 192, 768, 13.3504),
        ],
    ),
    *_family(
        "aws",
        "p3",
        "V100",
        0.35,
        [
            ("p3.2xlarge", 1, 8, 61, 3.06),
            ("p3.8xlarge", 4, 32, 244, 12.24),
            ("p3.16xlarge", 8, 64, 488, 24.48),
        ],
    ),
    *_family(
        "aws",
        "p4d",
        "A100",
        0.45,
        [
            ("p4d.24xlarge", 8, 96, 1152, 32.7726),
        ],
    ),
    *_family(
        "aws",
        "p5",
        "H100",
        0.55,
        [
            ("p5.48xlarge", 8, 192, 2048, 98.32),
        ],
    ),
]

_ALICLOUD = [
    *_family(
        "alicloud",
        "gn6i",
        "T4",
        0.30,
        [
            ("ecs.gn6i-c4g1.xlarge", 1, 4, 15, 1.25),
            ("ecs.gn6i-c8g1.2xlarge", 1, 8, 31, 1.45),
            ("ecs.gn6i-c16g1.4xlarge", 1, 16, 62, 1.85),
            ("ecs.gn6i-c24g1.12xlarge", 2, 48, 186, 3.70),
            ("ecs.gn6i-c24g1.24xlarge", 4, 96, 372, 7.40),
        ],
    ),
    *_family(
        "alicloud",
        "gn7i",
        "A10",
        0.35,
        [
            ("ecs.gn7i-c8g1.2xlarge", 1, 8, 30, 1.95),
            ("ecs.gn7i-c16g1.4xlarge", 1, 16, 60, 2.25),
            ("ecs.gn7i-c32g1.8xlarge", 1, 32, 188, 3.30),
            ("ecs.gn7i-c32g1.16xlarge", 2, 64, 376, 6.60),
            ("ecs.gn7i-c32g1.32xlarge", 4, 128, 752, 13.20),
        ],
    ),
    *_family(
        "alicloud",
        "gn6v",
        "V100",
        0.30,
        [
            ("ecs.gn6v-c8g1.2xlarge", 1, 8, 32, 2.90),
            ("ecs.gn6v-c8g1.8xlarge", 4, 32, 128, 11.60),
            ("ecs.gn6v-c8g1.16xlarge", 8, 64, 256, 23.20),
        ],
    ),
    *_family(
        "alicloud",
        "gn7",
        "A100",
        0.40,
        [
            ("ecs.gn7-c12g1.3xlarge", 1, 12, 94, 4.30),
            ("ecs.gn7-c13g1.13xlarge", 4, 52, 378, 17.20),
            ("ecs.gn7-c13g1.26xlarge", 8, 104, 756, 34.40),
        ],
    ),
]

CATALOG: dict[str, dict[str, InstanceType]] = {
    "aws": {t.name: t for t in _AWS},
    "alicloud": {t.name: t for t in _ALICLOUD},
}


def instance_types(cloud: str) -> dict[str, InstanceType]:
    return CATALOG[cloud]


def lookup(cloud: str, name: str) -> InstanceType | None:
    return CATALOG.get(cloud, {}).get(name)


def by_gpu(cloud: str, gpu_model: str, gpu_count: int) -> list[InstanceType]:
    """Types carrying exactly `gpu_count` GPUs of `gpu_model`, cheapest first."""
    found = [
        t for t in CATALOG[cloud].values() if t.gpu_model == gpu_model and t.gpu_count == gpu_count
    ]
    return sorted(found, key=lambda t: t.usd_per_hour)


def same_class(base: InstanceType, limit: int = 3) -> list[InstanceType]:
    """`base` and the next-larger types with the same GPUs (model and count): the pools a
    mixed-instances group may draw spot capacity from without changing what a node can serve."""
    siblings = [
        t
        for t in by_gpu(base.cloud, base.gpu_model, base.gpu_count)
        if t.usd_per_hour >= base.usd_per_hour
    ]
    return siblings[:limit]


def gpu_models(cloud: str) -> list[str]:
    return sorted({t.gpu_model for t in CATALOG[cloud].values()})
