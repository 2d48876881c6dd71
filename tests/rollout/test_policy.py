"""The rollout's pure decisions: steps, weights, guard settings and verdicts, the p99 of a
histogram, the model reference and the store's digest check."""

from __future__ import annotations

import hashlib

import pytest

from infra.rollout.policy import (
    Figures,
    GuardSettings,
    RolloutSettingsError,
    guard_settings,
    judge,
    judge_shadow,
    parse_duration,
    split,
    steps,
)
from infra.rollout.ref import ModelRef, RefError, Store
from infra.rollout.signals import parse_metrics, quantile

S = GuardSettings()


def test_strategies_and_given_steps():
    assert steps("canary") == (10, 100)
    assert steps("linear") == (25, 50, 75, 100)
    assert steps("all-at-once") == (100,)
    assert steps("canary", "5,20,100") == (5, 20, 100)
    for bad in ("10,5,100", "10,50", "0,100", "x", "10,150"):
        with pytest.raises(RolloutSettingsError, match="steps"):
            steps("canary", bad)
    with pytest.raises(RolloutSettingsError, match="strategy = 'blue'.*canary, linear"):
        steps("blue")


@pytest.mark.parametrize(
    "share,nodes,candidates",
    [(10, 3, 1), (50, 3, 2), (25, 4, 1), (75, 4, 3), (100, 3, 3), (10, 1, 1), (1, 10, 1)],
)
def test_split_gives_the_share_with_haproxy_weights(share, nodes, candidates):
    sp = split(share, nodes)
    assert sp.candidates == candidates
    assert 0 <= sp.candidate_weight <= 256 and 0 <= sp.stable_weight <= 256
    total = sp.candidates * sp.candidate_weight + (nodes - sp.candidates) * sp.stable_weight
    real = 100 * sp.candidates * sp.candidate_weight / total
    assert real == pytest.approx(sp.share, abs=0.01)
    if nodes > 1:
        assert sp.share == pytest.approx(share, abs=1.0)  # a single node cannot split


def test_guard_settings_validate_every_key_in_one_error():
    assert guard_settings({"max_p99_ratio": "1.5"}).max_p99_ratio == 1.5
    with pytest.raises(RolloutSettingsError) as err:
        guard_settings({"max_p99_ratio": 0.5, "min_requests": "many", "p99": 2})
    text = str(err.value)
    assert "max_p99_ratio = 0.5 is invalid; allowed: a number >= 1" in text
    assert "min_requests = 'many' is invalid; allowed: an integer >= 1" in text
    assert "p99 = 2 is invalid; allowed: the keys max_error_ratio_increase" in text


def test_durations():
    assert parse_duration("bake", "5m") == 300
    assert parse_duration("bake", "90s") == 90
    assert parse_duration("bake", "2") == 2
    with pytest.raises(RolloutSettingsError, match="bake = '0s'"):
        parse_duration("bake", "0s")


def stable(requests=1000, errors=0, p99=0.050):
    return Figures("v1", requests, errors, p99)


def test_a_healthy_candidate_passes():
    v = judge(stable(), Figures("v2", 100, 0, 0.055), S)
    assert v.decision == "ok"
    assert v.numbers["candidate"]["p99_s"] == 0.055


def test_too_few_candidate_requests_wait():
    v = judge(stable(), Figures("v2", 5, 5, 9.0), S)
    assert (v.decision, v.guard) == ("wait", "min_requests")


def test_the_error_guard_names_itself_and_the_numbers():
    v = judge(stable(errors=1), Figures("v2", 100, 3, 0.05), S)
    assert (v.decision, v.guard) == ("rollback", "error_ratio")
    assert "3.00 % > stable 0.10 % + 0.10 %" in v.reason
    # at the threshold (stable + 0.1 %) it holds
    assert judge(stable(errors=0), Figures("v2", 1000, 1, 0.05), S).decision == "ok"


def test_the_p99_guard_compares_with_the_stable_over_the_same_window():
    v = judge(stable(p99=0.050), Figures("v2", 100, 0, 0.200), S)
    assert (v.decision, v.guard) == ("rollback", "p99")
    assert "200.0 ms > 1.2 x stable 50.0 ms = 60.0 ms" in v.reason
    # a 2 ms p99 against 1 ms is twice as slow but within the noise floor
    assert judge(stable(p99=0.001), Figures("v2", 100, 0, 0.002), S).decision == "ok"


def test_the_shadow_guard():
    assert judge_shadow(0.5, 100, S).guard == "shadow_agreement"
    assert judge_shadow(1.0, 100, S).decision == "ok"
    assert judge_shadow(None, 0, S).decision == "wait"


def test_quantile_matches_prometheus_interpolation():
    # 100 observations: 50 <= 0.1, 90 <= 0.25, 100 <= 0.5
    b = [(0.1, 50), (0.25, 90), (0.5, 100), (float("inf"), 100)]
    assert quantile(0.5, b) == pytest.approx(0.1)
    assert quantile(0.99, b) == pytest.approx(0.25 + 0.25 * 0.9)
    assert quantile(0.99, []) is None
    assert quantile(0.99, [(0.1, 0), (float("inf"), 4)]) == 0.1  # only in +Inf


def test_parse_metrics_reads_version_requests_errors_buckets():
    text = "\n".join(
        [
            "# HELP x",
            'torchfleet_model_info{device="cpu",format="eager",model_name="m",model_version="v2",precision="fp32"} 1.0',
            'torchfleet_requests_total{code="200"} 90.0',
            'torchfleet_requests_total{code="500"} 10.0',
            'torchfleet_request_duration_seconds_bucket{le="0.1"} 95.0',
            'torchfleet_request_duration_seconds_bucket{le="+Inf"} 100.0',
            'torchfleet_shadow_instances_total{model_version="v3"} 40.0',
            'torchfleet_shadow_argmax_agreements_total{model_version="v3"} 30.0',
        ]
    )
    s = parse_metrics(text)
    assert (s.version, s.requests, s.errors) == ("v2", 100.0, 10.0)
    assert s.buckets == {0.1: 95.0, float("inf"): 100.0}
    assert s.shadow == {"v3": {"instances": 40.0, "agreements": 30.0}}


def test_a_reference_is_checked_before_it_is_kept(tmp_path):
    f = tmp_path / "m.pt"
    f.write_bytes(b"model bytes")
    sha = hashlib.sha256(b"model bytes").hexdigest()
    store = Store(tmp_path / "store")
    kept = store.put(ModelRef.parse(f"{f}@sha256:{sha}"))
    assert kept.read_bytes() == b"model bytes" and kept == store.file(sha)
    wrong = "0" * 64
    with pytest.raises(RefError, match=f"has sha256 {sha}, not {wrong}; nothing was changed"):
        store.put(ModelRef(str(f), wrong))
    assert not store.file(wrong).exists()
    with pytest.raises(RefError, match="--model = 'm.pt' is invalid"):
        ModelRef.parse("m.pt")


def test_ab_holds_one_share_below_100():
    assert steps("ab", "10") == (10,)
    for bad in (None, "100", "0", "10,100", "ten"):
        with pytest.raises(RolloutSettingsError, match="one percent 1-99 with --strategy ab"):
            steps("ab", bad)
