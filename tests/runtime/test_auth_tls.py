"""The runtime's edge security: tokens from a file that rotate without a failed request, and
HTTPS on the node itself (TLS 1.2+, verified against a CA made for the test)."""

from __future__ import annotations

import http.client
import json
import ssl
import time

import pytest
import rt_models
import trustme
from torchfleet_runtime import auth
from torchfleet_runtime.config import ConfigError, load_config

OLD = "old-token-0123456789abcdef"
NEW = "new-token-fedcba9876543210"
BODY = json.dumps({"inputs": [1.0, 2.0, 3.0, 4.0]}).encode()


def _predict(port: int, token: str | None, ctx: ssl.SSLContext | None = None) -> int:
    cls = http.client.HTTPSConnection if ctx else http.client.HTTPConnection
    kw = {"context": ctx} if ctx else {}
    conn = cls("127.0.0.1", port, timeout=30, **kw)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", "/v1/predict", BODY, headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_token_file_rotates_without_a_restart(start_runtime, tmp_path, monkeypatch):
    monkeypatch.setattr(auth, "RECHECK_S", 0.0)  # look at the file on every request
    tokens = tmp_path / "api-tokens"
    tokens.write_text(f"# current\n{OLD}\n")
    svc = start_runtime(rt_models.tiny(), api_token_file=str(tokens))
    assert [_predict(svc.port, t) for t in (None, NEW, OLD)] == [401, 401, 200]

    tokens.write_text(f"{OLD}\n{NEW}\n")  # the rotation: both while clients move over
    assert [_predict(svc.port, t) for t in (OLD, NEW)] == [200, 200]

    tokens.write_text(f"{NEW}\n")  # the old one retired
    # each edge process reads the file when a request comes to it; one that had none is told by
    # the owner's look at the file (edges.TOKEN_POLL_S): let every edge see this one
    time.sleep(0.3)
    assert [_predict(svc.port, t) for t in (OLD, NEW)] == [401, 200]

    tokens.write_text("short\n")  # a bad file keeps what was accepted, says why, shows no token
    assert [_predict(svc.port, t) for t in (OLD, NEW)] == [401, 200]
    assert svc.tokens.reload() is False


def test_the_token_file_is_read_again_on_reload_even_unchanged_in_stat(start_runtime, tmp_path):
    tokens = tmp_path / "api-tokens"
    tokens.write_text(f"{OLD}\n")
    svc = start_runtime(rt_models.tiny(), api_token_file=str(tokens), api_token=NEW)
    assert [_predict(svc.port, t) for t in (OLD, NEW)] == [200, 200]  # the key and the file
    tokens.write_text(f"{NEW}\n")
    assert svc.tokens.reload() is True and len(svc.tokens) == 2  # api_token + the file's one


@pytest.mark.parametrize(
    ("text", "why"),
    [("", "it holds 0 tokens"), ("ok-token-0123456789\nbad token\n", "line 2")],
)
def test_a_bad_token_file_fails_the_start_naming_the_key_not_the_token(tmp_path, text, why):
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        auth.Tokens(None, str(path))
    assert f"api_token_file = {str(path)!r} is invalid" in str(err.value) and why in str(err.value)
    assert "bad token" not in str(err.value)
    with pytest.raises(ConfigError, match="cannot read it"):
        auth.Tokens(None, str(tmp_path / "missing"))


def test_a_certificate_needs_its_key():
    with pytest.raises(ConfigError, match="tls_key_file = None is invalid"):
        load_config({"tls_cert_file": "/etc/cert.pem"}, env={})


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
def test_https_on_the_node_verified_against_its_ca_and_tls_1_1_refused(start_runtime, tmp_path, ca):
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    svc = start_runtime(
        rt_models.tiny(),
        api_token=OLD,
        tls_cert_file=str(tmp_path / "cert.pem"),
        tls_key_file=str(tmp_path / "key.pem"),
    )
    client = ssl.create_default_context()
    ca.configure_trust(client)
    assert svc.http.scheme == "https"
    assert [_predict(svc.port, t, client) for t in (None, OLD)] == [401, 200]

    stranger = ssl.create_default_context()  # the system's CAs only: this certificate fails
    with pytest.raises(ssl.SSLCertVerificationError):
        _predict(svc.port, OLD, stranger)

    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(old)
    old.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this client offer 1.1 at all
    old.minimum_version = ssl.TLSVersion.TLSv1  # deprecated, which is the point
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError):
        _predict(svc.port, OLD, old)
    old.maximum_version = ssl.TLSVersion.TLSv1_2  # the same client allowed 1.2: served
    assert _predict(svc.port, OLD, old) == 200


def test_a_certificate_that_does_not_load_fails_the_start(start_runtime, tmp_path):
    (tmp_path / "cert.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="tls_cert_file = .* is invalid"):
        start_runtime(
            rt_models.tiny(),
            tls_cert_file=str(tmp_path / "cert.pem"),
            tls_key_file=str(tmp_path / "cert.pem"),
        )
