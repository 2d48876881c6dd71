"""The node's own runtime as the agent asks it, over loopback: plain HTTP, or HTTPS where the
node serves the stack's node certificate (a stack with tls.backend: `torchfleet-node node-tls`
writes it to NODE_TLS_CERT, where the inventory points the runtime's tls_cert_file)."""

from __future__ import annotations

import os
import ssl
import urllib.request
from http.client import HTTPResponse
from typing import cast

from .boot import NodeConfig

NODE_TLS_CERT = "/etc/torchfleet/node-cert.pem"
NODE_TLS_KEY = "/etc/torchfleet/node-key.pem"
# The journal upload's client certificate, key and the journal CA (`torchfleet-node journal-tls`,
# a stack with monitoring: the monitoring role's monitoring_logs_tls_*_file on the nodes, and the
# receiver's certificate and key on the monitoring host), in a directory of their own that the
# role creates 0750 root:root: systemd hands each file to its service as a credential.
JOURNAL_TLS_DIR = "/etc/torchfleet-journal"
JOURNAL_TLS_CERT = f"{JOURNAL_TLS_DIR}/cert.pem"
JOURNAL_TLS_KEY = f"{JOURNAL_TLS_DIR}/key.pem"
JOURNAL_TLS_CA = f"{JOURNAL_TLS_DIR}/ca.pem"


def runtime_url(cfg: NodeConfig, path: str, cert: str | None = None) -> str:
    scheme = "https" if os.path.exists(cert or NODE_TLS_CERT) else "http"
    return f"{scheme}://127.0.0.1:{cfg.get('service_port', 8080)}{path}"


def open_runtime(
    cfg: NodeConfig, path: str, timeout: float = 5.0, cert: str | None = None
) -> HTTPResponse:
    """GET `path` of the node's runtime. Over HTTPS it trusts exactly the node's certificate,
    which names the stack's node name, not the loopback address: the name is not checked."""
    url = runtime_url(cfg, path, cert)
    if not url.startswith("https:"):
        return cast(HTTPResponse, urllib.request.urlopen(url, timeout=timeout))
    context = ssl.create_default_context(cafile=cert or NODE_TLS_CERT)
    context.check_hostname = False
    return cast(HTTPResponse, urllib.request.urlopen(url, timeout=timeout, context=context))
