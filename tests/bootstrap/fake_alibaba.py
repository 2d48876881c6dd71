"""A fake Alibaba Cloud on loopback for the node agent and the group inventory, which call it
through Alibaba's official SDKs: the fake checks the requests those SDKs really send.

- ECS metadata in hardened mode (PUT /latest/api/token, then GETs with the token; 401 without).
  Also served as an HTTP proxy: alibabacloud-credentials always asks 100.100.100.200, and an
  endpoint override reaches the fake as that address's proxy.
- OpenAPI RPC endpoints (ESS, CloudMonitor, ECS): every request must carry an ACS3-HMAC-SHA256
  Authorization header, the fake account's access key and STS token, and a body digest that
  matches; its signature is recomputed from the request as received (the headers it names as
  signed, the query, the method and path) with the OpenAPI SDK's own signer and the account's
  secret. A request that does not verify gets the cloud's 400 SignatureDoesNotMatch.
- OSS, path-style (an IP endpoint): the OSS4-HMAC-SHA256 Authorization header is recomputed with
  the OSS SDK's own V4 signer; GETs read `objects`, PUTs (PutObject) write it.

    with FakeAlibaba(answer) as cloud: cloud.url ...

`answer(action, params)` gives the JSON reply of an OpenAPI call (one with an error `Code` is
answered 400, as the cloud refuses a call); every verified call is kept in `calls` as
{"action", "version", "params"}, every refusal of a request in `refused`."""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import secrets
import threading
import types
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import alibabacloud_oss_v2 as oss
from alibabacloud_oss_v2.signer.v4 import SignerV4
from alibabacloud_oss_v2.types import HttpRequest, SigningContext
from alibabacloud_tea_openapi.utils import Utils

ACCESS_KEY, SECRET, TOKEN = "STS.node", "node-secret", "sts-token"
METADATA_HOST = "100.100.100.200"
ACS3 = re.compile(
    r"ACS3-HMAC-SHA256 Credential=(?P<ak>[^,]+),SignedHeaders=(?P<signed>[a-z0-9;-]+),"
    r"Signature=(?P<sig>[0-9a-f]{64})"
)
MUST_SIGN = {"host", "x-acs-action", "x-acs-version", "x-acs-date", "x-acs-content-sha256"}


def role_credentials(expires: str = "2099-01-01T00:00:00Z") -> dict[str, str]:
    return {
        "AccessKeyId": ACCESS_KEY,
        "AccessKeySecret": SECRET,
        "SecurityToken": TOKEN,
        "Expiration": expires,
        "Code": "Success",
    }


class FakeAlibaba:
    def __init__(
        self,
        answer: Callable[[str, dict[str, str]], dict[str, Any]],
        metadata: dict[str, Any] | None = None,
        region: str = "cn-shanghai",
        access_key: str = ACCESS_KEY,
        secret: str = SECRET,
        token: str | None = TOKEN,
    ) -> None:
        self.answer, self.metadata, self.region = answer, metadata or {}, region
        self.access_key, self.secret, self.token = access_key, secret, token
        self.objects: dict[tuple[str, str], bytes] = {}
        self.calls: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self.metadata_log: list[tuple[str, str, bool]] = []  # method, path, through the proxy
        self._tokens: set[str] = set()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeAlibaba:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def actions(self) -> list[str]:
        return [c["action"] for c in self.calls]

    # -- ECS metadata ----------------------------------------------------------------------
    def metadata_reply(self, method: str, path: str, headers: Any) -> tuple[int, str]:
        if method == "PUT":
            if path != "/latest/api/token" or not headers.get(
                "X-aliyun-ecs-metadata-token-ttl-seconds"
            ):
                return 400, "token TTL header required"
            token = secrets.token_urlsafe(16)
            self._tokens.add(token)
            return 200, token
        if headers.get("X-aliyun-ecs-metadata-token") not in self._tokens:
            return 401, "hardened mode: token required"
        value = self.metadata.get(path.removeprefix("/latest/meta-data/"))
        if value is None:
            return 404, ""
        return 200, json.dumps(value) if isinstance(value, dict) else str(value)

    # -- OpenAPI (RPC style, ACS3 signature) -----------------------------------------------
    def openapi_reply(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str]:
        h = handler.headers
        auth = ACS3.fullmatch(h.get("Authorization", ""))
        if auth is None:
            return self._refuse(400, f"malformed Authorization {h.get('Authorization')!r}")
        signed = auth["signed"].split(";")
        if not set(signed) >= MUST_SIGN or signed != sorted(signed):
            return self._refuse(400, f"SignedHeaders {auth['signed']} lacks {MUST_SIGN}")
        if h["x-acs-content-sha256"] != hashlib.sha256(body).hexdigest():
            return self._refuse(400, "x-acs-content-sha256 is not the body's digest")
        url = urllib.parse.urlsplit(handler.path)
        params = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        request = types.SimpleNamespace(
            method=handler.command,
            pathname=url.path,
            query=params,
            headers={name: h.get(name, "") for name in signed},
        )
        want = Utils.get_authorization(
            request, "ACS3-HMAC-SHA256", h["x-acs-content-sha256"], auth["ak"], self.secret
        )
        if auth["ak"] != self.access_key or want != h["Authorization"]:
            return self._refuse(400, "SignatureDoesNotMatch")
        if self.token and (
            h.get("x-acs-security-token") != self.token or h.get("x-acs-accesskey-id") != auth["ak"]
        ):
            return self._refuse(400, "InvalidSecurityToken")
        if "x-acs-security-token" in h and "x-acs-security-token" not in signed:
            return self._refuse(400, "the STS token is not signed")
        if h.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            params.update(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
        action = h["x-acs-action"]
        self.calls.append({"action": action, "version": h["x-acs-version"], "params": params})
        reply = self.answer(action, params)
        # an answer with an error Code is the cloud's refusal (HTTP 400, the SDK raises)
        status = 400 if reply.get("Code") not in (None, "Success", "200") else 200
        return status, json.dumps({"RequestId": secrets.token_hex(8), **reply})

    # -- OSS (path style, V4 signature) ----------------------------------------------------
    def oss_reply(self, handler: BaseHTTPRequestHandler, body: bytes = b"") -> tuple[int, bytes]:
        h = handler.headers
        bucket, _, key = urllib.parse.unquote(urllib.parse.urlsplit(handler.path).path)[
            1:
        ].partition("/")
        when = datetime.datetime.strptime(h.get("x-oss-date", ""), "%Y%m%dT%H%M%SZ").replace(
            tzinfo=datetime.UTC
        )
        received = {k: v for k, v in h.items() if k.lower() != "authorization"}
        request = HttpRequest(handler.command, self.url + handler.path, headers=received)
        context = SigningContext(
            product="oss",
            region=self.region,
            bucket=bucket,
            key=key,
            request=request,
            credentials=oss.credentials.Credentials(self.access_key, self.secret, self.token),
            signing_time=when,
        )
        SignerV4().sign(context)
        if request.headers["Authorization"] != h.get("Authorization"):
            self.refused.append(f"OSS signature of {handler.path}")
            return 403, b"<Error><Code>SignatureDoesNotMatch</Code></Error>"
        if handler.command == "PUT":
            declared = h.get("x-oss-content-sha256", "UNSIGNED-PAYLOAD")
            if declared != "UNSIGNED-PAYLOAD" and declared != hashlib.sha256(body).hexdigest():
                self.refused.append(f"OSS content digest of {handler.path}")
                return 400, b"<Error><Code>InvalidDigest</Code></Error>"
            self.objects[(bucket, key)] = body
            self.calls.append(
                {"action": "PutObject", "version": "oss", "params": {"bucket": bucket, "key": key}}
            )
            return 200, b""
        found = self.objects.get((bucket, key))
        if found is None:
            return 404, b"<Error><Code>NoSuchKey</Code></Error>"
        self.calls.append(
            {"action": "GetObject", "version": "oss", "params": {"bucket": bucket, "key": key}}
        )
        return 200, found

    def _refuse(self, status: int, why: str) -> tuple[int, str]:
        self.refused.append(why)
        return status, json.dumps({"Code": why.split()[0], "Message": why})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: str | bytes, kind: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else body
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path, proxied = self.path, self.path.startswith("http://")
                if proxied:
                    target = urllib.parse.urlsplit(path)
                    if target.hostname != METADATA_HOST:
                        return self._send(502, f"no proxying to {target.hostname}")
                    path = target.path
                if proxied or path.startswith("/latest/"):
                    fake.metadata_log.append((self.command, path, proxied))
                    return self._send(
                        *fake.metadata_reply(self.command, path, self.headers), "text/plain"
                    )
                if "x-acs-action" in self.headers:
                    return self._send(*fake.openapi_reply(self, body))
                status, data = fake.oss_reply(self, body)
                self._send(
                    status, data, "application/octet-stream" if status == 200 else "application/xml"
                )

            do_GET = do_PUT = do_POST = _serve

        return Handler
