"""The monitoring host's spend exporter (infra/billing.py, shipped by roles/monitoring as
files/torchfleet_spend.py): it reads the bill with the same code as `torchfleet cost` and serves
it on a real loopback /metrics. AWS against moto's Cost Explorer (answers queued through moto's
API); Alibaba against the local fake endpoint driven through the official BSS SDK, with the
credentials the default chain finds on the host."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from datetime import date
from pathlib import Path

import boto3
import pytest
import yaml
from moto import mock_aws
from prometheus_client.parser import text_string_to_metric_families

from infra import billing

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bootstrap"))  # the Alibaba fake
from fake_alibaba import ACCESS_KEY, SECRET, TOKEN, FakeAlibaba  # noqa: E402

from tests.deploy.bill_answers import DAYS, TODAY, bss_bill, queue_ce_answer  # noqa: E402


def scrape(exporter: billing.Exporter) -> dict[str, list[tuple[dict[str, str], float]]]:
    """GET /metrics over loopback and parse it with Prometheus' own client parser."""
    server = exporter.server("127.0.0.1", 0)
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = answer.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    return {
        family.name: [(s.labels, s.value) for s in family.samples]
        for family in text_string_to_metric_families(text)
    }


def test_the_shipped_file_is_the_code_torchfleet_cost_runs(tmp_path):
    shipped = ROOT / "roles" / "monitoring" / "files" / "torchfleet_spend.py"
    assert shipped.resolve() == Path(billing.__file__).resolve()
    # it runs alone, as on the host: the system Python, isolated, without infra or any SDK
    done = subprocess.run(
        ["/usr/bin/python3", "-I", str(shipped), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "--stack" in done.stdout and "--refresh" in done.stdout


def test_aws_spend_from_cost_explorer_on_metrics(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    with mock_aws():
        queue_ce_answer(DAYS)
        client = boto3.client("ce", region_name="us-east-1")
        exporter = billing.Exporter(
            "aws-dev",
            "aws",
            3,
            lambda start, end: billing.aws_spend("aws-dev", start, end, client),
            today=lambda: TODAY,
        )
        exporter.refresh()
        metrics = scrape(exporter)
    base = {"stack": "aws-dev", "cloud": "aws"}
    assert metrics["torchfleet_spend_up"] == [(base, 1.0)]
    money = {**base, "currency": "USD"}
    assert metrics["torchfleet_spend_day"] == [
        ({**money, "day": day}, float(amount)) for day, amount in DAYS
    ]
    assert metrics["torchfleet_spend_last_day"] == [(money, 0.25)]
    assert metrics["torchfleet_spend_window"] == [({**money, "days": "3"}, 22.75)]
    assert metrics["torchfleet_spend_estimated"] == [(money, 1.0)]  # 2026-12-01 not final
    assert metrics["torchfleet_spend_read_timestamp_seconds"][0][1] > 0


def test_alibaba_spend_from_bss_with_the_hosts_credential_chain(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", SECRET)
    monkeypatch.setenv("ALIBABA_CLOUD_SECURITY_TOKEN", TOKEN)
    # The SDK reads these variables once, when alibabacloud_credentials is first imported (the
    # exporter's service has them before it starts); another test in this process may have
    # imported it already.
    from alibabacloud_credentials.utils import auth_util

    monkeypatch.setattr(auth_util, "environment_access_key_id", ACCESS_KEY)
    monkeypatch.setattr(auth_util, "environment_access_key_secret", SECRET)
    monkeypatch.setattr(auth_util, "environment_security_token", TOKEN)
    calls: list = []
    with FakeAlibaba(bss_bill(calls), region="ap-southeast-1") as cloud:
        read = billing.reader("alicloud", "alicloud-dev", "ap-southeast-1", cloud.url)
        exporter = billing.Exporter("alicloud-dev", "alicloud", 2, read, today=lambda: TODAY)
        exporter.refresh()
        assert not cloud.refused  # every call carried a verified ACS3 signature
    assert [c["BillingDate"] for c in calls[::2]] == ["2026-11-30", "2026-12-01"]
    metrics = scrape(exporter)
    money = {"stack": "alicloud-dev", "cloud": "alicloud", "currency": "CNY"}
    assert metrics["torchfleet_spend_day"] == [
        ({**money, "day": "2026-11-30"}, 31.75),
        ({**money, "day": "2026-12-01"}, 31.75),
    ]
    assert metrics["torchfleet_spend_window"] == [({**money, "days": "2"}, 63.5)]


def test_a_failed_read_keeps_the_last_figures_and_says_so(capsys):
    answers = [billing.Spend(date(2026, 12, 1), TODAY, 4.5, "USD", [("2026-12-01", 4.5)])]

    def read(start: date, end: date) -> billing.Spend:
        if not answers:
            raise RuntimeError("AccessDeniedException: not authorized for ce:GetCostAndUsage")
        return answers.pop()

    exporter = billing.Exporter("aws-dev", "aws", 1, read, today=lambda: TODAY)
    exporter.refresh()
    exporter.refresh()
    metrics = scrape(exporter)
    assert metrics["torchfleet_spend_up"][0][1] == 0.0
    assert metrics["torchfleet_spend_last_day"][0][1] == 4.5
    assert "ce:GetCostAndUsage" in capsys.readouterr().err


def test_before_any_read_only_up_is_served():
    exporter = billing.Exporter("s", "aws", 1, lambda s, e: billing.Spend(s, e, 0, "USD"))
    metrics = scrape(exporter)
    assert metrics["torchfleet_spend_up"][0][1] == 0.0
    assert "torchfleet_spend_day" not in metrics


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--days", "0"], "--days = 0 is invalid; allowed: 1 to 31"),
        (["--refresh", "60"], "--refresh = 60 is invalid; allowed: 600 seconds or more"),
        (["--cloud", "gcp"], "invalid choice: 'gcp'"),
    ],
)
def test_bad_arguments_are_refused(args, message, capsys):
    argv = ["--stack", "s", "--cloud", "aws", *args]
    with pytest.raises(SystemExit):
        billing.main(argv)
    assert message in capsys.readouterr().err


def test_the_roles_sdk_pins_are_the_controllers():
    pins = {}
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split(";")[0].strip().split("==")
            pins[name.lower().replace("_", "-")] = version
    defaults = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())
    packages = defaults["monitoring_spend_packages"]
    assert set(packages) == set(billing.CLOUDS)
    for cloud, lines in packages.items():
        for line in lines:
            name, version = line.split("==")
            assert pins[name.lower()] == version, (cloud, line)
