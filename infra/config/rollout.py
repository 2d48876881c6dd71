"""The rollout section: a candidate model beside the stable one at the load balancer
(docs/rollouts.md), its share of requests and the files each track serves.

`RolloutSplit` is the block's record (its fields are the block's sub-keys, declared with
`sub(...)`) and carries the
arithmetic of a split: replicas in mode: kubernetes, node counts and the VServer group's weights
in Alibaba's group mode. infra/config/keys.py says how a key is declared.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.config.keys import integer, key, sub
from infra.config.reader import Reader

# Alibaba group mode: each stable node's weight in the CLB's VServer group, ESS's default
# LoadBalancerWeight (what the nodes had in the default server group before the VServer group).
STABLE_BACKEND_WEIGHT = 50
# The CLB's CookieTimeout for an inserted cookie: 1..86400 s.
CLB_COOKIE_MAX_S = 86400


def _model_file(r: Reader, path: str, value: Any, got: Mapping[str, Any]) -> str | None:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,128}\.pt", value):
        r.fail(path, value)
        return None
    return value


@dataclass(frozen=True)
class RolloutSplit:
    """The `rollout` block: the candidate's share of requests at the load balancer."""

    candidate_weight: int = sub(
        "integer",
        "the candidate's percent of requests; the stable version gets the rest",
        "an integer percent 0..100",
        0,
        read=integer(0, 100),
    )
    sticky_s: int = sub(
        "integer",
        "a client stays on its track this long (0: off): AWS, ALB stickiness across the two "
        "target groups; alicloud group mode, the CLB's inserted cookie (its node, so its track)",
        "0 (off) or seconds up to 604800 (the ALB's limit)",
        0,
        read=integer(0, 604800),
    )
    candidate_model: str = sub(
        "string",
        "kubernetes: the candidate's file in the model volume; group: <sha256>.pt in "
        "model_bucket under models/, served by a candidate Auto Scaling / ESS group (required "
        "while candidate_weight > 0)",
        "a file name ending .pt, such as candidate.pt",
        "candidate.pt",
        read=_model_file,
    )
    stable_model: str = sub(
        "string",
        "kubernetes: the stable Deployment's file there; group: <sha256>.pt there, served by "
        "the stable group instead of the bundle's model; a promotion moves it",
        "a file name ending .pt, such as model.pt",
        "model.pt",
        read=_model_file,
    )
    shadow_model: str | None = sub(
        "string",
        "kubernetes: a file there the stable pods run as their shadow, set and removed by "
        "`torchfleet rollout --strategy shadow`",
        "a file name ending .pt, such as shadow.pt",
        read=_model_file,
    )

    def candidate_replicas(self, stable: int) -> int:
        """Kubernetes splits by replicas: beside `stable` replicas, as many candidate ones as
        give the weight (at least one while it is above 0; 100 % is a promotion, not a split)."""
        w = self.candidate_weight
        return 0 if w == 0 else max(1, round(stable * w / (100 - w)))

    def candidate_size(self, stable_min: int, most: int) -> int:
        """The candidate track's size beside a stable track of at least `stable_min` (replicas
        or nodes) within `most` in all: as many as give the weight, at least one while it is
        above 0, at most `most` less `stable_min` (a split near 100 % would otherwise ask for
        more than the fleet may hold); 100 % (group mode's promotion step) is that cap."""
        w = self.candidate_weight
        if w == 0:
            return 0
        cap = max(1, most - stable_min)
        return cap if w == 100 else min(cap, self.candidate_replicas(stable_min))

    def backend_weight(self, stable_min: int, most: int) -> int:
        """Alibaba group mode splits in one VServer group by a weight per scaling group: each
        stable node at STABLE_BACKEND_WEIGHT, each of the candidate_size nodes at the weight
        returned (1..100), so that n_c * w_c / (n_c * w_c + n_s * w_s), with n_s the stable
        group's minimum, is the candidate_weight (rounded; backend_share gives the exact one).
        0 without candidate nodes; 100 (the CLB's most) when the stable minimum is 0 or the
        weight asks for more, which max_backend_share (the config check) refuses."""
        n, p = self.candidate_size(stable_min, most), self.candidate_weight
        if n == 0:
            return 0
        if p == 100 or stable_min == 0:
            return 100
        want = STABLE_BACKEND_WEIGHT * stable_min * p / (n * (100 - p))
        return max(1, min(100, round(want)))

    def backend_share(self, stable_min: int, most: int) -> float:
        """The candidate's percent of requests the VServer group's weights give beside a stable
        group at its minimum (more stable nodes: a smaller share)."""
        n, w = self.candidate_size(stable_min, most), self.backend_weight(stable_min, most)
        total = n * w + stable_min * STABLE_BACKEND_WEIGHT
        return 100 * n * w / total if total else 0.0

    @staticmethod
    def max_backend_share(stable_min: int, most: int) -> int:
        """The largest candidate_weight the VServer group's weights can give (whole percent):
        the candidate_size cap (most less stable_min) at weight 100 beside the stable minimum at
        STABLE_BACKEND_WEIGHT (the stable group's weight never moves: ESS detaches and
        re-attaches a group whose weight changes, all its nodes at once)."""
        cap = max(1, most - stable_min)
        return 100 * cap * 100 // (cap * 100 + stable_min * STABLE_BACKEND_WEIGHT)


def model_digest(name: str) -> str | None:
    """The SHA-256 a content-addressed model file's name carries (`<64 hex>.pt`, the name
    `torchfleet rollout` places a checked copy under), or None for another name."""
    m = re.fullmatch(r"([0-9a-f]{64})\.pt", name)
    return m.group(1) if m else None


def _rollout(r: Reader, got: Mapping[str, Any]) -> RolloutSplit | None:
    cloud, mode, nodes = got["cloud"], got["mode"], got["nodes"]
    raw = r.structured("rollout", dict)
    if raw is None:
        return None
    if mode not in ("group", "kubernetes"):
        r.fail(
            "rollout",
            raw,
            "unset in mode: instances (no load balancer to split at: "
            "`torchfleet rollout` on the local fleet)",
        )
        return None
    files, bad = r.block("rollout", raw, got)
    if bad & {"candidate_model", "stable_model", "shadow_model"}:
        return None
    weight, sticky, shadow = files["candidate_weight"], files["sticky_s"], files["shadow_model"]
    if shadow is not None and mode != "kubernetes":
        r.fail(
            "rollout.shadow_model",
            shadow,
            "unset outside mode: kubernetes (a group's nodes take a new file by being "
            "replaced: every node twice for one shadow test)",
        )
        return None
    if mode == "group":
        # group mode: the block's files are what nodes download and verify, so their names are
        # the stack's content-addressed copies (the digest is the checksum) in model_bucket
        for name in ("candidate_model", "stable_model"):
            if name in raw and model_digest(files[name]) is None:
                r.fail(
                    f"rollout.{name}",
                    files[name],
                    "in mode: group, <sha256 of the file, 64 lowercase hex>.pt: the copy "
                    "`torchfleet rollout` places in model_bucket under models/",
                )
                return None
            if name in raw and not r.get("model_bucket"):
                r.fail(
                    f"rollout.{name}",
                    files[name],
                    "unset without model_bucket (the nodes download the file from it)",
                )
                return None
    if mode == "group" and weight and "candidate_model" not in raw:
        # a share for a candidate target group without nodes: that share would get 503s
        r.fail(
            "rollout.candidate_model",
            None,
            "set while candidate_weight is above 0 in mode: group (the candidate group's "
            "model, <sha256>.pt in model_bucket under models/), or candidate_weight 0",
        )
        return None
    if weight == 100 and mode == "kubernetes":
        r.fail(
            "rollout.candidate_weight",
            weight,
            "0..99 in mode: kubernetes (the split is by replicas beside the stable Deployment; "
            "100 % is the stable Deployment on the candidate's model)",
        )
        return None
    if cloud == "alicloud" and mode == "group" and sticky is not None and sticky > CLB_COOKIE_MAX_S:
        r.fail(
            "rollout.sticky_s",
            sticky,
            f"0 (off) or seconds up to {CLB_COOKIE_MAX_S} on alicloud in mode: group (the CLB "
            "listener's inserted cookie, which keeps a client on its node and so on its track)",
        )
        return None
    if cloud == "alicloud" and mode == "group" and weight is not None and nodes is not None:
        most = RolloutSplit.max_backend_share(nodes.min, nodes.max)
        if weight > most:
            r.fail(
                "rollout.candidate_weight",
                weight,
                f"0..{most} on alicloud in mode: group with nodes.min {nodes.min} and nodes.max "
                f"{nodes.max} (the most the VServer group's weights give: "
                f"{max(1, nodes.max - nodes.min)} candidate nodes at weight 100 beside "
                f"{nodes.min} stable ones at {STABLE_BACKEND_WEIGHT}; a promotion is "
                "stable_model)",
            )
            return None
    if weight is None or sticky is None:
        return None
    return RolloutSplit(**files)


@dataclass(frozen=True, kw_only=True)
class Rollout:
    rollout: RolloutSplit | None = key(  # None: one version behind the load balancer
        "mapping",
        "a candidate model beside the stable one at the load balancer (docs/rollouts.md); "
        "unset: one version, today's plan",
        "mode: group (aws; alicloud: a candidate ESS group in the CLB's "
        "VServer group, candidate_weight up to the share its weights reach, sticky_s up to 86400: "
        "the CLB's cookie), or "
        "mode: kubernetes",
        record=RolloutSplit,
        parse=_rollout,
    )
