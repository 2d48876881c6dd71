"""The kubernetes section: the cluster of a `mode: kubernetes` stack. infra/k8s/settings.py
owns the block's rules and record; this module declares the key and hands it what the other
sections decided."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.config.keys import key
from infra.config.reader import Reader
from infra.k8s import settings as k8s_settings
from infra.k8s.settings import KubernetesSettings


def _kubernetes(r: Reader, got: Mapping[str, Any]) -> KubernetesSettings | None:
    """The `kubernetes` block, only in that mode."""
    raw = r.structured("kubernetes", dict)
    if got["mode"] != "kubernetes":
        if raw is not None:
            r.fail("kubernetes", raw, "unset unless mode: kubernetes")
        return None
    itypes, nodes, spot = got["instance_types"], got["nodes"], got["spot"]
    return k8s_settings.parse(
        r,
        raw,
        cloud=got["cloud"],
        zones=got["zones"],
        gpus_per_node=itypes[0].gpu_count if itypes else None,
        nodes_max=nodes.max if nodes else None,
        node_image=got["image"],
        spot_enabled=bool(spot and spot.enabled),
        spot_ratio=spot.max_price_ratio if spot else None,
        spot_percentage=spot.on_demand_percentage if spot else None,
        model_bucket=got["model_bucket"],
    )


@dataclass(frozen=True, kw_only=True)
class Kubernetes:
    kubernetes: KubernetesSettings | None = key(  # mode: kubernetes only
        "mapping",
        "the cluster of mode: kubernetes",
        "see infra/k8s/settings.py",
        subkeys=k8s_settings.SUBKEYS,
        parse=_kubernetes,
    )
