"""Spot interruption notices: a fake metadata service on loopback (rt_helpers.FakeMetadata, served
by conftest.py's metadata_server) that, like the fleets' real ones, refuses tokenless requests
(AWS IMDSv2 `http_tokens=required`, Alibaba's security hardening mode), posts notices, and revokes
tokens; the node agent's session against the same fake keeps the two implementations' header
names and TTL equal."""

from __future__ import annotations

from http.server import ThreadingHTTPServer

import pytest
import rt_models
from rt_helpers import TOKEN, TTL, FakeMetadata, notice_for, wait_until
from torchfleet_runtime import interruption
from torchfleet_runtime.interruption import SpotWatcher

from infra.bootstrap.torchfleet_agent.imds import Imds


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
