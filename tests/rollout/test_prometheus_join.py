"""PrometheusSource's queries (infra/rollout/signals.py) evaluated by Debian's Prometheus engine
(promtool's unit tests, no server): a node that reloaded v1 -> v2 while Prometheus was down
leaves its v1 info series unmarked for 5 minutes; the window's requests, 5xx, p99 and the node's
capacity at its batch cap still go to v2 alone. And the recording rules join the same way (one
expression, held equal here)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.rollout.signals import CURRENT_VERSION, PrometheusSource

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "roles" / "monitoring" / "files" / "rules" / "torchfleet-recording.rules.yml"
NODE = 'job="torchfleet-runtime",instance="a:8080",stack="s"'


def _promtool(tmp_path: Path, exprs: dict[str, str], expect: dict[str, list[dict]]) -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not installed: run `make setup`")
    series = {
        f'torchfleet_model_info{{{NODE},model_version="v1"}}': "1x8",
        f'torchfleet_model_info{{{NODE},model_version="v2"}}': "_x8 1x32",
        f'torchfleet_requests_total{{{NODE},code="200"}}': "0+45x40",
        f'torchfleet_requests_total{{{NODE},code="503"}}': "0+5x40",
        f'torchfleet_request_duration_seconds_bucket{{{NODE},le="0.05"}}': "0+40x40",
        f'torchfleet_request_duration_seconds_bucket{{{NODE},le="0.1"}}': "0+50x40",
        f'torchfleet_request_duration_seconds_bucket{{{NODE},le="+Inf"}}': "0+50x40",
        f"torchfleet_capacity_items_per_second{{{NODE}}}": "800x40",
        f"torchfleet_max_batch_size{{{NODE}}}": "32x40",
    }
    doc = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "promql_expr_test": [
                    {"expr": expr, "eval_time": "4m", "exp_samples": expect[key]}
                    for key, expr in exprs.items()
                ],
            }
        ],
    }
    path = tmp_path / "q.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run(
        [promtool, "test", "rules", path.name], cwd=tmp_path, capture_output=True, text=True
    )
    return done.stdout + done.stderr


def test_a_window_after_a_restart_goes_to_the_version_served_now(tmp_path):
    queries = PrometheusSource("http://unused", "").queries(60)
    v2 = '{model_version="v2"}'
    out = _promtool(
        tmp_path,
        {
            "requests": queries["requests"],
            "errors": queries["errors"],
            "p99": f"round({queries['p99']}, 0.0001)",
            "capacity": queries["capacity"],
            "batch_cap": queries["batch_cap"],
        },
        {
            # 50 answers per 15 s, 5 of them 5xx, over a minute; 40 of each 50 within 0.05 s, so the
            # p99 is 0.05 + 0.05 * (49.5 - 40) / 10 inside the (0.05, 0.1] bucket
            "requests": [{"labels": v2, "value": 200}],
            "errors": [{"labels": v2, "value": 20}],
            "p99": [{"labels": v2, "value": 0.0975}],
            # the node's capacity at its cap goes to the version it serves now
            "capacity": [{"labels": v2, "value": 800}],
            "batch_cap": [{"labels": v2, "value": 32}],
        },
    )
    assert "SUCCESS" in out, out


def test_the_plain_join_the_queries_replace_fails_there(tmp_path):
    """Why CURRENT_VERSION exists: the join on torchfleet_model_info alone is refused."""
    plain = (
        "sum by (model_version) (increase(torchfleet_requests_total[60s]) "
        "* on (job, instance) group_left (model_version) torchfleet_model_info)"
    )
    out = _promtool(tmp_path, {"requests": plain}, {"requests": [{"labels": "{}", "value": 0}]})
    assert "many-to-many matching not allowed" in out, out


def test_the_recording_rules_join_as_the_rollout_does():
    text = re.sub(r"\s+", " ", RULES.read_text())
    assert text.count("group_left (model_version)") == 6
    assert text.count(f"group_left (model_version) {CURRENT_VERSION}") == 6
