"""The bills the spend tests read (tests/deploy/test_cost.py, tests/monitoring/test_spend_exporter.py):
three days of the stack's AWS spend queued as Cost Explorer's answer through moto's API, and
Alibaba's BSS bill as the loopback fake (tests/bootstrap/fake_alibaba.py) answers it."""

from __future__ import annotations

from datetime import date

import requests

TODAY = date(2026, 12, 2)
DAYS = [("2026-11-29", "10.00"), ("2026-11-30", "12.50"), ("2026-12-01", "0.25")]


def queue_ce_answer(days) -> None:
    """What Cost Explorer answers next (moto's API for canned Cost Explorer results)."""
    result = {
        "ResultsByTime": [
            {
                "TimePeriod": {"Start": day, "End": day},
                "Total": {"UnblendedCost": {"Amount": amount, "Unit": "USD"}},
                "Groups": [],
                "Estimated": day == "2026-12-01",
            }
            for day, amount in days
        ],
        "DimensionValueAttributes": [],
    }
    answer = requests.post(
        "http://motoapi.amazonaws.com/moto-api/static/ce/cost-and-usage-results",
        json={"results": [result]},
        timeout=5,
    )
    assert answer.status_code == 201, answer.text


def bss_bill(calls: list):
    """BSS DescribeInstanceBill, daily: two of the stack's lines and one of another stack each
    day, in CNY, over two pages (the SDK must follow NextToken)."""

    def answer(action: str, params: dict[str, str]) -> dict:
        assert action == "DescribeInstanceBill", action
        calls.append(params)
        day = params["BillingDate"]
        mine = "key:stack value:alicloud-dev; key:env value:dev"
        if not params.get("NextToken"):
            items = [
                {"InstanceID": "i-1", "Tag": mine, "PretaxAmount": 30.5, "Currency": "CNY"},
                {
                    "InstanceID": "i-x",
                    "Tag": "key:stack value:other",
                    "PretaxAmount": 99.0,
                    "Currency": "CNY",
                },
            ]
            token = f"{day}-2"
        else:
            assert params["NextToken"] == f"{day}-2"
            items = [{"InstanceID": "d-1", "Tag": mine, "PretaxAmount": 1.25, "Currency": "CNY"}]
            token = ""
        return {
            "Code": "Success",
            "Success": True,
            "Data": {"Items": items, "NextToken": token, "BillingCycle": params["BillingCycle"]},
        }

    return answer
