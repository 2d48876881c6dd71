"""Spot interruption watcher: poll the cloud's metadata service and drain on notice.

- AWS (2-minute notice): IMDSv2 only (launch templates require tokens): PUT /latest/api/token
  with a TTL header, then GET /latest/meta-data/spot/instance-action with the token; 404 means no
  notice, 200 carries {"action": "terminate"|"stop"|"hibernate", "time": ...}.
- Alibaba Cloud (about 5 minutes): GET /latest/meta-data/instance/spot/termination-time; 404
  means no notice, 200 carries the UTC time of release.
Base URLs are configurable so tests (and odd networks) can point at another server. `auto`
probes both services once at start, briefly, and turns the watcher off when neither answers.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from typing import Callable

log = logging.getLogger(__name__)

AWS_TOKEN_PATH = "/latest/api/token"
AWS_NOTICE_PATH = "/latest/meta-data/spot/instance-action"
ALICLOUD_NOTICE_PATH = "/latest/meta-data/instance/spot/termination-time"
ALICLOUD_PROBE_PATH = "/latest/meta-data/instance-id"
TOKEN_TTL_S = 21600

# Metadata services are link-local: never send these requests through an HTTP proxy.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SpotWatcher:
    def __init__(self, mode: str, aws_url: str, alicloud_url: str, interval_s: float,
                 on_notice: Callable[[str], None], timeout_s: float = 2.0) -> None:
        self.mode = mode  # auto | aws | alicloud | off; resolved to the cloud (or off) by start()
        self._aws = aws_url.rstrip("/")
        self._ali = alicloud_url.rstrip("/")
        self._interval = interval_s
        self._on_notice = on_notice
        self._timeout = timeout_s
        self._stop = threading.Event()
        self._token: str | None = None
        self._token_expires = 0.0
        self.notice: str | None = None
        self._thread = threading.Thread(target=self._run, name="torchfleet-spot-watch", daemon=True)

    def start(self) -> None:
        if self.mode != "off":
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._timeout * 2)

    # --- HTTP helpers -----------------------------------------------------------------------

    def _request(self, url: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, str]:
        req = urllib.request.Request(url, method=method, headers=headers or {})
        try:
            with _opener.open(req, timeout=self._timeout) as resp:
                return resp.status, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            return exc.code, ""

    def _aws_token(self) -> str:
        if self._token is None or time.monotonic() >= self._token_expires:
            status, body = self._request(self._aws + AWS_TOKEN_PATH, "PUT",
                                         {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
            if status != 200:
                raise OSError(f"IMDSv2 token request answered {status}")
            self._token = body.strip()
            self._token_expires = time.monotonic() + TOKEN_TTL_S - 60
        return self._token

    # --- probes and polls --------------------------------------------------------------------

    def _detect(self) -> str:
        try:
            self._aws_token()
            return "aws"
        except OSError:
            pass
        try:
            status, _ = self._request(self._ali + ALICLOUD_PROBE_PATH)
            if status == 200:
                return "alicloud"
        except OSError:
            pass
        return "off"

    def poll_once(self) -> str | None:
        """The notice text if one is posted now, else None. Raises OSError when unreachable."""
        if self.mode == "aws":
            status, body = self._request(self._aws + AWS_NOTICE_PATH,
                                         headers={"X-aws-ec2-metadata-token": self._aws_token()})
            if status == 401:  # token expired or revoked: fetch a new one next time
                self._token = None
            return body if status == 200 else None
        status, body = self._request(self._ali + ALICLOUD_NOTICE_PATH)
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
                log.warning("spot interruption notice from %s: %s; draining", self.mode, notice.strip())
                self._on_notice(notice)
                return
            self._stop.wait(self._interval)
