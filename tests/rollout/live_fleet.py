"""What the rollout tests on a live fleet share (tests/rollout/test_local_rollout.py: runtime
processes; tests/e2e/test_demo.py: the demo's container nodes): the bounded client load through
the load balancer's HTTPS listener, Debian's Prometheus scraping the nodes, and the command.

Importable by name: tests/rollout/conftest.py and tests/e2e/conftest.py put this folder on
sys.path."""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from infra import client
from infra.cli import main as torchfleet
from infra.deploy.balancer import free_port
from infra.rollout.local import LocalFleet

LOAD_MAX_REQUESTS = 60000  # per rollout, whatever happens
LOAD_MAX_S = 120.0
# Each client pauses this long between requests: a steady load that neither reaches the count
# bound before the last step's window on a fast machine nor saturates two cores.
LOAD_PAUSE_S = 0.002


@dataclass
class Load:
    """Clients sending one prediction request through the load balancer's HTTPS listener
    (`port` on localhost, certificate verified against `cafile`) until stopped, each at most
    `max_s` seconds and all together at most `max_requests`: (monotonic time, status) per
    request; `check(body)` says whether a 200 carries the stable model's outputs."""

    port: int
    cafile: str
    body: bytes
    headers: dict[str, str]
    check: Callable[[bytes], bool]
    token: str | None = None
    clients: int = 3
    max_requests: int = LOAD_MAX_REQUESTS
    max_s: float = LOAD_MAX_S
    pause_s: float = LOAD_PAUSE_S
    results: list[tuple[float, int]] = field(default_factory=list)
    wrong: int = 0  # 200 answers whose outputs are not the stable model's
    stop: threading.Event = field(default_factory=threading.Event)

    def run_client(self) -> None:
        ctx = client.Auth(cafile=self.cafile).ssl_context()
        conn = http.client.HTTPSConnection("localhost", self.port, context=ctx, timeout=30)
        headers = dict(self.headers)
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        deadline = time.monotonic() + self.max_s
        while not self.stop.is_set() and time.monotonic() < deadline:
            if len(self.results) >= self.max_requests:
                break
            try:
                conn.request("POST", "/v1/predict", self.body, headers)
                resp = conn.getresponse()
                body = resp.read()
                status = resp.status
                if status == 200 and not self.check(body):
                    self.wrong += 1
            except (OSError, http.client.HTTPException):
                status = 0
                conn.close()
            self.results.append((time.monotonic(), status))
            self.stop.wait(self.pause_s)

    def __enter__(self) -> Load:
        self.threads = [threading.Thread(target=self.run_client) for _ in range(self.clients)]
        for t in self.threads:
            t.start()
        time.sleep(1.0)  # the load is steady before the rollout starts
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def statuses(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for _, s in self.results:
            out[s] = out.get(s, 0) + 1
        return out

    def failed(self, since: float = 0.0, until: float = float("inf")) -> int:
        return sum(1 for t, s in self.results if since <= t < until and s != 200)

    def sent(self, since: float = 0.0, until: float = float("inf")) -> int:
        return sum(1 for t, _ in self.results if since <= t < until)


def rollout(stack: str, fleet: Path, *args: str) -> int:
    """`torchfleet rollout STACK --fleet FLEET ARGS...`: its exit code."""
    return torchfleet(["rollout", stack, "--fleet", str(fleet), *args])


def under_load(load: Load, run: Callable[[], int], settle_s: float) -> tuple[int, float, float]:
    """`run()` (a rollout) with `load` running from a second before it to `settle_s` after it:
    its exit code, and the monotonic times it began and ended."""
    with load:
        began = time.monotonic()
        code = run()
        ended = time.monotonic()
        time.sleep(settle_s)
    return code, began, ended


@contextmanager
def prometheus(
    work: Path, targets: list[str], credentials_file: Path | None = None
) -> Iterator[str]:
    """Debian's Prometheus on loopback scraping `targets` (host:port) every second (static
    targets: each series carries job and instance, which the guards' join with
    torchfleet_model_info uses), with the bearer token in `credentials_file` when given (a file,
    never a flag); its base URL once every target was scraped a few times."""
    if shutil.which("prometheus") is None:
        raise RuntimeError("prometheus is not installed: run `make setup`")
    work.mkdir(parents=True, exist_ok=True)
    job = {"job_name": "torchfleet-runtime", "static_configs": [{"targets": targets}]}
    if credentials_file is not None:
        job["authorization"] = {"type": "Bearer", "credentials_file": str(credentials_file)}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [job],
    }
    (work / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=(work / "log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while client.request("GET", f"{url}/-/ready", timeout=2)[0] != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus never ready: {(work / 'log').read_text()[-800:]}")
            time.sleep(0.2)
        time.sleep(3.0)  # a few scrapes of every target
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def targets_up(url: str) -> dict[str, str]:
    """Prometheus's view of its targets: instance -> health (up, down, unknown)."""
    doc = client.get_json(client.Target.parse(url), "/api/v1/targets", timeout=10)
    return {t["labels"]["instance"]: t["health"] for t in doc["data"]["activeTargets"]}


# --- what every live rollout test checks ------------------------------------------------------
# `out` is the command's output, `load` the client load that ran through the rollout.


def versions(local: LocalFleet) -> set[str]:
    """The model versions the fleet's nodes serve now (their GET /v1/model)."""
    return {local.serving(n)[1] for n in local.nodes()}


def check_promoted(local: LocalFleet, load: Load, out: str, version: str, steps: int) -> None:
    """Promoted through all `steps` to 100 % with no failed and no wrong answer."""
    assert f"promoted: {version} serves 100 %" in out, out
    assert "stable: no window yet" not in out, out  # every window compared the two versions
    assert load.failed() == 0 and load.wrong == 0, (load.statuses(), load.wrong)
    assert load.sent() > 100
    assert versions(local) == {version}
    doc = local.state().read()
    assert doc["status"] == "promoted"
    assert [e["step"] for e in doc["timeline"] if e["decision"] == "ok"][-1] == steps


def check_rolled_back(
    local: LocalFleet,
    load: Load,
    out: str,
    guard: str,
    stable: str,
    window: tuple[float, float],
    answers_5xx: bool,
) -> tuple[int, int]:
    """Rolled back by `guard` to `stable`, no request failed after the rollback (window[1])
    and, during the rollout, only a candidate that answers 5xx failed any: within its canary's
    share of the requests sent (10 % of a few windows, with slack for the ramp). (failed, sent)
    during the rollout."""
    began, ended = window
    assert f"guard {guard}:" in out, out
    assert versions(local) == {stable}
    assert load.failed(since=ended) == 0 and load.wrong == 0, (load.statuses(), load.wrong)
    during, failed = load.sent(began, ended), load.failed(began, ended)
    if answers_5xx:
        assert 0 < failed <= 0.2 * during, (failed, during)
    else:
        assert failed == 0, (failed, during)
    doc = local.state().read()
    assert doc["status"] == "rolled_back" and doc["timeline"][-1]["guard"] == guard
    return failed, during


def check_shadow_differs(local: LocalFleet, load: Load, out: str, before: set[str]) -> dict:
    """The shadow test found the candidate differs, no client saw its outputs or failed, the
    shadow is gone from every node and the serving versions are `before`; the record."""
    assert "guard shadow_agreement" in out, out
    assert load.wrong == 0 and load.failed() == 0, (load.wrong, load.statuses())
    assert load.sent() > 50
    shadow: dict = local.state().read()["shadow"]
    assert shadow["result"] == "differs" and shadow["argmax_agreement"] < 0.5, shadow
    assert all(local.shadow_summary(n) is None for n in local.nodes())
    assert versions(local) == before
    return shadow
