"""The local fleet's side of a rollout: runtime nodes behind the local HAProxy.

Contract. The fleet is described by `<folder>/fleet.json` (`LocalFleet.describe` writes it,
`LocalFleet.load` reads it): the HAProxy folder of infra/deploy/balancer.py (its runtime API
socket), and per node its name (the HAProxy server), base URL and the model file its runtime
serves; the admin token file of `POST /admin/reload`, and the API token / CA file for reading
the nodes. A node switches model the way an operator would: the new file (and its sidecar, or
no sidecar) written beside the served one and renamed over it, then the runtime's zero-downtime
reload (POST /admin/reload), which answers with the version now serving or 422 with the reason
(the old model keeps serving). A shadow test places the candidate at the node's `shadow` path
(its runtime's shadow_model) and reloads; removing the file and reloading ends it. Weights go
to HAProxy's runtime API (no reload of HAProxy).
The folder also holds the rollout's state (`rollout.json`) and its model store (`models/`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra import client
from infra.deploy.balancer import Balancer, Certificates
from infra.rollout.errors import RolloutError
from infra.rollout.ref import Store
from infra.rollout.state import RolloutState

FLEET_FILE = "fleet.json"
RELOAD_TIMEOUT_S = 300.0  # a reload loads and warms the new model beside the old one


class SwitchError(RolloutError):
    """A node did not switch models (the message carries the runtime's reason)."""


@dataclass(frozen=True)
class LocalNode:
    name: str
    url: str
    model: str
    shadow: str = ""  # the runtime's shadow_model path ("" when it has none)


class LocalFleet:
    def __init__(
        self,
        folder: Path,
        balancer: Balancer,
        nodes: list[LocalNode],
        admin_token_file: Path,
        auth: client.Auth | None = None,
    ) -> None:
        self.folder = folder
        self.balancer = balancer
        self._nodes = {n.name: n for n in nodes}
        self.admin_token_file = admin_token_file
        self.auth = auth or client.Auth()

    # --- the description -----------------------------------------------------------------------

    def describe(self) -> None:
        doc = {
            "balancer": {
                "folder": str(self.balancer.folder),
                "https_port": self.balancer.https_port,
                "ca": str(self.balancer.certificates.ca),
                "pem": str(self.balancer.certificates.pem),
            },
            "nodes": [n.__dict__ for n in self._nodes.values()],
            "admin_token_file": str(self.admin_token_file),
            "api_token": self.auth.token,
            "cafile": self.auth.cafile,
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / FLEET_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it names a token
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)

    @classmethod
    def load(cls, folder: Path) -> LocalFleet:
        path = folder / FLEET_FILE
        try:
            doc: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            raise SwitchError(
                f"{path} does not exist: the local fleet writes it when it starts"
            ) from None
        lb = doc["balancer"]
        balancer = Balancer(
            Path(lb["folder"]),
            [],
            Certificates(Path(lb["ca"]), Path(lb["pem"])),
            https_port=int(lb["https_port"]),
        )
        nodes = [LocalNode(**n) for n in doc["nodes"]]
        auth = client.Auth(token=doc.get("api_token"), cafile=doc.get("cafile"))
        return cls(folder, balancer, nodes, Path(doc["admin_token_file"]), auth)

    def state(self) -> RolloutState:
        return RolloutState(self.folder / "rollout.json")

    def store(self) -> Store:
        return Store(self.folder / "models")

    def urls(self) -> dict[str, str]:
        return {n.name: n.url for n in self._nodes.values()}

    # --- engine.Fleet --------------------------------------------------------------------------

    def nodes(self) -> list[str]:
        return list(self._nodes)

    def serving(self, node: str) -> tuple[Path, str]:
        n = self._nodes[node]
        card = client.get_json(client.Target.parse(n.url, self.auth), "/v1/model", timeout=10)
        return Path(n.model), str(card["model_version"])

    def switch(self, node: str, model: Path) -> str:
        _place(model, Path(self._nodes[node].model))
        return str(self._reload(node)["model_version"])

    def set_shadow(self, node: str, model: Path | None) -> str | None:
        """Start (a file) or end (None) a shadow test on `node`: the candidate at the runtime's
        shadow_model path, then a reload; the candidate's version once it serves."""
        n = self._nodes[node]
        if not n.shadow:
            raise SwitchError(f"{node} has no shadow_model path: start its runtime with one")
        if model is None:
            Path(n.shadow).unlink(missing_ok=True)
            Path(n.shadow).with_suffix(".json").unlink(missing_ok=True)
            self._reload(node)
            return None
        _place(model, Path(n.shadow))
        self._reload(node)
        target = client.Target.parse(n.url, self.auth)
        deadline = time.monotonic() + RELOAD_TIMEOUT_S
        while True:
            shadow = client.get_json(target, "/v1/model", timeout=10).get("shadow") or {}
            if shadow.get("state") == "ready":
                return str(shadow["model_version"])
            if shadow.get("state") != "loading" or time.monotonic() > deadline:
                raise SwitchError(f"{node}: the shadow candidate is not serving: {shadow}")
            time.sleep(0.2)

    def shadow_summary(self, node: str) -> dict[str, Any] | None:
        target = client.Target.parse(self._nodes[node].url, self.auth)
        shadow = client.get_json(target, "/v1/model", timeout=10).get("shadow")
        return shadow if isinstance(shadow, dict) else None

    def _reload(self, node: str) -> dict[str, Any]:
        n = self._nodes[node]
        token = self.admin_token_file.read_text().strip()
        status, body, _ = client.request(
            "POST",
            n.url.rstrip("/") + "/admin/reload",
            b"",
            {"Authorization": f"Bearer {token}"},
            timeout=RELOAD_TIMEOUT_S,
            auth=client.Auth(cafile=self.auth.cafile),
        )
        if status != 200:
            try:
                why = json.loads(body)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                why = body[:300].decode(errors="replace") or "no answer"
            raise SwitchError(f"{node}: reload answered {status}: {why}")
        answer: dict[str, Any] = json.loads(body)
        return answer

    def set_weights(self, weights: dict[str, int]) -> None:
        for node, w in weights.items():
            self.balancer.set_weight(node, w)


def _place(model: Path, served: Path) -> None:
    """`model` (and its sidecar, or none) at `served`, each renamed into place: a concurrent
    reader sees the old file or the new one."""
    tmp = served.with_name(f".{served.name}.rollout")
    shutil.copyfile(model, tmp)
    os.replace(tmp, served)
    sidecar, served_sidecar = model.with_suffix(".json"), served.with_suffix(".json")
    if sidecar.is_file():
        shutil.copyfile(sidecar, tmp)
        os.replace(tmp, served_sidecar)
    else:
        served_sidecar.unlink(missing_ok=True)  # an old sidecar would name the old version
