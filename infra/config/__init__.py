"""The stack configuration: every `torchfleet:` key, typed and validated.

`load(raw, stack)` turns the raw key/value pairs (Pulumi hands config values over as strings;
structured values as JSON) into a frozen `StackConfig`, or raises `ConfigError` listing every
bad value with the key, the value and what is allowed. The program calls it before it
registers a single resource.

Each key is declared once, as a field of its section's record (keys.py says how): its type,
default, allowed values, doc line and parser in one place, from which the record, the loader's
pass and docs/configuration.md's table come. A block's sub-keys (`spot.max_price_ratio`) are
declared the same way, as the fields of the block's record (Spot), and read by one generic block
reader (reader.py `Reader.block`); the block's parser keeps only the rules between them.

  keys.py        Key, `key(...)` and `sub(...)`: how a key and a sub-key are declared
  reader.py      the problem-collecting reader the parsers share; ConfigError
  fleet.py       cloud, env, region, zones, mode, instance types, nodes, spot, scaling, warm pool
  image.py       boot path, image, distro, CUDA profile, root disk
  network.py     VPC, admin and client CIDRs, port, SSH key, access, TLS, tokens
  operations.py  schedule, TTL, owner, tags, budget, model bucket, monitoring host
  kubernetes.py  the cluster block of mode: kubernetes (rules in infra/k8s/settings.py)
  rollout.py     the candidate beside the stable model; RolloutSplit's arithmetic
  checks.py      rules between sections, as plain functions
  stack.py       StackConfig: the sections together, and what is derived from them
  table.py       FIELDS (every key, in order), SUBFIELDS (every sub-key) and the docs' table
  loader.py      load()

The rest of infra imports from the package (`from infra.config import X`, every name in
`__all__`), never from its modules; the modules import each other in layers (pyproject.toml's
`config` contract): loader, then table and checks, then stack, then the sections (which never
import each other), then reader, then keys.
"""

from infra.config.checks import cross_checks
from infra.config.fleet import (
    CLOUDS,
    ENVS,
    INTERRUPTION,
    LAUNCH_TIMEOUT_RANGE,
    MAX_PRICE_RATIO,
    MODES,
    POOL_MODES,
    SPOT_FALLBACKS,
    Nodes,
    Scaling,
    Spot,
    WarmPool,
)
from infra.config.image import BOOT_MODES, MIN_DISK_OVERHEAD_GB
from infra.config.keys import REQUIRED, Key
from infra.config.loader import load, raw_from_pulumi_config
from infra.config.network import SSH_KEY_PREFIXES
from infra.config.operations import (
    MAX_TTL_HOURS,
    MONITORING_DISK_DEFAULT_GB,
    MONITORING_DISK_GB,
    RESERVED_TAGS,
    Budget,
    Monitoring,
)
from infra.config.reader import MIN_CIDR_PREFIX, NAMESPACE, ConfigError
from infra.config.rollout import (
    CLB_COOKIE_MAX_S,
    STABLE_BACKEND_WEIGHT,
    RolloutSplit,
    model_digest,
)
from infra.config.stack import SECTIONS, StackConfig, distro_warning
from infra.config.table import FIELDS, KEYS, SUBFIELDS, SUBKEYS, readme_table

__all__ = [
    "BOOT_MODES",
    "CLB_COOKIE_MAX_S",
    "CLOUDS",
    "ENVS",
    "FIELDS",
    "INTERRUPTION",
    "KEYS",
    "LAUNCH_TIMEOUT_RANGE",
    "MAX_PRICE_RATIO",
    "MAX_TTL_HOURS",
    "MIN_CIDR_PREFIX",
    "MIN_DISK_OVERHEAD_GB",
    "MODES",
    "MONITORING_DISK_DEFAULT_GB",
    "MONITORING_DISK_GB",
    "NAMESPACE",
    "POOL_MODES",
    "REQUIRED",
    "RESERVED_TAGS",
    "SECTIONS",
    "SPOT_FALLBACKS",
    "SSH_KEY_PREFIXES",
    "STABLE_BACKEND_WEIGHT",
    "SUBFIELDS",
    "SUBKEYS",
    "Budget",
    "ConfigError",
    "Key",
    "Monitoring",
    "Nodes",
    "RolloutSplit",
    "Scaling",
    "Spot",
    "StackConfig",
    "WarmPool",
    "cross_checks",
    "distro_warning",
    "load",
    "model_digest",
    "raw_from_pulumi_config",
    "readme_table",
]
