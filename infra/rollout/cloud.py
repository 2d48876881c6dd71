"""A cloud stack's side of a rollout: the split at the cloud's load balancer, moved through the
stack's `rollout` config block and `up`.

Contract. `CloudSplit(handle, up, tracks, cloud_limit)` is an engine.Fleet whose two "nodes" are
the stack's tracks, `candidate` then `stable` (AWS group mode: the stable and candidate target
groups behind the listener's weighted forward, each with its Auto Scaling group; Kubernetes:
the stable and candidate Deployments, split by replicas). The engine's weights for the two
become the block's `candidate_weight`, the percent they give (policy.split's weights: 20 / 180
is 10 %; equal weights are 50 % while the tracks serve different versions), written with `set_config` on the stack
(the Automation API's `Stack`, or any object with its get_all_config / set_config) and applied
by `up` (the caller's `torchfleet up`), or by `step` where one is given (a mode: group stack
whose cloud allows it: infra/deploy/split.py's targeted update, called with the config as it was
before the change); equal weights with one version on both tracks mean no split (0 %). A
weight the stack already has runs no `up`. The block's other keys
(sticky_s, candidate_model, stable_model) are kept. `cloud_limit` caps the percent (Kubernetes:
99, the stable Deployment keeps its replicas; AWS group mode: 100). Which model a track serves
is the `tracks` object's (serving / switch: a cloud's way to place a file on a track's nodes:
infra/rollout/tracks.py, the Deployments' or the Auto Scaling groups' files in the model
store). A shadow test runs on the stable track (`tracks.shadow`: kubernetes, the stable
Deployment's pods given the file as their shadow_model; a group stack refuses it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from pulumi import automation as auto

from infra.config import NAMESPACE

KEY = f"{NAMESPACE}:rollout"
# The engine switches its nodes in this order: the candidate track first (the split), the
# stable track last (100 %: the promotion).
TRACKS = ("candidate", "stable")


class StackHandle(Protocol):
    def get_all_config(self) -> Mapping[str, auto.ConfigValue]: ...

    def set_config(self, key: str, value: auto.ConfigValue, *, path: bool = False) -> None: ...


class TrackModels(Protocol):
    def serving(self, track: str) -> tuple[Path, str]: ...

    def switch(self, track: str, model: Path) -> str: ...

    def shadow(self, model: Path | None) -> str | None: ...


def block_of(handle: StackHandle) -> dict[str, Any]:
    """The stack's `rollout` block as a dict ({} without one)."""
    value = handle.get_all_config().get(KEY)
    if value is None:
        return {}
    parsed = json.loads(value.value) if isinstance(value.value, str) else value.value
    return dict(parsed or {})


def write_block(handle: StackHandle, block: dict[str, Any]) -> None:
    handle.set_config(KEY, auto.ConfigValue(json.dumps(block, sort_keys=True)))


def weight_of(weights: Mapping[str, int], split: bool = False) -> int:
    """The candidate track's percent of requests for the engine's two weights. Equal weights
    are half the requests each while the two tracks serve different versions (`split`: a 50 %
    step); with one version on both there is no split: the stable track takes it all."""
    stable, candidate = weights.get("stable", 0), weights.get("candidate", 0)
    if stable == candidate and not split:
        return 0
    return round(100 * candidate / (stable + candidate))


class CloudSplit:
    def __init__(
        self,
        handle: StackHandle,
        up: Callable[[], Any],
        tracks: TrackModels,
        cloud_limit: int = 100,
        say: Callable[[str], None] = print,
        step: Callable[[Mapping[str, auto.ConfigValue]], Any] | None = None,
    ) -> None:
        self.handle, self.up, self.tracks = handle, up, tracks
        self.cloud_limit, self.say, self.step = cloud_limit, say, step
        # the version each track serves, as the engine last read or placed it: equal weights
        # are a 50 % split only while the two differ
        self._versions: dict[str, str] = {}

    def block(self) -> dict[str, Any]:
        return block_of(self.handle)

    # --- engine.Fleet --------------------------------------------------------------------------

    def nodes(self) -> list[str]:
        return list(TRACKS)

    def serving(self, node: str) -> tuple[Path, str]:
        path, version = self.tracks.serving(node)
        self._versions[node] = version
        return path, version

    def switch(self, node: str, model: Path) -> str:
        self._versions[node] = version = self.tracks.switch(node, model)
        return version

    def set_weights(self, weights: dict[str, int]) -> None:
        versions = self._versions
        split = "candidate" in versions and versions["candidate"] != versions.get("stable")
        weight = min(self.cloud_limit, weight_of(weights, split))
        if weight == 0 and "stable" in versions:  # no split: the candidate track is the stable's
            versions["candidate"] = versions["stable"]
        block = self.block()
        if block.get("candidate_weight", 0) == weight and block:
            return
        before = dict(self.handle.get_all_config())
        block["candidate_weight"] = weight
        write_block(self.handle, block)
        if self.step is None:
            self.say(f"  stack config {KEY}.candidate_weight = {weight}: `up` moves the split")
            self.up()
            return
        self.say(f"  stack config {KEY}.candidate_weight = {weight}: a targeted update moves it")
        self.step(before)

    def set_shadow(self, node: str, model: Path | None) -> str | None:
        """A shadow test runs on the stable track's pods (the candidate track has none outside
        a split): `tracks.shadow`."""
        if node != "stable":
            return None
        return self.tracks.shadow(model)
