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
            # /v1 and /v2 traffic in their own series (the runtime's `route` label): summed
            'torchfleet_requests_total{code="200",route="/v1/predict"} 60.0',
            'torchfleet_requests_total{code="200",route="/v2/models/:model/infer"} 30.0',
            'torchfleet_requests_total{code="500",route="/v1/predict"} 10.0',
            'torchfleet_request_duration_seconds_bucket{le="0.1",route="/v1/predict"} 65.0',
            'torchfleet_request_duration_seconds_bucket{le="+Inf",route="/v1/predict"} 70.0',
            'torchfleet_request_duration_seconds_bucket{le="0.1",route="/v2/models/:model/infer"} 30.0',
            'torchfleet_request_duration_seconds_bucket{le="+Inf",route="/v2/models/:model/infer"} 30.0',
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


# --- what the p99 guard can see, and the capacity guard ----------------------------------------

OLD_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def test_the_latency_buckets_resolve_a_fifth_from_5_ms_to_5_s():
    from torchfleet_compat.histogram import FINE_FROM_S, FINE_TO_S, LATENCY_BOUNDS, resolution

    fine = [b for b in LATENCY_BOUNDS if FINE_FROM_S <= b <= FINE_TO_S]
    assert fine[0] == 0.005 and fine[-1] == 5.0
    assert max(b / a for a, b in zip(fine, fine[1:], strict=False)) <= 1.2 + 1e-9
    assert list(LATENCY_BOUNDS) == sorted(set(LATENCY_BOUNDS))
    assert 0.2 in LATENCY_BOUNDS  # the latency alert's threshold is a bound
    # the case: any p99 between 100 and 250 ms sat in one bucket
    assert resolution(0.12, OLD_BOUNDS) == 2.5
    for p in (0.0051, 0.012, 0.12, 0.24, 0.7, 4.9):
        assert resolution(p, LATENCY_BOUNDS) <= 1.2, p
    assert resolution(0.0005, LATENCY_BOUNDS) == float("inf")  # the lowest bucket starts at 0
    assert resolution(20.0, LATENCY_BOUNDS) == float("inf")  # past the last finite bound


def test_a_1_2x_slower_p99_reads_as_slower_on_the_new_buckets_only():
    """Two tracks' p99s read with histogram_quantile from what each track's requests fill in:
    the candidate 1.2x the stable at every request. On the old buckets, both read in the same
    bucket; on the new ones the reading moves by about the ratio."""
    from torchfleet_compat.histogram import LATENCY_BOUNDS

    def p99(latencies: list[float], bounds) -> float:
        counts = {b: float(sum(1 for x in latencies if x <= b)) for b in bounds}
        counts[float("inf")] = float(len(latencies))
        value = quantile(0.99, counts)
        assert value is not None
        return value

    stable = [0.105 + 0.0001 * i for i in range(200)]  # 105-125 ms
    cand = [x * 1.2 for x in stable]
    old = p99(cand, OLD_BOUNDS) / p99(stable, OLD_BOUNDS)
    new = p99(cand, LATENCY_BOUNDS) / p99(stable, LATENCY_BOUNDS)
    assert old < 1.1 < 1.15 < new, (old, new)
    verdict = judge(
        Figures("v1", 1000, 0, p99(stable, LATENCY_BOUNDS)),
        Figures("v2", 1000, 0, p99(cand, LATENCY_BOUNDS)),
        GuardSettings(max_p99_ratio=1.15),
    )
    assert verdict.guard == "p99", verdict


def test_the_resolution_at_the_stable_p99_is_said_and_a_finer_ratio_refused():
    from torchfleet_compat.histogram import LATENCY_BOUNDS

    from infra.rollout.policy import p99_resolution

    seen = p99_resolution(0.13, LATENCY_BOUNDS, S)
    assert (seen.lower_s, seen.upper_s, seen.ratio) == (0.12, 0.142, 1.183)
    assert "130.0 ms, in the latency bucket 120-142 ms" in seen.text()
    assert "tell apart there is 1.183" in seen.text()
    # the old buckets at 130 ms: 100-250 ms, a ratio of 2.5; 1.2 is refused, named
    with pytest.raises(RolloutSettingsError) as err:
        p99_resolution(0.13, OLD_BOUNDS, S)
    message = str(err.value)
    assert "max_p99_ratio = 1.2 is invalid" in message
    assert "a ratio of at least 2.5 here, or min_p99_increase_s of at least 0.15 s" in message
    assert p99_resolution(0.13, OLD_BOUNDS, GuardSettings(max_p99_ratio=2.5)).ratio == 2.5
    # where the absolute floor covers the bucket, the ratio does not decide: not refused
    assert p99_resolution(0.003, LATENCY_BOUNDS, S).ratio == 2.0
    with pytest.raises(RolloutSettingsError):
        p99_resolution(0.003, LATENCY_BOUNDS, GuardSettings(min_p99_increase_s=0.001))


def test_the_capacity_guard_compares_instances_per_second_at_the_cap():
    stable = Figures("v1", 500, 0, 0.05, capacity=1000.0, batch_cap=16)
    quarter = Figures("v2", 3, 0, None, capacity=240.0, batch_cap=4)
    v = judge(stable, quarter, S)  # no traffic needed: it is what the node measured
    assert (v.decision, v.guard) == ("rollback", "capacity"), v
    assert "240 instances/s at batch cap 4, 0.24 of a stable node's 1000/s at cap 16" in v.reason
    assert v.numbers["candidate"]["capacity_items_per_s"] == 240.0
    assert judge(stable, Figures("v2", 100, 0, 0.05, 800.0, 16), S).decision == "ok"
    assert judge(stable, Figures("v2", 100, 0, 0.05, 790.0, 16), S).guard == "capacity"
    lax = guard_settings({"min_capacity_ratio": "0.2"})
    assert judge(stable, Figures("v2", 100, 0, 0.05, 240.0, 4), lax).decision == "ok"
    # no figure on either side (a cloud's per-track metrics): nothing judged
    assert judge(Figures("v1", 500, 0, 0.05), quarter, S).decision == "wait"
    with pytest.raises(RolloutSettingsError, match="min_capacity_ratio = '2'"):
        guard_settings({"min_capacity_ratio": "2"})


def test_a_scrape_carries_each_nodes_capacity_and_cap():
    text = (
        "# TYPE torchfleet_capacity_items_per_second gauge\n"
        "torchfleet_capacity_items_per_second 812.5\n"
        "# TYPE torchfleet_max_batch_size gauge\n"
        "torchfleet_max_batch_size 32\n"
    )
    sample = parse_metrics(text)
    assert (sample.capacity, sample.batch_cap) == (812.5, 32)
    from infra.rollout.signals import capacity_of

    assert capacity_of([(800.0, 32), (1000.0, 64), (0.0, 8)]) == (900.0, 32)
    assert capacity_of([(0.0, 8)]) == (None, None)


def test_the_latency_histogram_costs_what_the_docs_say_per_node():
    """metrics.py's docstring and docs/monitoring.md state the series one node exposes for the
    request-latency histogram: a series per bound, +Inf, _sum, _count and _created, per route
    the node has served."""
    from torchfleet_runtime.metrics import Metrics
    from torchfleet_runtime.v2 import V1_ROUTE, V2_ROUTE

    m = Metrics()

    def series() -> list[str]:
        text = m.render().decode()
        return [x for x in text.splitlines() if x.startswith("torchfleet_request_duration_seconds")]

    assert len(series()) == 50, series()  # the figure the docs state: /v1's, from the start
    m.request_duration.labels(route=V1_ROUTE).observe(0.1)
    assert len(series()) == 50
    m.request_duration.labels(route=V2_ROUTE).observe(0.1)  # /v2's with its first request
    assert len(series()) == 100
