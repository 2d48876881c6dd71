"""User-data that makes every node the cloud starts configure itself.

`render_user_data(spec)` fills the ONE cloud-init template (user-data.yaml.tmpl) with the node's
settings (/etc/torchfleet/node.json), the stub that fetches, verifies and runs the node agent
(torchfleet_agent/boot.py, gzip+base64) and the agent's systemd units. The agent itself travels in
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
from dataclasses import asdict, dataclass, field
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


@dataclass(frozen=True)
class BootstrapSpec:
    cloud: str
    region: str
    stack: str
    bundle_bucket: str
    bundle_key: str
    bundle_sha256: str
    mode: str = "cold"
    group_name: str | None = None
    launch_hook: str | None = None
    terminate_hook: str | None = None
    service_port: int = SERVICE_PORT
    metrics_namespace: str = PROJECT
    endpoints: Mapping[str, str] = field(default_factory=dict)
    # Alibaba: the ESS scaling group id ("asg-..."; saves the agent a lookup by name) and the
    # CloudMonitor application group its custom metrics go to (the ESS alarms read them there).
    group_id: str | None = None
    metrics_group_id: str | None = None
    # mode "bake": power off when done (the image is captured from the stopped machine); False
    # when an image builder captures a running machine: the bake then ends with state "ready".
    poweroff: bool = True
    # Extra pip options for the node's venvs (the bootstrap venv's cloud SDKs, the Ansible venv's
    # ansible-core): a mirror in China regions (("--index-url", URL),), an offline wheelhouse in
    # tests. Empty: pip's default index.
    pip_args: tuple[str, ...] = ()
    # The stack's API token: the name of its secret (AWS Secrets Manager, Alibaba KMS), which the
    # node reads with its own credentials; never the token itself.
    api_token_secret: str | None = None
    # What the node leaves before it drains (torchfleet_agent/leave.py): the ALB's target group
    # (AWS group mode), the CLB and its VServer group the listeners forward to (Alibaba group
    # mode: the node's weight there goes to 0, at service_port).
    target_group_arn: str | None = None
    load_balancer_id: str | None = None
    vserver_group_id: str | None = None
    # The model this node serves instead of the bundle's group vars (a rollout's candidate group,
    # or the stable group after a promotion): {"source": "s3://..." | "oss://...", "checksum":
    # "sha256:<hex>"}, handed to Ansible as extra vars (torchfleet_agent/inventory.py). An
    # object key and a digest, never a credential. None: the bundle's model.
    model: Mapping[str, str] | None = None


def _problems(spec: BootstrapSpec) -> Problems:
    found = Problems()
    if spec.cloud not in CLOUDS:
        found.add("cloud", spec.cloud, ", ".join(CLOUDS))
    if spec.mode not in MODES:
        found.add("mode", spec.mode, ", ".join(MODES))
    if not re.fullmatch(r"[0-9a-f]{64}", spec.bundle_sha256 or ""):
        found.add(
            "bundle_sha256",
            spec.bundle_sha256,
            "64 lowercase hex digits (infra.bundle.Bundle.sha256)",
        )
    for name in ("region", "stack", "bundle_bucket", "bundle_key"):
        if not getattr(spec, name):
            found.add(name, getattr(spec, name), "a non-empty string")
    for hook in ("launch_hook", "terminate_hook"):
        if getattr(spec, hook) and not spec.group_name:
            found.add(
                hook,
                getattr(spec, hook),
                "a hook only with group_name (lifecycle hooks belong to a scaling group)",
            )
    if not 1 <= int(spec.service_port) <= 65535:
        found.add("service_port", spec.service_port, "1..65535")
    allowed = ENDPOINTS.get(spec.cloud, ())
    for key, url in spec.endpoints.items():
        if key not in allowed:
            found.add(f"endpoints[{key!r}]", url, f"keys for {spec.cloud}: {', '.join(allowed)}")
        elif not re.match(r"^https?://", str(url)):
            found.add(f"endpoints[{key!r}]", url, "an http(s) URL")
    if spec.model is not None:
        if set(spec.model) != {"source", "checksum"}:
            found.add("model", dict(spec.model), "exactly the keys source and checksum")
        elif not re.fullmatch(r"(s3|oss)://[^/\s]+/\S+", spec.model["source"]):
            found.add("model.source", spec.model["source"], "s3://BUCKET/KEY or oss://BUCKET/KEY")
        elif not re.fullmatch(r"sha256:[0-9a-f]{64}", spec.model["checksum"]):
            found.add("model.checksum", spec.model["checksum"], "sha256:<64 lowercase hex>")
    if isinstance(spec.pip_args, str):
        found.add("pip_args", spec.pip_args, "a sequence of arguments, not one string")
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
    _problems(spec).raise_if_any(BootstrapError)
    settings = {
        **asdict(spec),
        "endpoints": dict(sorted(spec.endpoints.items())),
        "pip_args": list(spec.pip_args),
    }
    # without an override the node config is byte for byte what it was before the key existed
    # (an unchanged stack does not roll its group)
    if spec.model is None:
        del settings["model"]
    else:
        settings["model"] = dict(spec.model)
    # mtime=0: the compressed stub, and so the user-data, depends on the stub's text only.
    stub = base64.b64encode(gzip.compress(STUB.read_bytes(), compresslevel=9, mtime=0)).decode()
    template = "".join(
        line for line in TEMPLATE.read_text().splitlines(keepends=True) if not line.startswith("##")
    )
    text = string.Template(template).substitute(
        stack=spec.stack,
        cloud=spec.cloud,
        mode=spec.mode,
        bundle_key=spec.bundle_key,
        node_json=_block(json.dumps(settings, indent=2, sort_keys=True)),
        stub_b64=stub,
        **NODE_PATHS,
        unit_bootstrap=_block(unit("torchfleet-bootstrap.service")),
        unit_lifecycle=_block(unit("torchfleet-lifecycle.service")),
        unit_metrics=_block(unit("torchfleet-metrics.service")),
        unit_metrics_timer=_block(unit("torchfleet-metrics.timer")),
    )
    size = len(text.encode())
    if size > MAX_USER_DATA[spec.cloud]:
        raise BootstrapError(
            [
                f"the rendered user-data is {size} bytes; {spec.cloud} allows "
                f"{MAX_USER_DATA[spec.cloud]}"
            ]
        )
    return text
