"""User-data that makes every node the cloud starts configure itself.

`render_user_data(spec)` fills the ONE cloud-init template (user-data.yaml.tmpl) with the node's
settings (/etc/torchfleet/node.json, typed by the agent's NodeConfig, which BootstrapSpec is), the
stub that fetches, verifies and runs the node agent (torchfleet_agent/boot.py, gzip+base64) and
the agent's systemd units. The agent itself travels in
the node bundle (infra.bundle), so its size is no concern of the user-data. The result is
deterministic (same spec -> same bytes, so an unchanged stack does not roll its group) and within
the cloud's user-data limit (AWS 16 KB, Alibaba ECS 32 KB). A spec that cannot work raises
`BootstrapError` naming the field, the value and what is allowed, before any resource is
registered with it.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import string
import textwrap
from collections.abc import Mapping
from pathlib import Path

from torchfleet_compat.problems import InvalidInput, Problems

from infra.bootstrap.torchfleet_agent import boot
from infra.constants import PROJECT, SERVICE_PORT

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "user-data.yaml.tmpl"
AGENT = HERE / "torchfleet_agent"  # the package the bundle ships (agent/torchfleet_agent/)
STUB = AGENT / "boot.py"
UNITS = HERE / "units"
# Node paths the template and the units name: boot.py's, so the stub and they agree.
NODE_PATHS = {"config": boot.CONFIG, "stub": boot.STUB, "command": boot.COMMAND}
MAX_USER_DATA = {"aws": 16 * 1024, "alicloud": 32 * 1024}
CLOUDS = ("aws", "alicloud")
MODES = ("cold", "baked", "bake")
# Overrides for tests (moto, a fake metadata service): one per API the agent calls.
ENDPOINTS = {
    "aws": ("s3", "autoscaling", "cloudwatch", "elbv2", "secretsmanager", "imds"),
    "alicloud": ("oss", "ess", "cms", "slb", "kms", "imds"),
}


class BootstrapError(InvalidInput):
    heading = "invalid bootstrap spec:"


# A node's settings. node.json's schema is the agent's NodeConfig (torchfleet_agent/boot.py: the
# node reads the file with its own package, without infra/), so the two cannot name different
# fields or types. Build one as a dict or with `BootstrapSpec(cloud=..., ...)`: the keys without
# a default (REQUIRED) must be given. boot.py is also the user-data's stub, byte for byte: an edit
# there changes every node's user-data (and rolls every group), so the schema is read, not edited,
# from here.
BootstrapSpec = boot.NodeConfig

# What node.json holds where a spec says nothing, so the file always names these keys (an
# unchanged stack renders the same bytes). "model" has none: it is written only when given (a node
# config from before the key existed stays byte for byte the same).
DEFAULTS: boot.NodeConfig = {
    "mode": "cold",
    "group_name": None,
    "launch_hook": None,
    "terminate_hook": None,
    "service_port": SERVICE_PORT,
    "metrics_namespace": PROJECT,
    "endpoints": {},
    "group_id": None,
    "metrics_group_id": None,
    "poweroff": True,
    "pip_args": [],
    "api_token_secret": None,
    "target_group_arn": None,
    "load_balancer_id": None,
    "vserver_group_id": None,
}
OPTIONAL = ("model",)
REQUIRED = tuple(k for k in boot.NodeConfig.__annotations__ if k not in {*DEFAULTS, *OPTIONAL})


def node_config(spec: BootstrapSpec) -> boot.NodeConfig:
    """The spec with DEFAULTS filled in (and no `model` where it is None): what node.json holds."""
    node: boot.NodeConfig = {**DEFAULTS, **spec}
    if "model" in node and node["model"] is None:
        del node["model"]
    return node


def _problems(node: boot.NodeConfig) -> Problems:
    """What is wrong with a node config (a spec with DEFAULTS filled in)."""
    found = Problems()
    values: Mapping[str, object] = node  # read by name below
    for key in sorted(set(values) - set(boot.NodeConfig.__annotations__)):
        found.add(key, values[key], "a key of node.json (torchfleet_agent/boot.py NodeConfig)")
    cloud = node.get("cloud")
    if cloud not in CLOUDS:
        found.add("cloud", cloud, ", ".join(CLOUDS))
    if node["mode"] not in MODES:
        found.add("mode", node["mode"], ", ".join(MODES))
    sha256 = node.get("bundle_sha256")
    if not re.fullmatch(r"[0-9a-f]{64}", sha256 or ""):
        found.add("bundle_sha256", sha256, "64 lowercase hex digits (infra.bundle.Bundle.sha256)")
    for name in REQUIRED:
        if name not in ("cloud", "bundle_sha256") and not values.get(name):
            found.add(name, values.get(name), "a non-empty string")
    for hook in ("launch_hook", "terminate_hook"):
        if values[hook] and not node["group_name"]:
            found.add(
                hook,
                values[hook],
                "a hook only with group_name (lifecycle hooks belong to a scaling group)",
            )
    if not 1 <= int(node["service_port"]) <= 65535:
        found.add("service_port", node["service_port"], "1..65535")
    allowed = ENDPOINTS.get(str(cloud), ())
    for key, url in node["endpoints"].items():
        if key not in allowed:
            found.add(f"endpoints[{key!r}]", url, f"keys for {cloud}: {', '.join(allowed)}")
        elif not re.match(r"^https?://", str(url)):
            found.add(f"endpoints[{key!r}]", url, "an http(s) URL")
    model = node.get("model")
    if model is not None:
        if set(model) != {"source", "checksum"}:
            found.add("model", dict(model), "exactly the keys source and checksum")
        elif not re.fullmatch(r"(s3|oss)://[^/\s]+/\S+", model["source"]):
            found.add("model.source", model["source"], "s3://BUCKET/KEY or oss://BUCKET/KEY")
        elif not re.fullmatch(r"sha256:[0-9a-f]{64}", model["checksum"]):
            found.add("model.checksum", model["checksum"], "sha256:<64 lowercase hex>")
    if isinstance(node["pip_args"], str):
        found.add("pip_args", node["pip_args"], "a sequence of arguments, not one string")
    return found


def _block(text: str) -> str:
    """A file's text as the body of a YAML literal block under `content: |`."""
    return textwrap.indent(text.rstrip("\n") + "\n", " " * 6).rstrip("\n")


def unit(name: str) -> str:
    """A systemd unit as the node gets it: its node paths filled in, without its comment lines
    (they explain it here)."""
    lines = (UNITS / name).read_text().splitlines()
    text = "\n".join(line for line in lines if not line.startswith("#")) + "\n"
    return string.Template(text).substitute(NODE_PATHS)


def render_user_data(spec: BootstrapSpec) -> str:
    """A complete `#cloud-config` document, deterministic, within the cloud's size limit."""
    node = node_config(spec)
    _problems(node).raise_if_any(BootstrapError)
    settings: dict[str, object] = {
        **node,
        "endpoints": dict(sorted(node["endpoints"].items())),
        "pip_args": list(node["pip_args"]),
    }
    if "model" in node:
        settings["model"] = dict(node["model"])
    # mtime=0: the compressed stub, and so the user-data, depends on the stub's text only.
    stub = base64.b64encode(gzip.compress(STUB.read_bytes(), compresslevel=9, mtime=0)).decode()
    template = "".join(
        line for line in TEMPLATE.read_text().splitlines(keepends=True) if not line.startswith("##")
    )
    text = string.Template(template).substitute(
        stack=node["stack"],
        cloud=node["cloud"],
        mode=node["mode"],
        bundle_key=node["bundle_key"],
        node_json=_block(json.dumps(settings, indent=2, sort_keys=True)),
        stub_b64=stub,
        **NODE_PATHS,
        unit_bootstrap=_block(unit("torchfleet-bootstrap.service")),
        unit_lifecycle=_block(unit("torchfleet-lifecycle.service")),
        unit_metrics=_block(unit("torchfleet-metrics.service")),
        unit_metrics_timer=_block(unit("torchfleet-metrics.timer")),
    )
    size = len(text.encode())
    if size > MAX_USER_DATA[node["cloud"]]:
        raise BootstrapError(
            [
                f"the rendered user-data is {size} bytes; {node['cloud']} allows "
                f"{MAX_USER_DATA[node['cloud']]}"
            ]
        )
    return text
