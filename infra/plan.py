"""Offline plan: `python -m infra.plan STACK` (what `make plan STACK=...` runs).

Runs the program under Pulumi's mock engine with Pulumi.<STACK>.yaml's config and prints the
resource tree with key properties and the cost estimate. No Pulumi CLI, no credentials, no
cloud calls; a bad config exits 2 with the validation message."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from infra.config import ConfigError
from infra.matrix import REPO_ROOT
from infra.offline import OfflineRun, Registered, run_offline

TITLE = "OFFLINE PLAN (mock engine, no cloud calls)"
STACKS = ("aws-dev", "aws-prod", "alicloud-dev", "alicloud-prod")
KUBERNETES_STACKS = ("aws-k8s", "alicloud-k8s")  # mode: kubernetes (EKS, ACK)
ALL_STACKS = STACKS + KUBERNETES_STACKS
# Input properties worth a glance, by their (camelCase) name at any depth.
KEY_PROPERTIES = {
    "cidrBlock", "availabilityZone", "zoneId", "instanceType", "instanceTypes", "imageId",
    "httpTokens", "encrypted", "systemDiskEncrypted", "volumeSize", "systemDiskSize",
    "marketType", "maxPrice", "spotInstanceType", "instanceInterruptionBehavior", "spotStrategy",
    "spotPriceLimit", "priceLimit", "spotInterruptionBehavior", "autoReleaseTime",
    "instanceChargeType", "minSize", "maxSize", "desiredCapacity", "onDemandBaseCapacity",
    "onDemandPercentageAboveBaseCapacity", "spotAllocationStrategy", "spotMaxPrice",
    "capacityRebalance", "multiAzPolicy", "spotInstanceRemedy", "compensateWithOnDemand",
    "recurrence", "timeZone", "scheduleExpression", "scheduleExpressionTimezone", "startTime",
    "launchTime", "recurrenceValue", "templateName", "path", "healthCheckUri", "port",
    "fromPort", "toPort", "portRange", "cidrBlocks", "cidrIp", "ipProtocol", "internal",
    "addressType", "frontendPort", "backendPort", "limitAmount", "policyArn", "type", "arn",
    "entry",
    "region",
    # mode: kubernetes
    "amiType", "capacityType", "endpointPublicAccess", "publicAccessCidrs", "clusterSpec",
    "version", "chart", "spotPriceLimits", "loadBalancerSourceRanges", "minReplicas",
    "maxReplicas", "terminationGracePeriodSeconds", "maxUnavailable", "averageValue",
    "slbInternetEnabled", "nvidia.com/gpu", "image",
}


def load_stack_config(stack: str, path: Path | None = None) -> dict[str, Any]:
    path = path or REPO_ROOT / f"Pulumi.{stack}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no stack file {path} (stacks: {', '.join(ALL_STACKS)})")
    data = yaml.safe_load(path.read_text()) or {}
    values = data.get("config") or {}
    for key, value in values.items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            raise ConfigError([f"{key} is a Pulumi secret: the offline plan cannot decrypt it; "
                               "set a plain value in a copy of the stack file"])
    return values


def _flatten(value: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            yield from _flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, value


def key_properties(res: Registered) -> list[str]:
    shown = []
    for path, value in _flatten(res.inputs):
        leaf = path.rsplit(".", 1)[-1].split("[")[0]
        if leaf in KEY_PROPERTIES and value not in (None, "", [], {}):
            if isinstance(value, float) and value.is_integer():
                value = int(value)  # the mock engine hands numbers back as floats
            text = json.dumps(value) if not isinstance(value, str) else value
            shown.append(f"{path}={text if len(text) <= 60 else text[:57] + '...'}")
    return shown


def _wrap(items: list[str], width: int = 96) -> list[str]:
    lines, current = [], ""
    for item in items:
        if current and len(current) + 2 + len(item) > width:
            lines.append(current)
            current = item
        else:
            current = f"{current}  {item}" if current else item
    return [*lines, current] if current else lines


def render_tree(run: OfflineRun) -> list[str]:
    children: dict[str, list[Registered]] = {}
    for r in run.resources:
        children.setdefault(r.parent, []).append(r)
    roots = [r for r in run.resources if r.type == "pulumi:pulumi:Stack"]
    lines: list[str] = []

    def walk(node: Registered, indent: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        lines.append(f"{indent}{branch}{node.type}  {node.name}")
        pad = indent + ("" if top else ("   " if last else "│  ")) + "    "
        lines.extend(pad + line for line in _wrap(key_properties(node) if node.custom else []))
        kids = children.get(node.urn, [])
        for i, kid in enumerate(kids):
            walk(kid, indent + ("" if top else ("   " if last else "│  ")), i == len(kids) - 1,
                 False)

    for root in roots:
        walk(root, "", True, True)
    return lines


def cost_rows(costs: dict[str, dict[str, Any]]) -> list[str]:
    head = (f"{'stack':<14} {'type':<22} {'nodes':>5} {'od/spot':>7} {'$/h on-demand':>13} "
            f"{'$/h spot cap':>12} {'$/h typical':>11} {'h/month':>7} {'$/mo 24x7 OD':>12} "
            f"{'$/mo worst':>10} {'$/mo typical':>12}")
    rows = [head, "-" * len(head)]
    for stack, c in costs.items():
        rows.append(
            f"{stack:<14} {c['instance_type']:<22} {c['nodes']:>5} "
            f"{str(c['on_demand_nodes']) + '/' + str(c['spot_nodes']):>7} "
            f"{c['on_demand_usd_per_hour']:>13.3f} {c['spot_cap_usd_per_hour']:>12.3f} "
            f"{c['spot_typical_usd_per_hour']:>11.3f} {c['hours_per_month']:>7.1f} "
            f"{c['monthly_on_demand_24x7_usd']:>12.2f} {c['monthly_worst_case_usd']:>10.2f} "
            f"{c['monthly_typical_usd']:>12.2f}")
    sources = sorted({c["price_source"] for c in costs.values()})
    rows += ["", "worst = schedule applied, spot nodes at their cap; typical = schedule applied, "
             "spot at the family's typical spot/on-demand ratio.", *("prices: " + s for s in sources)]
    return rows


def cluster_rows(clusters: dict[str, dict[str, Any]]) -> list[str]:
    """Kubernetes stacks: the fixed part (control plane, system nodes) and the GPU pool at its
    min and max, beside the steady-size estimate above."""
    head = (f"{'stack':<14} {'$/h control':>11} {'system':>6} {'$/h system':>10} "
            f"{'$/h fixed':>9} {'GPU min-max':>11} {'$/h GPU min':>11} {'$/h GPU max':>11} "
            f"{'GPU h/mo':>8} {'$/mo fixed':>10} {'$/mo at min':>11} {'$/mo at max':>11}")
    rows = [head, "-" * len(head)]
    for stack, c in clusters.items():
        rows.append(
            f"{stack:<14} {c['control_plane_usd_per_hour']:>11.3f} {c['system_nodes']:>6} "
            f"{c['system_usd_per_hour']:>10.3f} {c['fixed_usd_per_hour']:>9.3f} "
            f"{str(c['gpu_nodes_min']) + '-' + str(c['gpu_nodes_max']):>11} "
            f"{c['gpu_min_usd_per_hour']:>11.3f} {c['gpu_max_usd_per_hour']:>11.3f} "
            f"{c['gpu_hours_per_month']:>8.1f} {c['monthly_fixed_usd']:>10.2f} "
            f"{c['monthly_min_usd']:>11.2f} {c['monthly_max_usd']:>11.2f}")
    sources = sorted({c["price_source"] for c in clusters.values()})
    rows += ["", "fixed = control plane + system nodes, 730 h/month (a schedule or the TTL empties "
             "only the GPU pool; the cluster bills until `pulumi destroy`); GPU spot nodes at "
             "their cap.", *("control plane: " + s for s in sources)]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stacks", nargs="*", default=[], metavar="STACK",
                        help=f"stack name(s): {', '.join(ALL_STACKS)}")
    parser.add_argument("--config", type=Path, help="stack file (default: Pulumi.<STACK>.yaml)")
    parser.add_argument("--all", action="store_true", help="every example stack")
    parser.add_argument("--json", action="store_true", help="outputs and resources as JSON")
    args = parser.parse_args(argv)
    stacks = list(ALL_STACKS) if args.all else args.stacks
    if not stacks:
        parser.error("name a stack (or --all)")
    if args.config and len(stacks) != 1:
        parser.error("--config takes exactly one stack")

    costs: dict[str, dict[str, Any]] = {}
    clusters: dict[str, dict[str, Any]] = {}
    for stack in stacks:
        try:
            run = run_offline(stack, load_stack_config(stack, args.config))
        except (ConfigError, FileNotFoundError) as err:
            print(f"{TITLE}: stack {stack}: {err}", file=sys.stderr)
            return 2
        costs[stack] = run.outputs["cost"]
        if run.outputs.get("cluster_cost"):
            clusters[stack] = run.outputs["cluster_cost"]
        if args.json:
            print(json.dumps({"stack": stack, "outputs": run.outputs, "resources": [
                {"type": r.type, "name": r.name, "custom": r.custom, "inputs": r.inputs}
                for r in run.resources]}, default=str, indent=2))
            continue
        print("=" * 100)
        print(f"{TITLE} — stack {stack}: {len(run.custom())} cloud resources in "
              f"{len(run.resources) - len(run.custom())} components/providers")
        print("=" * 100)
        print("\n".join(render_tree(run)))
        print("\noutputs:")
        for key in ("endpoint", "ttl_expiry", "ssh_tunnel", "discovery", "cluster"):
            if run.outputs.get(key) is not None:
                print(f"  {key}: {run.outputs[key]}")
        if run.outputs.get("cluster"):
            print("  kubeconfig: a secret output (`pulumi stack output --show-secrets kubeconfig`)")
            print()
            continue  # mode: kubernetes has pods, not an Ansible inventory
        hosts = run.outputs["inventory"]["all"]["children"]["gpu_nodes"].get("hosts") or {}
        print(f"  inventory: {len(hosts)} host(s) in group gpu_nodes"
              + ("" if hosts else " (group mode: nodes are found by tag, see discovery)"))
        print()
    if not args.json:
        print(f"COST ESTIMATE ({TITLE})")
        print("\n".join(cost_rows(costs)))
        if clusters:
            print(f"\nCLUSTER COST (mode: kubernetes; {TITLE})")
            print("\n".join(cluster_rows(clusters)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
