"""`torchfleet cost` (infra.spend): the stack's measured spend from Cost Explorer beside the
estimate for the same days. moto implements GetCostAndUsage (its answers are queued through
moto's own API, and it records the request each answered), not UpdateCostAllocationTagsStatus:
the activation's request is checked against botocore's service model with botocore's Stubber."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from moto.ce.models import ce_backends
from moto.core import DEFAULT_ACCOUNT_ID

from infra import cli, spend
from infra.config import load, raw_from_pulumi_config
from infra.cost import HOURS_PER_MONTH, estimate
from infra.deploy import pipeline
from infra.deploy.stage import StageError
from infra.plan import load_stack_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bootstrap"))  # the Alibaba fake
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bill_answers
from bill_answers import DAYS, TODAY, bss_bill, queue_ce_answer
from fake_alibaba import ACCESS_KEY, SECRET, TOKEN, FakeAlibaba


@pytest.fixture
def moto_ce(monkeypatch, aws_keys):
    with mock_aws():
        monkeypatch.setattr(spend, "ce_client", lambda: boto3.client("ce", region_name="us-east-1"))
        yield ce_backends[DEFAULT_ACCOUNT_ID]["global"]


def test_cost_reports_measured_beside_the_estimate_for_the_same_days(moto_ce, console, text):
    queue_ce_answer(DAYS)
    out = pipeline.cost("aws-dev", console, 3, today=TODAY)
    # the request: the last three whole days, daily, by the stack tag
    (body,) = [json.loads(b) for b in moto_ce.cost_usage_results]
    assert body["TimePeriod"] == {"Start": "2026-11-29", "End": "2026-12-02"}
    assert body["Granularity"] == "DAILY" and body["Metrics"] == ["UnblendedCost"]
    assert body["Filter"] == {
        "Tags": {"Key": "stack", "Values": ["aws-dev"], "MatchOptions": ["EQUALS"]}
    }
    # the report: measured 22.75, the estimate for 72 h of aws-dev's month, the difference
    cfg = load(raw_from_pulumi_config(load_stack_config("aws-dev")), "aws-dev")
    est = estimate(cfg)
    typical = round(est.monthly_typical * 72 / HOURS_PER_MONTH, 2)
    report = "\n".join(out)
    assert f"estimated  {typical:10.2f} USD typical" in report
    assert "measured        22.75 USD by tag stack=aws-dev (partly estimated" in report
    assert (
        f"difference {22.75 - typical:+10.2f} USD ({100 * (22.75 - typical) / typical:+.1f} %"
        in report
    )
    assert "    2026-11-30     12.50" in report
    # moto has no UpdateCostAllocationTagsStatus: `cost` says it could not activate, and goes on
    assert "cost allocation tag `stack` not activated" in text(console)


def test_no_spend_by_the_tag_says_why_it_may_be_missing(moto_ce, console):
    queue_ce_answer([(d, "0") for d, _ in DAYS])
    report = "\n".join(pipeline.cost("aws-dev", console, 3, today=TODAY))
    assert "measured         0.00 USD" in report
    assert "the tag must be an active cost-allocation tag" in report


def test_the_cli_reads_since_and_refuses_a_bad_one(moto_ce, trap_dirs, capsys):
    queue_ce_answer(DAYS)
    assert cli.main(["cost", "aws-dev", "--since", "1w"]) == 0
    out = capsys.readouterr().out
    assert "aws-dev: 7 day(s)" in out and "measured" in out
    assert cli.main(["cost", "aws-dev", "--since", "7 days"]) == 3
    assert "--since = '7 days' is invalid; allowed: a number of days or weeks" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(("text", "days"), [("1d", 1), ("7d", 7), ("2w", 14), ("365d", 365)])
def test_since(text, days):
    assert spend.parse_since(text) == days


@pytest.mark.parametrize("text", ["0d", "366d", "7", "7h", "-1d", ""])
def test_since_refused(text):
    with pytest.raises(spend.SpendError, match="--since"):
        spend.parse_since(text)
    with pytest.raises(StageError) as err, pipeline.spend_errors():
        spend.parse_since(text)
    assert err.value.stage == "preflight"


def test_alibaba_reads_the_bill_through_bss_by_the_stack_tag(monkeypatch, tmp_path, console):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("ALICLOUD_ACCESS_KEY", ACCESS_KEY)
    monkeypatch.setenv("ALICLOUD_SECRET_KEY", SECRET)
    monkeypatch.setenv("ALICLOUD_SECURITY_TOKEN", TOKEN)
    calls: list = []
    cfg = load(raw_from_pulumi_config(load_stack_config("alicloud-dev")), "alicloud-dev")
    with FakeAlibaba(bss_bill(calls), region=cfg.region) as cloud:
        monkeypatch.setenv("ALICLOUD_BSS_ENDPOINT", cloud.url)
        report = "\n".join(pipeline.cost("alicloud-dev", console, 2, today=TODAY))
        assert not cloud.refused  # every call carried a verified ACS3 signature
    # one day per call, daily granularity, each day paged
    assert [(c["BillingDate"], c["BillingCycle"], c["Granularity"]) for c in calls[::2]] == [
        ("2026-11-30", "2026-11", "DAILY"),
        ("2026-12-01", "2026-12", "DAILY"),
    ]
    # the stack's lines only (31.75 a day), in the account's currency
    assert "measured        63.50 CNY by tag stack=alicloud-dev" in report
    assert "    2026-11-30     31.75" in report
    # the estimate is in the reference table's USD: no difference across currencies
    assert "difference not computed: billed in CNY, estimated in USD" in report


def test_activation_request_and_its_answers():
    client = boto3.client(
        "ce", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b"
    )
    request = {"CostAllocationTagsStatus": [{"TagKey": "stack", "Status": "Active"}]}
    with Stubber(client) as stub:  # checks the request against the service model
        stub.add_response("update_cost_allocation_tags_status", {"Errors": []}, request)
        assert "`stack` active" in spend.activate_stack_tag(client)
        stub.add_response(
            "update_cost_allocation_tags_status",
            {"Errors": [{"TagKey": "stack", "Code": "TagKeysNotFoundException", "Message": "no"}]},
            request,
        )
        line = spend.activate_stack_tag(client)
        assert "not activated yet (TagKeysNotFoundException" in line and "up to a day" in line
        stub.add_client_error("update_cost_allocation_tags_status", "AccessDeniedException")
        assert "not activated: " in spend.activate_stack_tag(client)


def test_up_activates_the_tag(cost_explorer):
    """The autouse fake records what `up` sends (the recorded `up` test drives it)."""
    line = spend.activate_stack_tag()
    assert cost_explorer.calls == [
        {"CostAllocationTagsStatus": [{"TagKey": "stack", "Status": "Active"}]}
    ]
    assert "active" in line


@pytest.mark.parametrize(("stack", "per_day"), [("aws-dev", "0.00"), ("aws-k8s", "5.63")])
def test_status_says_what_the_ttl_leaves_and_its_cost_a_day(stack, per_day):
    from infra.deploy.summary import Summary
    from infra.offline import run_offline

    outputs = run_offline(stack, load_stack_config(stack)).outputs
    cfg = load(raw_from_pulumi_config(load_stack_config(stack)), stack)
    (line,) = [x for x in Summary(stack, outputs, cfg).lines() if "after ttl" in x]
    assert f"after ttl   {per_day} USD/day until `torchfleet down`: " in line
    assert ("bundle bucket" in line) == (stack == "aws-dev")
    assert ("cluster control plane: EKS" in line) == (stack == "aws-k8s")
    # prod stacks have no TTL: nothing is said
    prod = run_offline("aws-prod", load_stack_config("aws-prod")).outputs
    assert not [x for x in Summary("aws-prod", prod).lines() if "after ttl" in x]
