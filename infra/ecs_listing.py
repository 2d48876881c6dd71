"""The running ECS instances that carry a set of tags: the one listing of an Alibaba group
stack's nodes (a scaling group owns them, so they are found by the stack's tags).

- The operator's dynamic inventory (infra/group_inventory.py) calls `running` with a client on
  the operator's keys.
- The monitoring host runs this file as a program (roles/monitoring ships it as
  files/torchfleet_ecs_sd.py, beside the role's filter plugin, whose `torchfleet_file_sd` gives
  the target labels): Prometheus has no Alibaba discovery, so a timer writes the nodes as
  file_sd lists, which Prometheus re-reads by itself; the scaling group's new nodes (a scale-out,
  a rollout's candidate group, a replacement) are scraped within a refresh. Its credentials are
  the instance's RAM role (the default chain, ALIBABA_CLOUD_ECS_METADATA naming the role), whose
  one grant besides the spend exporter's is ecs:DescribeInstances. A listing that fails leaves
  the last lists in place (exit 1): nodes keep being scraped, and Prometheus' own
  `up` shows any that left.

    torchfleet_ecs_sd.py --region R --stack S --tag KEY=VALUE ... --job NAME=PORT ... --dir DIR

Standard library and Alibaba's SDK only (no torchfleet import): the host has neither.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any

PAGE = 100  # DescribeInstances' largest page


def running(ecs: Any, region: str, tags: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Each running instance carrying every one of `tags`: id, type, spot, private_ip,
    public_ip, zone."""
    from alibabacloud_ecs20140526 import models as ecs_models

    tag = [ecs_models.DescribeInstancesRequestTag(key=k, value=v) for k, v in sorted(tags.items())]
    page = 1
    while True:
        reply = ecs.describe_instances(
            ecs_models.DescribeInstancesRequest(
                region_id=region, status="Running", page_size=PAGE, page_number=page, tag=tag
            )
        ).body.to_map()
        for i in reply.get("Instances", {}).get("Instance", []):
            public = (i.get("PublicIpAddress", {}).get("IpAddress") or [None])[0] or (
                i.get("EipAddress", {}).get("IpAddress") or None
            )
            private = (
                i.get("VpcAttributes", {}).get("PrivateIpAddress", {}).get("IpAddress") or [None]
            )[0]
            yield {
                "id": i["InstanceId"],
                "type": i.get("InstanceType", ""),
                "spot": i.get("SpotStrategy", "NoSpot") not in ("NoSpot", ""),
                "private_ip": private,
                "public_ip": public,
                "zone": i.get("ZoneId", ""),
            }
        if page * PAGE >= int(reply.get("TotalCount", 0)):
            return
        page += 1


def endpoint_config(config: Any, endpoint: str | None) -> Any:
    """`config` with its endpoint replaced by `endpoint` (a URL), when one is given."""
    if endpoint:
        url = urllib.parse.urlsplit(endpoint)
        config.endpoint, config.protocol = url.netloc, url.scheme
    return config


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: KEY=VALUE")
    return key, value


def _write(path: str, doc: Any) -> None:
    """Renamed into place: Prometheus reads the old list or the new one, never half."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".ecs-sd-", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="torchfleet_ecs_sd.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--region", required=True)
    p.add_argument("--stack", required=True)
    p.add_argument("--tag", type=_pair, action="append", required=True, metavar="KEY=VALUE")
    p.add_argument("--job", type=_pair, action="append", required=True, metavar="NAME=PORT")
    p.add_argument("--dir", required=True, help="the file_sd folder: one NAME.json per job")
    p.add_argument("--endpoint", default="", help="ECS endpoint URL (default: the region's)")
    args = p.parse_args(argv)

    # the role's filter plugin, shipped beside this file: the labels every discovery mode gives
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from alibabacloud_credentials.client import Client as Credentials
    from alibabacloud_ecs20140526.client import Client as EcsClient
    from alibabacloud_tea_openapi.models import Config
    from torchfleet_monitoring import torchfleet_file_sd  # type: ignore[import-not-found]

    config = Config(
        credential=Credentials(), region_id=args.region, connect_timeout=3000, read_timeout=10000
    )
    try:
        ecs = EcsClient(endpoint_config(config, args.endpoint))
        found = list(running(ecs, args.region, dict(args.tag)))
    except Exception as err:  # the SDK's errors and the network's: keep the last lists
        print(
            f"torchfleet_ecs_sd: listing the nodes failed, the last lists stay: {err}",
            file=sys.stderr,
        )
        return 1
    nodes = [
        {
            "node": i["id"],
            "address": i["private_ip"] or i["public_ip"] or "",
            "stack": args.stack,
            "cloud": "alicloud",
            "instance_type": i["type"] or "unknown",
            "lifecycle": "spot" if i["spot"] else "on-demand",
        }
        for i in found
        if i["private_ip"] or i["public_ip"]
    ]
    for job, port in args.job:
        _write(os.path.join(args.dir, f"{job}.json"), torchfleet_file_sd(nodes, int(port)))
    print(f"torchfleet_ecs_sd: {len(nodes)} node(s) of {args.stack}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
