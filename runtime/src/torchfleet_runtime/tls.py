"""HTTPS on the node itself (instances mode has no load balancer to end TLS): the server side
`ssl.SSLContext` the HTTP edge listens with when `tls_cert_file` and `tls_key_file` are set.

Contract. TLS 1.2 or newer only (`tls_min_version` 1.3 for 1.3 alone); the standard library's
server defaults otherwise (its cipher list, no compression, no renegotiation, session tickets).
A certificate or key that cannot be loaded is a ConfigError naming the key at start. The cost
per request is measured by `torchfleet-bench tls` (benchmarks/torchfleet_bench/tls.py).
"""

from __future__ import annotations

import ssl

from .config import Config, ConfigError

VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def server_context(config: Config) -> ssl.SSLContext | None:
    """None for plain HTTP (no certificate configured)."""
    if not config.tls_cert_file:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = VERSIONS[config.tls_min_version]
    try:
        ctx.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"tls_cert_file = {config.tls_cert_file!r} is invalid (with tls_key_file "
            f"{config.tls_key_file!r}: {exc}); allowed: a PEM certificate chain and its key"
        ) from None
    return ctx
