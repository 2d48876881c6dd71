"""Offline plan: `python -m infra.plan STACK` (what `make plan STACK=...` runs).

Runs the program under Pulumi's mock engine with Pulumi.<STACK>.yaml's config and prints the
resource tree with key properties, the self-healing each node gets, the whole bill line by line
and what the TTL leaves billing, and warns about a node distro past its standard support. No
Pulumi CLI and nothing created; prices (`--prices`): the region's own from the cloud's price
API when this machine holds credentials (short timeouts, cached a day), else the reference
table, and the output says which with its date. A bad config exits 2 with the validation
message."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra import config as stack_config
from infra import healing, pricing
from infra.config import BOOT_MODES, ConfigError
from infra.deploy import capacity
from infra.offline import OfflineRun, Registered, run_offline
from infra.schedule import deploy_time

# The stacks and their reading live in infra.stacks; imported here by name for the tests and
# the scripts that import them from the offline plan.
from infra.stacks import ALL_STACKS as ALL_STACKS
from infra.stacks import KUBERNETES_STACKS as KUBERNETES_STACKS
from infra.stacks import STACKS as STACKS
from infra.stacks import load_stack_config as load_stack_config

TITLE = "OFFLINE PLAN (mock engine: nothing is created)"
# Input properties worth a glance, by their (camelCase) name at any depth.
KEY_PROPERTIES = {
    "cidrBlock",
    "availabilityZone",
    "zoneId",
    "instanceType",
    "instanceTypes",
    "imageId",
    "httpTokens",
    "encrypted",
    "systemDiskEncrypted",
    "volumeSize",
    "systemDiskSize",
    "marketType",
    "maxPrice",
    "spotInstanceType",
    "instanceInterruptionBehavior",
    "spotStrategy",
    "spotPriceLimit",
    "priceLimit",
    "spotInterruptionBehavior",
    "autoReleaseTime",
    "maintenanceAction",
    "instanceChargeType",
    "minSize",
    "maxSize",
    "desiredCapacity",
    "onDemandBaseCapacity",
    "onDemandPercentageAboveBaseCapacity",
    "spotAllocationStrategy",
    "spotMaxPrice",
    "capacityRebalance",
    "multiAzPolicy",
    "spotInstanceRemedy",
    "compensateWithOnDemand",
    "recurrence",
    "timeZone",
    "scheduleExpression",
    "scheduleExpressionTimezone",
    "startTime",
    "launchTime",
    "recurrenceValue",
    "templateName",
    "path",
    "healthCheckUri",
    "port",
    "fromPort",
    "toPort",
    "portRange",
    "cidrBlocks",
    "cidrIp",
    "ipProtocol",
    "internal",
    "addressType",
    "frontendPort",
    "backendPort",
    "limitAmount",
    "policyArn",
    "metricName",
    "alarmActions",
    "type",
    "arn",
    "entry",
    "region",
    # bootstrap, bundle, hooks and scaling
    "key",
    "bucketPrefix",
    "sseAlgorithm",
    "status",
    "objectOwnership",
    "blockPublicAcls",
    "blockPublicAccess",
    "acl",
    "tlsVersions",
    "healthCheckGracePeriod",
    "defaultInstanceWarmup",
    "healthCheckType",
    "healthCheckTypes",
    "protectFromScaleIn",
    "strategy",
    "version",
    "minHealthyPercentage",
    "autoRollback",
    "poolState",
    "reuseOnScaleIn",
    "maxGroupPreparedCapacity",
    "scalingConfigurationName",
    "parentImage",
    # monitoring host and its private subnet
    "privateIp",
    "associatePublicIpAddress",
    "mapPublicIpOnLaunch",
    "internetMaxBandwidthOut",
    "cidrIpv4",
    "cidrIpv6",
    "natType",
    "sourceVswitchId",
    # mode: kubernetes
    "amiType",
    "capacityType",
    "endpointPublicAccess",
    "publicAccessCidrs",
    "clusterSpec",
    "chart",
    "spotPriceLimits",
    "loadBalancerSourceRanges",
    "minReplicas",
    "maxReplicas",
    "terminationGracePeriodSeconds",
    "maxUnavailable",
    "averageValue",
    "slbInternetEnabled",
    "nvidia.com/gpu",
    "image",
}


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
            walk(
                kid, indent + ("" if top else ("   " if last else "│  ")), i == len(kids) - 1, False
            )

    for root in roots:
        walk(root, "", True, True)
    return lines


@dataclass(frozen=True)
class Column:
    """One column of a fixed-width table: its heading and width, the row's value it shows (a key
    of the row, or a function of it), that value's format, and its side (numbers right)."""

    head: str
    width: int
    value: str | Callable[[dict[str, Any]], Any]
    spec: str = ""
    left: bool = False

    def render(self, value: Any, spec: str = "") -> str:
        return format(value, f"{'<' if self.left else '>'}{self.width}{spec}")

    def cell(self, row: dict[str, Any]) -> str:
        return self.render(
            row[self.value] if isinstance(self.value, str) else self.value(row), self.spec
        )


def table(columns: Sequence[Column], rows: dict[str, dict[str, Any]]) -> list[str]:
    """The heading, a rule as long as it, and one line per stack (`rows`: stack -> its row; the
    row's "stack" is the stack's name)."""
    head = " ".join(c.render(c.head) for c in columns)
    lines = [head, "-" * len(head)]
    for stack, row in rows.items():
        cells = {"stack": stack, **row}
        lines.append(" ".join(c.cell(cells) for c in columns))
    return lines


COST_COLUMNS = (
    Column("stack", 14, "stack", left=True),
    Column("type", 22, "instance_type", left=True),
    Column("nodes", 5, "nodes"),
    Column("od/spot", 7, lambda c: f"{c['on_demand_nodes']}/{c['spot_nodes']}"),
    Column("cur", 3, "currency", left=True),
    Column("/h on-demand", 12, "on_demand_per_hour", ".3f"),
    Column("/h spot cap", 11, "spot_cap_per_hour", ".3f"),
    Column("/h typical", 10, "spot_typical_per_hour", ".3f"),
    Column("h/month", 7, "hours_per_month", ".1f"),
    Column("/mo 24x7 OD", 11, "monthly_on_demand_24x7", ".2f"),
    Column("/mo worst", 10, "monthly_worst_case", ".2f"),
    Column("/mo typical", 11, "monthly_typical", ".2f"),
)
BOUNDS_COLUMNS = (
    Column("stack", 14, "stack", left=True),
    Column("min", 4, "min_nodes"),
    Column("max", 4, "max_nodes"),
    Column("/h cap @min", 11, "spot_cap_per_hour_at_min", ".3f"),
    Column("/h cap @max", 11, "spot_cap_per_hour_at_max", ".3f"),
    Column("/mo worst @min", 14, "monthly_worst_at_min", ".2f"),
    Column("/mo worst @max", 14, "monthly_worst_at_max", ".2f"),
    Column("/mo warm pool", 13, "warm_pool_per_month", ".2f"),
    Column("monitoring", 12, lambda c: c.get("monitoring_instance_type") or "-", left=True),
    Column("/mo monitoring", 14, lambda c: c.get("monitoring_per_month", 0.0), ".2f"),
)
CLUSTER_COLUMNS = (
    Column("stack", 14, "stack", left=True),
    Column("cur", 3, "currency", left=True),
    Column("/h control", 10, "control_plane_per_hour", ".3f"),
    Column("system", 6, "system_nodes"),
    Column("/h system", 9, "system_per_hour", ".3f"),
    Column("/h fixed", 8, "fixed_per_hour", ".3f"),
    Column("GPU min-max", 11, lambda c: f"{c['gpu_nodes_min']}-{c['gpu_nodes_max']}"),
    Column("/h GPU min", 10, "gpu_min_per_hour", ".3f"),
    Column("/h GPU max", 10, "gpu_max_per_hour", ".3f"),
    Column("GPU h/mo", 8, "gpu_hours_per_month", ".1f"),
    Column("/mo fixed", 9, "monthly_fixed", ".2f"),
    Column("/mo at min", 10, "monthly_min", ".2f"),
    Column("/mo at max", 10, "monthly_max", ".2f"),
)


def cost_rows(costs: dict[str, dict[str, Any]]) -> list[str]:
    rows = table(COST_COLUMNS, costs)
    rows += [
        "",
        "the whole bill (lines below; traffic not priced): worst = schedule applied, spot nodes "
        "at their cap; typical = schedule applied, spot at the region's recent spot price where "
        "it was read, else the family's long-run spot/on-demand ratio.",
        *(f"prices ({stack}): {c['prices']['source']}" for stack, c in costs.items()),
    ]
    return rows


def bill_lines(stack: str, cost: dict[str, Any]) -> list[str]:
    """One stack's whole bill, line by line, and what its TTL leaves billing."""
    cur = cost["currency"]
    width = max(len(line["item"]) for line in cost["lines"])
    out = [f"{stack}: the whole bill in {cur} (per hour while it runs x hours a month)"]
    for line in cost["lines"]:
        flag = " NOT PRICED" if line["unpriced"] else ""
        ttl = "  (stays after the TTL)" if line["after_ttl"] and cost["after_ttl"] else ""
        out.append(
            f"  {line['item']:<{width}}  {line['per_hour']:>9.4f}/h x {line['hours_per_month']:>5.1f} h"
            f" = {line['per_month']:>9.2f}/mo  {line['detail']}{flag}{ttl}"
        )
    out.append(f"  {'total':<{width}}  {cost['monthly_worst_case']:>27.2f}/mo (worst case)")
    out += [f"  {text}" for text in ttl_lines(cost)]
    if cost["unpriced"]:
        out.append(
            f"  not in the total: {', '.join(cost['unpriced'])} (no {cur} price: the reference "
            "table is in USD)"
        )
    return out


def ttl_lines(cost: dict[str, Any]) -> list[str]:
    """What the TTL leaves billing and what that costs a day (nothing without a TTL)."""
    if not cost.get("after_ttl"):
        return []
    return [
        f"after the TTL: {cost['after_ttl_per_day']:.2f} {cost['currency']}/day until "
        f"`torchfleet down` for " + "; ".join(cost["after_ttl"])
    ]


def scaling_lines(run: OfflineRun) -> list[str]:
    """The hooks and load-based policies a group stack registers, one line each, grouped by
    kind (registration order is asynchronous; the plan must not be)."""
    lines: list[str] = []
    for r in run.of_type("aws:autoscaling/group:Group"):
        i = r.inputs
        refresh = i.get("instanceRefresh", {})
        warm = i.get("warmPool")
        lines.append(
            f"group {i['name']}: {int(i['minSize'])}..{int(i['maxSize'])} nodes, "
            f"health {i['healthCheckType']} (grace {int(i['healthCheckGracePeriod'])} s), "
            f"warm-up {int(i['defaultInstanceWarmup'])} s, instance refresh "
            f"{refresh.get('strategy')} on a new launch template version"
            + (
                f", warm pool {warm['poolState']} (min {int(warm.get('minSize', 0))})"
                if warm
                else ""
            )
        )
    for r in run.of_type("aws:autoscaling/lifecycleHook:LifecycleHook"):
        i = r.inputs
        lines.append(
            f"hook {i['name']} ({i['autoscalingGroupName']}): {i['lifecycleTransition']}, "
            f"{i['defaultResult']} after {int(i['heartbeatTimeout'])} s without a heartbeat"
        )
    # a step policy and the alarm that drives it share their name (infra.aws.fallback)
    alarms = {
        a.inputs["name"]: a.inputs for a in run.of_type("aws:cloudwatch/metricAlarm:MetricAlarm")
    }
    for r in run.of_type("aws:autoscaling/policy:Policy"):
        if r.inputs["policyType"] == "StepScaling":
            alarm = alarms.get(r.inputs["name"], {})
            lines.append(
                f"policy {r.inputs['name']}: step scaling of {r.inputs['autoscalingGroupName']}"
                f" on its alarm ({alarm.get('alarmDescription', 'none')})"
            )
            continue
        tt = r.inputs["targetTrackingConfiguration"]
        metric = tt.get("predefinedMetricSpecification", {}).get(
            "predefinedMetricType"
        ) or "{namespace}/{metricName} ({statistic})".format(**tt["customizedMetricSpecification"])
        lines.append(
            f"policy {r.inputs['name']}: target tracking {metric} = {tt['targetValue']:g}"
            + (" (scale-out only)" if tt.get("disableScaleIn") else "")
        )
    for r in run.of_type("alicloud:ess/scalingGroup:ScalingGroup"):
        i = r.inputs
        lines.append(
            f"group {i['scalingGroupName']}: {int(i['minSize'])}..{int(i['maxSize'])} "
            f"nodes, health {'+'.join(i.get('healthCheckTypes', ['ECS']))}, removal "
            f"{', '.join(i['removalPolicies'])}"
        )
    for r in run.of_type("alicloud:ess/lifecycleHook:LifecycleHook"):
        i = r.inputs
        lines.append(
            f"hook {i['name']}: {i['lifecycleTransition']}, {i['defaultResult']} after "
            f"{int(i['heartbeatTimeout'])} s without a heartbeat"
        )
    rules = {f"{r.name}-id": r for r in run.of_type("alicloud:ess/scalingRule:ScalingRule")}
    for r in run.of_type("alicloud:ess/alarm:Alarm"):
        i = r.inputs
        conds = i.get("expressions") or [
            {
                "metricName": i["metricName"],
                "comparisonOperator": i["comparisonOperator"],
                "threshold": i["threshold"],
                "period": i["period"],
            }
        ]
        when = f" {i.get('expressionsLogicOperator', '')} ".join(
            f"{c['metricName']} {c['comparisonOperator']} {c['threshold']}" for c in conds
        )
        steps = [
            f"{int(a['scalingAdjustment']):+d}"
            for rid, rule in rules.items()
            if any(rid in action for action in i["alarmActions"])
            for a in rule.inputs["stepAdjustments"]
        ]
        lines.append(
            f"alarm {i['name']}: {when} (Average, {int(i['evaluationCount'])} x "
            f"{int(conds[0]['period'])} s) -> step rule {'/'.join(steps)} nodes"
        )
    for r in run.custom():
        if r.inputs.get("kind") == "HorizontalPodAutoscaler":
            spec = r.inputs["spec"]
            targets = ", ".join(
                f"{m['pods']['metric']['name']} = {m['pods']['target']['averageValue']}"
                for m in spec["metrics"]
            )
            lines.append(
                f"hpa {r.inputs['metadata']['name']}: {int(spec['minReplicas'])}.."
                f"{int(spec['maxReplicas'])} pods, average per pod {targets}"
            )
    order = ("group", "hook", "policy", "alarm", "hpa")
    return sorted(lines, key=lambda line: (order.index(line.split(" ", 1)[0]), line))


def monitoring_lines(run: OfflineRun) -> list[str]:
    """The monitoring host and what its security groups admit, from what was registered."""
    hosts = [
        r
        for r in run.of_type("aws:ec2/instance:Instance")
        + run.of_type("alicloud:ecs/instance:Instance")
        if (r.inputs.get("tags") or {}).get("torchfleet-role") == "monitoring"
    ]
    lines = []
    for r in hosts:
        i = r.inputs
        disk = i.get("rootBlockDevice", {}).get("volumeSize") or i.get("systemDiskSize")
        assert disk is not None, f"{r.name} has no root disk size"  # both fleets set one
        lines.append(
            f"host {r.name}: {i['instanceType']} at {i['privateIp']} (private, no "
            f"public address), {int(disk)} GiB encrypted disk, metadata tokens "
            f"{i.get('metadataOptions', {}).get('httpTokens') or i.get('httpTokens')}"
        )
    if not hosts:
        return lines
    groups = {
        f"{sg.name}-id": sg.name
        for sg in run.of_type("aws:ec2/securityGroup:SecurityGroup")
        + run.of_type("alicloud:ecs/securityGroup:SecurityGroup")
    }
    for sg in run.of_type("aws:ec2/securityGroup:SecurityGroup"):
        for rule in sg.inputs.get("ingress", []):
            sources = [groups.get(g, g) for g in rule.get("securityGroups", [])]
            if any(src.endswith("-monitoring") for src in sources):
                lines.append(
                    f"{sg.name} admits tcp {int(rule['fromPort'])} from {', '.join(sources)}"
                )
    for rule in run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"):
        i = rule.inputs
        source = (
            groups.get(i.get("referencedSecurityGroupId", ""), "")
            or i.get("cidrIpv4")
            or i.get("cidrIpv6")
        )
        lines.append(
            f"{groups.get(i['securityGroupId'])} admits {i['ipProtocol']} "
            f"{int(i['fromPort'])} from {source}"
        )
    for rule in run.of_type("alicloud:ecs/securityGroupRule:SecurityGroupRule"):
        i = rule.inputs
        source = groups.get(i.get("sourceSecurityGroupId", ""))
        target = groups.get(i["securityGroupId"], "")
        if i["type"] == "ingress" and (
            target.endswith("-monitoring") or (source or "").endswith("-monitoring")
        ):
            lines.append(
                f"{target} admits {i['ipProtocol']} {i['portRange'].split('/')[0]} "
                f"from {source or i.get('cidrIp') or i.get('ipv6CidrIp')}"
            )
    return [lines[0], *sorted(lines[1:]), *journal_lines(run)]


def journal_lines(run: OfflineRun) -> list[str]:
    """The journal's HTTPS: the receiver's certificate and each end's secret, as registered."""
    requests = {r.name: r.inputs for r in run.of_type("tls:index/certRequest:CertRequest")}
    receiver = requests.get("fleet-journal-receiver")
    if receiver is None:
        return []
    secrets = {
        r.name.rsplit("-", 1)[1]: r.inputs.get("name") or r.inputs.get("secretName")
        for r in run.of_type("aws:secretsmanager/secret:Secret")
        + run.of_type("alicloud:kms/secret:Secret")
        if "-journal-" in r.name
    }
    return [
        "journal over HTTPS: the receiver's certificate for "
        + ", ".join([*receiver.get("ipAddresses", []), *receiver.get("dnsNames", [])])
        + f" (secret {secrets['receiver']}, read by the monitoring host alone) and the nodes' "
        + f"client certificate (secret {secrets['node']}, read by the nodes alone), both signed "
        + "by the stack's journal CA"
    ]


def healing_lines(run: OfflineRun, cfg: stack_config.StackConfig) -> list[str]:
    """What heals each node, from what was registered: the alarms' EC2 actions (AWS) or the
    instances' maintenance action (Alibaba), with infra.healing's reason; a group's nodes are
    replaced by their group."""
    actions: dict[str, list[str]] = {}
    for alarm in run.of_type("aws:cloudwatch/metricAlarm:MetricAlarm"):
        target = (alarm.inputs.get("dimensions") or {}).get("InstanceId")
        for arn in alarm.inputs.get("alarmActions") or []:
            if ":automate:" in arn and target:
                actions.setdefault(target, []).append(arn.rsplit(":", 1)[1])
    lines = []
    for typ in ("aws:ec2/instance:Instance", "alicloud:ecs/instance:Instance"):
        for inst in run.of_type(typ):
            tags = inst.inputs.get("tags") or {}
            monitoring = tags.get("torchfleet-role") == "monitoring"
            itype = (
                cfg.monitoring.instance_type if monitoring and cfg.monitoring else cfg.instance_type
            )
            spot = cfg.market == "spot" and not monitoring
            got = actions.get(f"{inst.name}-id", [])
            if inst.inputs.get("maintenanceAction"):
                got.append(inst.inputs["maintenanceAction"])
            why = healing.for_instance(cfg.cloud, itype, spot).why
            node = tags.get("Name") or inst.inputs.get("instanceName") or inst.name
            done = " + ".join(sorted(got, reverse=True)) or "NOTHING"
            lines.append(f"{node} ({itype.name}{', spot' if spot else ''}): {done} - {why}")
    if cfg.mode == "group":
        lines.append(f"group nodes: {healing.for_group(cfg.cloud).describe()}")
    return sorted(lines)


def estimate_lines() -> list[str]:
    from infra.lifecycle import estimates

    found = estimates()
    width = max(map(len, found))
    return [f"{path:<{width}} {e.summary()}" for path, e in found.items()]


def bounds_rows(costs: dict[str, dict[str, Any]]) -> list[str]:
    return table(BOUNDS_COLUMNS, costs)


def cluster_rows(clusters: dict[str, dict[str, Any]]) -> list[str]:
    """Kubernetes stacks: the fixed part (control plane, system nodes) and the GPU pool at its
    min and max, beside the steady-size estimate above."""
    rows = table(CLUSTER_COLUMNS, clusters)
    rows += [
        "",
        "fixed = control plane + system nodes, 730 h/month (a schedule or the TTL empties "
        "only the GPU pool; the cluster bills until `pulumi destroy`); GPU spot nodes at "
        "their cap.",
    ]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.plan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "stacks",
        nargs="*",
        default=[],
        metavar="STACK",
        help=f"stack name(s): {', '.join(ALL_STACKS)}",
    )
    parser.add_argument("--config", type=Path, help="stack file (default: Pulumi.<STACK>.yaml)")
    parser.add_argument("--all", action="store_true", help="every example stack")
    parser.add_argument("--json", action="store_true", help="outputs and resources as JSON")
    parser.add_argument(
        "--boot",
        choices=BOOT_MODES,
        help="plan with torchfleet:boot set to this (what `make bake` shows)",
    )
    parser.add_argument(
        "--prices",
        choices=pricing.MODES,
        default=os.environ.get(pricing.MODE_ENV) or "auto",
        help="auto: the region's own prices when this machine holds the cloud's credentials "
        "(cached a day), else the reference table; offline: the reference table "
        f"(default: ${pricing.MODE_ENV} or auto)",
    )
    args = parser.parse_args(argv)
    stacks = list(ALL_STACKS) if args.all else args.stacks
    if not stacks:
        parser.error("name a stack (or --all)")
    if args.config and len(stacks) != 1:
        parser.error("--config takes exactly one stack")

    costs: dict[str, dict[str, Any]] = {}
    clusters: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    for stack in stacks:
        try:
            values = load_stack_config(stack, args.config)
            if args.boot:
                values = {**values, "torchfleet:boot": args.boot}
            cfg = stack_config.load(stack_config.raw_from_pulumi_config(values), stack)
            run = run_offline(stack, values, prices=args.prices)
        except (ConfigError, FileNotFoundError) as err:
            print(f"{TITLE}: stack {stack}: {err}", file=sys.stderr)
            return 2
        warning = stack_config.distro_warning(cfg, deploy_time().date().isoformat())
        if warning:
            warnings.append(f"{stack}: {warning}")
        costs[stack] = run.outputs["cost"]
        if run.outputs.get("cluster_cost"):
            clusters[stack] = run.outputs["cluster_cost"]
        if args.json:
            print(
                json.dumps(
                    {
                        "stack": stack,
                        "outputs": run.outputs,
                        "resources": [
                            {"type": r.type, "name": r.name, "custom": r.custom, "inputs": r.inputs}
                            for r in run.resources
                        ],
                    },
                    default=str,
                    indent=2,
                )
            )
            continue
        print("=" * 100)
        print(
            f"{TITLE} — stack {stack}: {len(run.custom())} cloud resources in "
            f"{len(run.resources) - len(run.custom())} components/providers"
        )
        print("=" * 100)
        if warning:
            print(f"WARNING: {warning}")
        print("\n".join(render_tree(run)))
        print("\noutputs:")
        for key in (
            "endpoint",
            "ttl_expiry",
            "ssh_tunnel",
            "discovery",
            "cluster",
            "bundle_url",
            "bundle_version",
        ):
            if run.outputs.get(key) is not None:
                print(f"  {key}: {run.outputs[key]}")
        if run.outputs.get("cluster"):
            print("  kubeconfig: a secret output (`pulumi stack output --show-secrets kubeconfig`)")
            print("\nscaling (pods on load; the cluster autoscaler adds nodes for them):")
            print("\n".join("  " + line for line in scaling_lines(run)))
            print()
            continue  # mode: kubernetes has pods, not an Ansible inventory
        hosts = run.outputs["inventory"]["all"]["children"]["gpu_nodes"].get("hosts") or {}
        watcher = run.outputs["inventory"]["all"]["children"].get("monitoring", {}).get("hosts")
        print(
            f"  inventory: {len(hosts)} host(s) in group gpu_nodes"
            + ("" if hosts else " (group mode: nodes are found by tag, see discovery)")
            + (f"; {', '.join(watcher)} in group monitoring" if watcher else "")
        )
        monitoring = monitoring_lines(run)
        if monitoring:
            print("\nmonitoring (Prometheus, Alertmanager, the nodes' journals; roles/monitoring):")
            print("\n".join("  " + line for line in monitoring))
        heals = healing_lines(run, cfg)
        if heals:
            print(
                "\nself-healing (infra/healing.py: the strongest each node's type and purchase allow):"
            )
            print("\n".join("  " + line for line in heals))
        short = capacity.describe(cfg)
        if short:
            print(f"\nwhen spot cannot be had: {short}")
        scaling = scaling_lines(run)
        if scaling:
            print("\nscaling (join when ready, leave when drained, scale on load):")
            print("\n".join("  " + line for line in scaling))
        print()
    if not args.json:
        print(f"COST ESTIMATE ({TITLE})")
        print("\n".join(cost_rows(costs)))
        print(
            "\nat the scaling bounds (the GPU nodes at min and max, spot at its cap, schedule "
            "applied; every total includes the rest of the bill below)"
        )
        print("\n".join(bounds_rows(costs)))
        for stack, cost in costs.items():
            print()
            print("\n".join(bill_lines(stack, cost)))
        print(
            "\nlaunch -> ready per boot path (infra/lifecycle.py: measured parts only, the "
            "rest named)"
        )
        print("\n".join("  " + line for line in estimate_lines()))
        if clusters:
            print(f"\nCLUSTER COST (mode: kubernetes; {TITLE})")
            print("\n".join(cluster_rows(clusters)))
        if warnings:
            print("\nWARNINGS")
            print("\n".join("  " + w for w in warnings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
