#!/usr/bin/env python3
"""A fake EC2 instance metadata service (IMDSv2 only) for the bootstrap test, run inside the
node's pod so the node reaches it on its own loopback.

    python3 fake_imds.py PORT STATE_DIR

Answers PUT /latest/api/token (X-aws-ec2-metadata-token-ttl-seconds required) and
GET /latest/meta-data/<path> with that token only (401 without: IMDSv1 is off, as the launch
template sets http_tokens=required). The answers come from STATE_DIR/imds.json, re-read on
every request so the test can move the node through its lifecycle
(autoscaling/target-lifecycle-state). A JSON object value is served as JSON (the instance
role's credentials). Every request is logged to STATE_DIR/imds.log."""

import json
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PORT, STATE = int(sys.argv[1]), Path(sys.argv[2])
TOKENS: set[str] = set()
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def _reply(self, status: int, body: str, kind: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        with LOCK, (STATE / "imds.log").open("a") as log:
            log.write(f"{self.command} {self.path} {args[1] if len(args) > 1 else ''}\n")

    def do_PUT(self) -> None:
        if self.path != "/latest/api/token" or not self.headers.get(
            "X-aws-ec2-metadata-token-ttl-seconds"
        ):
            return self._reply(400, "token TTL header required")
        token = secrets.token_urlsafe(24)
        TOKENS.add(token)
        self._reply(200, token)

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token") not in TOKENS:
            return self._reply(401, "IMDSv2 token required")
        prefix = "/latest/meta-data/"
        if not self.path.startswith(prefix):
            return self._reply(404, "not found")
        answers = json.loads((STATE / "imds.json").read_text())
        value = answers.get(self.path[len(prefix) :])
        if value is None:
            return self._reply(404, "not found")
        if isinstance(value, dict):
            return self._reply(200, json.dumps(value), "application/json")
        self._reply(200, str(value))


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
