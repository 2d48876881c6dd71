"""Tags every taggable resource carries (AWS tags, Alibaba labels): who, what, until when."""

from __future__ import annotations

from datetime import datetime

from infra.config import StackConfig
from infra.constants import PROJECT
from infra.schedule import iso_utc


def base_tags(cfg: StackConfig, expiry: datetime | None) -> dict[str, str]:
    return {
        **cfg.tags,
        "project": PROJECT,
        "stack": cfg.stack,
        "env": cfg.env,
        "owner": cfg.owner,
        # Janitors and the autostop role read this; "never" is explicit so a missing tag stays
        # a finding.
        "ttl-expiry": iso_utc(expiry) if expiry else "never",
    }


def with_name(tags: dict[str, str], name: str, **extra: str) -> dict[str, str]:
    return {**tags, "Name": name, **extra}
