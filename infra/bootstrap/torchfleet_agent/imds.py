"""The instance metadata service, token-protected on both clouds (AWS IMDSv2, Alibaba's hardened
mode): PUT /latest/api/token with the cloud's TTL header, then GETs with its token header. The
runtime's spot watcher speaks the same protocol (torchfleet_runtime.interruption); the two
packages cannot share a module, so tests/runtime/test_spot.py holds them equal."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

TOKEN_TTL_S = 21600
# cloud -> (default base URL, token header, TTL header)
SERVICES: dict[str, tuple[str, str, str]] = {
    "aws": (
        "http://169.254.169.254",
        "X-aws-ec2-metadata-token",
        "X-aws-ec2-metadata-token-ttl-seconds",
    ),
    "alicloud": (
        "http://100.100.100.200",
        "X-aliyun-ecs-metadata-token",
        "X-aliyun-ecs-metadata-token-ttl-seconds",
    ),
}
# Link-local services: never through an HTTP proxy of the environment.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Imds:
    def __init__(self, cloud: str, base: str | None = None) -> None:
        default, self.token_header, self.ttl_header = SERVICES[cloud]
        self.base = (base or default).rstrip("/")
        self.token: str | None = None
        self.expires = 0.0

    def _request(self, method: str, path: str, headers: dict[str, str]) -> bytes:
        req = urllib.request.Request(self.base + path, method=method, headers=headers)
        with _opener.open(req, timeout=10) as resp:
            body: bytes = resp.read()
            return body

    def get(self, path: str, default: str | None = None) -> str | None:
        """/latest/meta-data/<path>, or `default` where the service has no such entry (404)."""
        if self.token is None or time.time() > self.expires:
            token = self._request("PUT", "/latest/api/token", {self.ttl_header: str(TOKEN_TTL_S)})
            self.token, self.expires = token.decode(), time.time() + TOKEN_TTL_S - 600
        try:
            return self._request(
                "GET", "/latest/meta-data/" + path, {self.token_header: self.token}
            ).decode()
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return default
            raise

    def require(self, path: str) -> str:
        found = self.get(path)
        if not found:
            raise RuntimeError(f"the metadata service at {self.base} has no {path}")
        return found
