"""Spot interruption watcher: poll the cloud's metadata service and drain on notice.

Both clouds' metadata services are session-based here, the way the fleets configure them
(tokens required: AWS IMDSv2 `http_tokens=required`, Alibaba "security hardening mode"
`HttpTokens=required`): PUT /latest/api/token with the cloud's TTL header, then every GET with
the cloud's token header. A token is reused until shortly before its TTL ends and fetched again
at once when the service rejects it (401/403: expired, or the service restarted).
- AWS (2-minute notice): GET /latest/meta-data/spot/instance-action; 404 means no notice, 200
  carries {"action": "terminate"|"stop"|"hibernate", "time": ...}.
- Alibaba Cloud (about 5 minutes): GET /latest/meta-data/instance/spot/termination-time; 404
  means no notice, 200 carries the UTC time of release.
The header names and the TTL are the node agent's too (infra/bootstrap/torchfleet_agent/imds.py):
the two packages cannot share a module, so tests/runtime/test_spot.py holds them equal.
Base URLs are configurable so tests (and odd networks) can point at another server. `auto`
probes both services once at start, briefly (a token, then the instance id), and turns the
watcher off when neither answers.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from typing import Callable

log = logging.getLogger(__name__)

TOKEN_PATH = "/latest/api/token"  # the same on both clouds
AWS_TOKEN_HEADER = "X-aws-ec2-metadata-token"
AWS_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
AWS_NOTICE_PATH = "/latest/meta-data/spot/instance-action"
AWS_PROBE_PATH = "/latest/meta-data/instance-id"
ALICLOUD_TOKEN_HEADER = "X-aliyun-ecs-metadata-token"
ALICLOUD_TTL_HEADER = "X-aliyun-ecs-metadata-token-ttl-seconds"
ALICLOUD_NOTICE_PATH = "/latest/meta-data/instance/spot/termination-time"
ALICLOUD_PROBE_PATH = "/latest/meta-data/instance-id"
TOKEN_TTL_S = 21600  # the longest both clouds allow
REJECTED = (401, 403)  # the token is no longer valid: fetch a new one

# Metadata services are link-local: never send these requests through an HTTP proxy.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class MetadataSession:
    """A token-protected metadata service: one cloud's base URL, token header and TTL header."""

    def __init__(self, base: str, token_header: str, ttl_header: str, timeout_s: float) -> None:
        self.base = base.rstrip("/")
        self.token_header, self.ttl_header = token_header, ttl_header
        self._timeout = timeout_s
        self._token: str | None = None
        self._expires = 0.0
        self.tokens_fetched = 0

    def _request(
        self, path: str, method: str = "GET", headers: dict[str, str] | None = None
    ) -> tuple[int, str]:
        req = urllib.request.Request(self.base + path, method=method, headers=headers or {})
        try:
            with _opener.open(req, timeout=self._timeout) as resp:
                return resp.status, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            return exc.code, ""

    def token(self) -> str:
        """The session token, fetched when there is none or it is about to expire; OSError when
        the service does not hand one out."""
        if self._token is None or time.monotonic() >= self._expires:
            status, body = self._request(TOKEN_PATH, "PUT", {self.ttl_header: str(TOKEN_TTL_S)})
            if status != 200 or not body.strip():
                raise OSError(
                    f"metadata token request to {self.base}{TOKEN_PATH} answered {status}"
                )
            self._token = body.strip()
            self._expires = time.monotonic() + TOKEN_TTL_S - 60
            self.tokens_fetched += 1
        return self._token

    def get(self, path: str) -> tuple[int, str]:
        """GET with the token; a rejected token is replaced and the request sent once more."""
        status, body = self._request(path, headers={self.token_header: self.token()})
        if status in REJECTED:
            self._token = None
            status, body = self._request(path, headers={self.token_header: self.token()})
        return status, body


class SpotWatcher:
    def __init__(
        self,
        mode: str,
        aws_url: str,
        alicloud_url: str,
        interval_s: float,
        on_notice: Callable[[str], None],
        timeout_s: float = 2.0,
    ) -> None:
        self.mode = mode  # auto | aws | alicloud | off; resolved to the cloud (or off) by start()
        self.sessions = {
            "aws": MetadataSession(aws_url, AWS_TOKEN_HEADER, AWS_TTL_HEADER, timeout_s),
            "alicloud": MetadataSession(
                alicloud_url, ALICLOUD_TOKEN_HEADER, ALICLOUD_TTL_HEADER, timeout_s
            ),
        }
        self._interval = interval_s
        self._on_notice = on_notice
        self._timeout = timeout_s
        self._stop = threading.Event()
        self.notice: str | None = None
        self._thread = threading.Thread(target=self._run, name="torchfleet-spot-watch", daemon=True)

    def start(self) -> None:
        if self.mode != "off":
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._timeout * 2)

    # --- probes and polls --------------------------------------------------------------------

    def _detect(self) -> str:
        for cloud, probe in (("aws", AWS_PROBE_PATH), ("alicloud", ALICLOUD_PROBE_PATH)):
            try:
                if self.sessions[cloud].get(probe)[0] == 200:
                    return cloud
            except OSError:
                pass
        return "off"

    def poll_once(self) -> str | None:
        """The notice text if one is posted now, else None. Raises OSError when unreachable."""
        path = AWS_NOTICE_PATH if self.mode == "aws" else ALICLOUD_NOTICE_PATH
        status, body = self.sessions[self.mode].get(path)
        if status in REJECTED:
            raise OSError(f"the {self.mode} metadata service refused a fresh token ({status})")
        return body if status == 200 and body.strip() else None

    def _run(self) -> None:
        if self.mode == "auto":
            self.mode = self._detect()
            if self.mode == "off":
                log.info("spot watch: no cloud metadata service answered; watcher off")
                return
        log.info("spot watch: polling %s metadata every %.1f s", self.mode, self._interval)
        failures = 0
        while not self._stop.is_set():
            try:
                notice = self.poll_once()
                failures = 0
            except OSError as exc:
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("spot watch: metadata poll failed (%d in a row): %s", failures, exc)
                notice = None
            if notice is not None:
                self.notice = notice
                log.warning(
                    "spot interruption notice from %s: %s; draining", self.mode, notice.strip()
                )
                self._on_notice(notice)
                return
            self._stop.wait(self._interval)
