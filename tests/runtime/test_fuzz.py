"""The bounded fuzz and desync run (fuzz_http.py; the long run is its CLI): thousands of
generated malformed requests and smuggling attempts over raw sockets with slow clients alongside,
against a real in-process runtime. No 5xx, every error a JSON 4xx, every 200 strict JSON, no
smuggled request runs behind a single answer, the server keeps answering, every slow client
gets 408."""

from __future__ import annotations

import pytest
import rt_models
from fuzz_http import run

pytestmark = pytest.mark.timeout(120)

CASES = 3000


def test_generated_malformed_and_smuggling_requests(start_runtime):
    model = rt_models.Recorder()
    svc = start_runtime(
        model,
        max_batch_size=4,
        max_body_mb=1,
        header_timeout_s=1,
        body_timeout_s=1,
        log_level="error",
    )
    result = run(
        svc.port,
        CASES,
        lambda: model.seen,
        seed=7,
        workers=4,
        probe_every=500,
        slow_clients=8,
        slow_drip_s=0.05,
    )
    assert result["by_kind"]["desync"] >= 100 and result["by_kind"]["mutation"] >= 2000
    assert not result["violations"], "\n".join(result["violations"][:30])
    assert result["probes_failed"] == 0
    assert len(result["slow"]) == 8 and all(s.startswith("HTTP/1.1 408") for s in result["slow"]), (
        result["slow"]
    )
