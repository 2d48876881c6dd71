"""A stack's measured spend read from the cloud's bill, and the exporter that publishes it: the
one place both `torchfleet cost` (infra.spend, on the controller) and the monitoring host read
the bill. roles/monitoring ships this very file (files/torchfleet_spend.py is a link to it) and
runs it as the torchfleet-spend service, so it imports nothing from infra: standard library,
Python 3.8+, and the cloud SDK it is asked for (boto3; Alibaba's BSS SDK), imported where used.

- AWS: Cost Explorer `GetCostAndUsage` (daily, UnblendedCost) filtered by the `stack` tag every
  resource carries (infra.tags). Cost Explorer filters only by an active cost-allocation tag
  (`up` activates it: infra.spend.activate_stack_tag), and its data lag up to a day.
- Alibaba: BSS `DescribeInstanceBill` (alibabacloud-bssopenapi20171214), one call per day at
  daily granularity, paged; BSS has no tag filter there, so the lines whose instance tags carry
  `stack:<stack>` are summed. Its currency is the account's (CNY on the China site).

The exporter (`python3 torchfleet_spend.py --stack S --cloud aws|alicloud ...`) serves
Prometheus' text format on its own /metrics (loopback by default): the last `--days` whole UTC
days, re-read every `--refresh` seconds (a Cost Explorer request is billed per call, so it reads
the bill a few times a day, never per scrape). A failed read keeps the last figures and sets
torchfleet_spend_up to 0."""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

STACK_TAG = "stack"  # infra.tags.base_tags: on every taggable resource
CLOUDS = ("aws", "alicloud")
# Cost Explorer's one endpoint, and no retries: a billing read never holds anything up.
CE_REGION = "us-east-1"
AWS_TIMEOUTS = {"connect_timeout": 3, "read_timeout": 8, "retries": {"max_attempts": 1}}


class BillError(RuntimeError):
    """The bill answered something that cannot be summed (an error, several currencies)."""


@dataclass
class Spend:
    start: date
    end: date
    amount: float
    currency: str
    per_day: list[tuple[str, float]] = field(default_factory=list)
    estimated: bool = False  # Cost Explorer marks figures still being finalised


def window(days: int, today: date) -> tuple[date, date]:
    """[start, end): whole UTC days up to, not including, today (its costs are not in yet)."""
    return today - timedelta(days=days), today


def ce_client() -> Any:
    import boto3
    import botocore.config

    return boto3.client("ce", region_name=CE_REGION, config=botocore.config.Config(**AWS_TIMEOUTS))


def _one_currency(currencies: set[str], source: str) -> str:
    if len(currencies) > 1:
        raise BillError(f"{source} answered in several currencies: {sorted(currencies)}")
    return currencies.pop() if currencies else ""


def aws_spend(stack: str, start: date, end: date, client: Any) -> Spend:
    """The stack's spend on [start, end) from Cost Explorer."""
    kwargs: dict[str, Any] = {
        "TimePeriod": {"Start": start.isoformat(), "End": end.isoformat()},
        "Granularity": "DAILY",
        "Metrics": ["UnblendedCost"],
        "Filter": {"Tags": {"Key": STACK_TAG, "Values": [stack], "MatchOptions": ["EQUALS"]}},
    }
    days: list[tuple[str, float]] = []
    currencies: set[str] = set()
    estimated = False
    while True:
        page = client.get_cost_and_usage(**kwargs)
        for result in page.get("ResultsByTime", []):
            cost = result.get("Total", {}).get("UnblendedCost")
            if cost:
                days.append((result["TimePeriod"]["Start"], float(cost["Amount"])))
                currencies.add(cost["Unit"])
            estimated = estimated or bool(result.get("Estimated"))
        token = page.get("NextPageToken")
        if not token:
            break
        kwargs["NextPageToken"] = token
    currency = _one_currency(currencies, "Cost Explorer") or "USD"
    return Spend(start, end, round(sum(a for _, a in days), 2), currency, days, estimated)


def tagged(tags: str, stack: str) -> bool:
    """BSS's Tag field: `key:stack value:aws-dev; key:env value:dev` (the console's format)."""
    pairs = re.findall(r"key:(\S+) value:([^;]*)", tags or "")
    return (STACK_TAG, stack) in {(k.strip(), v.strip()) for k, v in pairs}


def alicloud_spend(stack: str, start: date, end: date, client: Any) -> Spend:
    """The stack's spend on [start, end) from BSS's daily instance bill."""
    from alibabacloud_bssopenapi20171214 import models
    from darabonba.runtime import RuntimeOptions

    runtime = RuntimeOptions(
        autoretry=False, max_attempts=1, connect_timeout=3000, read_timeout=10000
    )
    days: list[tuple[str, float]] = []
    currencies: set[str] = set()
    day = start
    while day < end:
        total, token = 0.0, None
        while True:
            request = models.DescribeInstanceBillRequest(
                billing_cycle=day.strftime("%Y-%m"),
                billing_date=day.isoformat(),
                granularity="DAILY",
                is_hide_zero_charge=True,
                max_results=300,
                next_token=token,
            )
            body = client.describe_instance_bill_with_options(request, runtime).body.to_map()
            if not body.get("Success", True):
                raise BillError(
                    f"BSS DescribeInstanceBill {day}: {body.get('Code')} {body.get('Message')}"
                )
            data = body.get("Data") or {}
            for item in data.get("Items") or []:
                if tagged(item.get("Tag", ""), stack):
                    total += float(item.get("PretaxAmount") or 0)
                    currencies.add(str(item.get("Currency") or "CNY"))
            token = data.get("NextToken")
            if not token:
                break
        days.append((day.isoformat(), round(total, 2)))
        day += timedelta(days=1)
    currency = _one_currency(currencies, "BSS")
    return Spend(start, end, round(sum(a for _, a in days), 2), currency, days)


def bss_client(config: Any) -> Any:
    from alibabacloud_bssopenapi20171214.client import Client

    return Client(config)


def host_bss_config(region: str, endpoint: str = "") -> Any:
    """The monitoring host's BSS configuration: the default credential chain (on ECS, the
    instance's RAM role named by ALIBABA_CLOUD_ECS_METADATA, which the service sets)."""
    from urllib.parse import urlsplit

    from alibabacloud_credentials.client import Client as Credentials
    from alibabacloud_tea_openapi.models import Config

    config = Config(
        credential=Credentials(), region_id=region, connect_timeout=3000, read_timeout=10000
    )
    if endpoint:
        url = urlsplit(endpoint)
        config.endpoint, config.protocol = url.netloc, url.scheme
    return config


# --- the exporter -------------------------------------------------------------------------------


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(
    stack: str, cloud: str, spend: Spend | None, up: bool, read_at: float, days: int
) -> str:
    """Prometheus' text format: the spend of each whole UTC day of the window, the last whole
    day (one steady series a dashboard can plot beside the estimate), the window's total, and
    whether the last read succeeded."""
    base = f'stack="{_label(stack)}",cloud="{_label(cloud)}"'
    out = [
        "# HELP torchfleet_spend_up Whether the last read of the bill succeeded.",
        "# TYPE torchfleet_spend_up gauge",
        f"torchfleet_spend_up{{{base}}} {1 if up else 0}",
        "# HELP torchfleet_spend_read_timestamp_seconds When the bill was last read successfully.",
        "# TYPE torchfleet_spend_read_timestamp_seconds gauge",
        f"torchfleet_spend_read_timestamp_seconds{{{base}}} {read_at:.0f}",
    ]
    if spend is None:
        return "\n".join(out) + "\n"
    money = f'{base},currency="{_label(spend.currency)}"'
    out += [
        "# HELP torchfleet_spend_day Measured spend of the stack on one whole UTC day, by its "
        "stack tag, in the account's currency.",
        "# TYPE torchfleet_spend_day gauge",
    ]
    out += [f'torchfleet_spend_day{{{money},day="{d}"}} {a}' for d, a in spend.per_day]
    last = spend.per_day[-1][1] if spend.per_day else 0.0
    out += [
        "# HELP torchfleet_spend_last_day Measured spend of the stack on the last whole UTC day.",
        "# TYPE torchfleet_spend_last_day gauge",
        f"torchfleet_spend_last_day{{{money}}} {last}",
        "# HELP torchfleet_spend_window Measured spend of the stack over the last whole days.",
        "# TYPE torchfleet_spend_window gauge",
        f'torchfleet_spend_window{{{money},days="{days}"}} {spend.amount}',
        "# HELP torchfleet_spend_estimated Whether the bill still marks figures as estimated.",
        "# TYPE torchfleet_spend_estimated gauge",
        f"torchfleet_spend_estimated{{{money}}} {1 if spend.estimated else 0}",
    ]
    return "\n".join(out) + "\n"


class Exporter:
    """Reads the bill every `refresh` seconds in a thread; /metrics answers from memory."""

    def __init__(
        self,
        stack: str,
        cloud: str,
        days: int,
        read: Callable[[date, date], Spend],
        today: Callable[[], date] = lambda: datetime.now(timezone.utc).date(),
    ):
        self.stack, self.cloud, self.days, self._read, self._today = stack, cloud, days, read, today
        self.spend: Spend | None = None
        self.up, self.read_at = False, 0.0
        self.lock = threading.Lock()

    def refresh(self) -> None:
        start, end = window(self.days, self._today())
        try:
            spend = self._read(start, end)
        except Exception as err:  # the SDKs' errors: access denied, throttled, the network
            print(f"torchfleet-spend: reading the bill failed: {err}", file=sys.stderr, flush=True)
            with self.lock:
                self.up = False
            return
        with self.lock:
            self.spend, self.up, self.read_at = spend, True, time.time()

    def metrics(self) -> str:
        with self.lock:
            return exposition(self.stack, self.cloud, self.spend, self.up, self.read_at, self.days)

    def server(self, host: str, port: int) -> ThreadingHTTPServer:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics")
                    return
                body = exporter.metrics().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # scrapes are not worth a journal line
                pass

        return ThreadingHTTPServer((host, port), Handler)


def reader(cloud: str, stack: str, region: str, endpoint: str) -> Callable[[date, date], Spend]:
    if cloud == "aws":
        client = ce_client()
        return lambda start, end: aws_spend(stack, start, end, client)
    bss = bss_client(host_bss_config(region, endpoint))
    return lambda start, end: alicloud_spend(stack, start, end, bss)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export a torchfleet stack's measured spend.")
    parser.add_argument("--stack", required=True)
    parser.add_argument("--cloud", required=True, choices=CLOUDS)
    parser.add_argument("--region", default="", help="Alibaba: the BSS client's region")
    parser.add_argument("--endpoint", default="", help="BSS endpoint URL (default: the SDK's)")
    parser.add_argument("--listen", default="127.0.0.1:9465", help="host:port of /metrics")
    parser.add_argument("--days", type=int, default=7, help="whole UTC days exported (1-31)")
    parser.add_argument("--refresh", type=int, default=21600, help="seconds between reads")
    args = parser.parse_args(argv)
    if not 1 <= args.days <= 31:
        parser.error(f"--days = {args.days} is invalid; allowed: 1 to 31")
    if args.refresh < 600:
        parser.error(f"--refresh = {args.refresh} is invalid; allowed: 600 seconds or more")
    host, _, port = args.listen.rpartition(":")
    exporter = Exporter(
        args.stack,
        args.cloud,
        args.days,
        reader(args.cloud, args.stack, args.region, args.endpoint),
    )
    server = exporter.server(host, int(port))

    def loop() -> None:
        while True:
            exporter.refresh()
            time.sleep(args.refresh)

    threading.Thread(target=loop, daemon=True).start()
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
