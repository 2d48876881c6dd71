"""Spot interruption notices: a fake metadata service on loopback that, like the fleets' real
ones, refuses tokenless requests (AWS IMDSv2 `http_tokens=required`, Alibaba's security
hardening mode), posts notices, and revokes tokens; the node agent's session against the same
fake keeps the two implementations' header names and TTL equal."""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import rt_models
from test_batching import wait_until
from torchfleet_runtime import interruption
from torchfleet_runtime.interruption import SpotWatcher

from infra.bootstrap.torchfleet_agent.imds import Imds

TTL = {
    "aws": "X-aws-ec2-metadata-token-ttl-seconds",
    "alicloud": "X-aliyun-ecs-metadata-token-ttl-seconds",
}
TOKEN = {"aws": "X-aws-ec2-metadata-token", "alicloud": "X-aliyun-ecs-metadata-token"}
NOTICE = {
    "aws": "/latest/meta-data/spot/instance-action",
    "alicloud": "/latest/meta-data/instance/spot/termination-time",
}
REFUSED = {"aws": 401, "alicloud": 403}  # what each answers a request without a valid token


class FakeMetadata(BaseHTTPRequestHandler):
    """Both clouds' metadata services at one address: PUT /latest/api/token with a cloud's TTL
    header hands out that cloud's token; a GET is that cloud's when it carries its token header
    (else the one cloud switched on). Tokenless or stale-token GETs are refused. The log keeps
    header names lower-cased: they are case-insensitive, and urllib title-cases them."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, status: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        s = self.server
        s.log.append(("PUT", self.path, {k.lower(): v for k, v in self.headers.items()}))
        clouds = [c for c in s.clouds if self.headers.get(TTL[c])]
        if self.path != "/latest/api/token" or not s.clouds:
            return self._reply(404)
        if not clouds:
            return self._reply(400)  # both answer 400 to a PUT without their TTL header
        cloud = clouds[0]
        token = f"{cloud}-token-{next(s.serial)}"
        s.valid[cloud].add(token)
        s.issued[cloud] += 1
        self._reply(200, token)

    def do_GET(self) -> None:
        s = self.server
        s.log.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
        cloud = next((c for c in s.clouds if self.headers.get(TOKEN[c])), None)
        if cloud is None and len(s.clouds) == 1:
            cloud = next(iter(s.clouds))
        if cloud is None:
            return self._reply(404)
        if self.headers.get(TOKEN[cloud]) not in s.valid[cloud]:
            return self._reply(REFUSED[cloud], "token required")
        if self.path == NOTICE[cloud]:
            s.polls[cloud] += 1
            return self._reply(200, s.notice[cloud]) if s.notice[cloud] else self._reply(404)
        if self.path == "/latest/meta-data/instance-id":
            return self._reply(200, f"i-{cloud}")
        self._reply(404)


@pytest.fixture
def metadata_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeMetadata)
    srv.daemon_threads = True
    srv.clouds = {"aws", "alicloud"}
    srv.serial = itertools.count(1)
    srv.valid = {"aws": set(), "alicloud": set()}
    srv.issued = {"aws": 0, "alicloud": 0}
    srv.polls = {"aws": 0, "alicloud": 0}
    srv.notice = {"aws": "", "alicloud": ""}
    srv.log = []
    threading.Thread(
        target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    ).start()  # quick shutdown
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def notice_for(cloud: str) -> str:
    return (
        json.dumps({"action": "terminate", "time": "2026-11-30T20:00:00Z"})
        if cloud == "aws"
        else "2026-11-30T20:00:00Z"
    )


@pytest.mark.parametrize("cloud", ["aws", "alicloud"])
def test_a_spot_notice_drains_the_runtime(cloud, metadata_server, start_runtime, client_for):
    srv, url = metadata_server
    rt = start_runtime(
        rt_models.tiny(),
        max_batch_size=2,
        spot_watch=cloud,
        aws_metadata_url=url,
        alicloud_metadata_url=url,
        spot_poll_interval_s=0.02,
    )
    c = client_for(rt)
    wait_until(lambda: srv.polls[cloud] >= 2, "the watcher to poll")
    assert c.call("GET", "/readyz")[0] == 200 and c.predict([1.0, 2.0, 3.0, 4.0])[0] == 200
    srv.notice[cloud] = notice_for(cloud)
    assert rt.runtime.stop_requested.wait(20)
    assert rt.runtime.state == "draining" and "spot" in rt.runtime.stop_reason
    # edge processes take the draining state from the owner's push a moment later
    wait_until(lambda: c.call("GET", "/readyz")[0] == 503, "/readyz to answer 503 while draining")
    assert c.predict([1.0, 2.0, 3.0, 4.0])[0] == 503
    assert rt.runtime.drain(5)
    assert srv.issued[cloud] == 1  # the token is reused, not fetched per poll
    assert all(TOKEN[cloud].lower() in h for m, _, h in srv.log if m == "GET")


@pytest.mark.parametrize("cloud", ["aws", "alicloud"])
def test_every_poll_carries_the_token_and_a_revoked_one_is_replaced_at_once(cloud, metadata_server):
    srv, url = metadata_server
    srv.clouds = {cloud}
    w = SpotWatcher(cloud, url, url, 1.0, lambda _: None, timeout_s=2)
    assert w.poll_once() is None  # no notice: 404 behind a valid token, not a refusal
    srv.valid[cloud].clear()  # the service restarted, or the token expired early
    srv.notice[cloud] = notice_for(cloud)
    assert w.poll_once() == notice_for(cloud)  # a fresh token, the same poll
    assert srv.issued[cloud] == 2
    puts = [h for m, _, h in srv.log if m == "PUT"]
    assert [h[TTL[cloud].lower()] for h in puts] == ["21600", "21600"]
    gets = [h.get(TOKEN[cloud].lower()) for m, _, h in srv.log if m == "GET"]
    assert len(gets) == 3 and all(gets)  # never a tokenless GET


def test_a_service_that_hands_out_no_token_is_a_failed_poll(metadata_server):
    srv, url = metadata_server
    srv.clouds = set()  # answers 404 to everything, the token endpoint included
    w = SpotWatcher("alicloud", url, url, 1.0, lambda _: None, timeout_s=2)
    with pytest.raises(OSError, match="token request .* answered 404"):
        w.poll_once()


def test_auto_detects_the_cloud_through_its_token_or_turns_itself_off(metadata_server):
    srv, url = metadata_server
    # a closed port for the cloud that is "not here": connection refused, like a missing service
    with ThreadingHTTPServer(("127.0.0.1", 0), FakeMetadata) as closed:
        nowhere = f"http://127.0.0.1:{closed.server_address[1]}"

    def detect(aws: str, ali: str) -> str:
        return SpotWatcher("auto", aws, ali, 1.0, lambda _: None, timeout_s=2)._detect()

    assert detect(url, nowhere) == "aws"
    assert detect(nowhere, url) == "alicloud"  # hardened: a tokenless probe would have been refused
    srv.clouds = {"alicloud"}
    assert detect(url, url) == "alicloud"
    assert detect(nowhere, nowhere) == "off"


@pytest.mark.parametrize("cloud", ["aws", "alicloud"])
def test_the_runtime_and_the_node_agent_speak_the_same_metadata_protocol(cloud, metadata_server):
    """The header names and TTL live twice (runtime/.../interruption.py and
    infra/bootstrap/torchfleet_agent/imds.py, which cannot share a module): both sessions
    against one fake."""
    srv, url = metadata_server
    srv.clouds = {cloud}
    node = Imds(cloud, url)
    assert node.get("instance-id") == f"i-{cloud}"
    agent_put, agent_get = (h for _, _, h in srv.log)
    srv.log.clear()
    session = SpotWatcher(cloud, url, url, 1.0, lambda _: None).sessions[cloud]
    assert session.get("/latest/meta-data/instance-id") == (200, f"i-{cloud}")
    runtime_put, runtime_get = (h for _, _, h in srv.log)
    assert (session.token_header, session.ttl_header) == (
        node.token_header,
        node.ttl_header,
    )
    assert (session.token_header, session.ttl_header) == (
        TOKEN[cloud],
        TTL[cloud],
    )  # Alibaba's and AWS's docs
    ttl = TTL[cloud].lower()
    assert runtime_put[ttl] == agent_put[ttl] == str(interruption.TOKEN_TTL_S)
    assert TOKEN[cloud].lower() in runtime_get and TOKEN[cloud].lower() in agent_get
