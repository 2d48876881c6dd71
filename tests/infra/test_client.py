"""infra.client, the controller's one client of a node's runtime, over real loopback sockets:
a request that nothing answers is a state (status None), not an exception; the model card
becomes a request body or a one-line error; bad URLs and dtypes are named."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra import client


class Card(BaseHTTPRequestHandler):
    card: dict = {"input_shape": [2, 3], "dtype": "int64"}

    def log_message(self, *args):
        pass

    def do_GET(self):
        path, _, query = self.path.partition("?")
        card = {**self.card, **({"query": query} if query else {})}
        body = json.dumps(card).encode() if path == "/v1/model" else b"not json"
        self.send_response(200 if path != "/missing" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def runtime():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Card)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield client.Target.parse(f"127.0.0.1:{server.server_address[1]}/v1/predict")
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the block ends


def test_request_answers_status_body_and_seconds(runtime):
    status, body, seconds = client.request("GET", runtime.url + "/v1/model?x=1")
    assert status == 200 and json.loads(body) == {**Card.card, "query": "x=1"}
    assert 0 < seconds < 30
    status, body, _ = client.request("GET", runtime.url + "/missing")
    assert status == 404


def test_nothing_answering_is_status_none():
    assert client.request("GET", f"http://127.0.0.1:{closed_port()}/readyz", timeout=2)[:2] == (
        None,
        b"",
    )


def test_the_model_card_becomes_a_body(runtime):
    card = client.get_json(runtime, "/v1/model", timeout=10)
    body, headers = client.card_payload(card, batch=2, binary=True)
    assert headers["X-Shape"] == "2,2,3" and headers["X-Dtype"] == "int64"
    assert len(body) == 2 * 2 * 3 * 8
    body, headers = client.card_payload({"input_shape": [4]}, batch=1, binary=False)
    assert headers["Content-Type"] == "application/json"
    assert len(json.loads(body)["inputs"][0]) == 4  # float32 when the card names no dtype


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: client.get_json(t, "/missing", 10), "/missing answered 404"),
        (lambda t: client.get_json(t, "/other", 10), "/other: the answer is not JSON"),
        (lambda t: client.card_payload({"dtype": "float32"}, 1, False), "names no input shape"),
        (lambda t: client.build_payload([1], "complex64", 1, True), "dtype 'complex64' is not"),
        (lambda t: client.Target.parse("ftp://h:21"), "URL 'ftp://h:21': expected http://"),
        (
            lambda t: client.get_json(client.Target.parse(f"h:{closed_port()}"), "/v1/model", 2),
            "/v1/model: ",
        ),
    ],
)
def test_mistakes_are_one_line_errors(runtime, call, message):
    with pytest.raises(client.ClientError) as err:
        call(runtime)
    assert message in str(err.value) and "\n" not in str(err.value)


class Echo(BaseHTTPRequestHandler):
    """Answers with the Authorization header it got (tests only; never a real token)."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = json.dumps({"authorization": self.headers.get("Authorization")}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


@pytest.fixture(scope="module")
def tls_echo(tmp_path_factory):
    """An https server on loopback with a certificate of a CA made for this module."""
    import ssl

    import trustme

    ca = trustme.CA()
    folder = tmp_path_factory.mktemp("tls")
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}", str(folder / "ca.pem")
    server.shutdown()
    server.server_close()


def test_every_request_carries_the_token_and_checks_the_certificate(tls_echo):
    url, ca = tls_echo
    auth = client.Auth(token="tok-0123456789abcdef", cafile=ca)
    status, body, _ = client.request("GET", url + "/v1/model", auth=auth)
    assert status == 200 and json.loads(body) == {"authorization": "Bearer tok-0123456789abcdef"}
    target = client.Target.parse(url, auth)
    assert client.get_json(target, "/v1/model", 5)["authorization"] == "Bearer tok-0123456789abcdef"
    conn = target.connection(5)  # the load generator's kept connection: the same header
    try:
        status, body, keep = client.post_once(conn, "/v1/predict", b"{}", {})
        assert keep is False  # Echo answers HTTP/1.0: the server closes the connection
    finally:
        conn.close()
    assert json.loads(body) == {"authorization": "Bearer tok-0123456789abcdef"}
    conn = target.connection(5)  # the load generator's probe reads the answer's headers too
    try:
        status, body, got = client.post_answer(conn, "/v1/predict", b"{}", {})
    finally:
        conn.close()
    assert json.loads(body) == {"authorization": "Bearer tok-0123456789abcdef"}
    assert got["content-length"] == str(len(body))
    # a header the caller set wins (a test of a wrong token must send the wrong one)
    status, body, _ = client.request(
        "GET", url + "/x", headers={"Authorization": "Bearer other"}, auth=auth
    )
    assert json.loads(body) == {"authorization": "Bearer other"}
    # without the run's CA the certificate does not verify: an error, never "no answer"
    with pytest.raises(client.ClientError, match="certificate does not verify"):
        client.request("GET", url + "/v1/model", auth=client.Auth(token="t"))


def test_a_stack_that_generated_its_certificate_is_trusted_by_its_ca_output(tls_echo):
    """`torchfleet up|status` build their client from the stack's outputs (pipeline.auth_of):
    a generated certificate's CA output (PEM text) is what the endpoint is verified against,
    that CA alone; an explicit CA file wins over it."""
    from pathlib import Path

    import trustme

    from infra.constants import CA_OUTPUT
    from infra.deploy.pipeline import auth_of

    url, ca_file = tls_echo
    outputs = {"api_token": "tok-0123456789abcdef", CA_OUTPUT: Path(ca_file).read_text()}
    auth = auth_of(outputs)
    assert auth.cadata == outputs[CA_OUTPUT] and auth.cafile is None
    status, body, _ = client.request("GET", url + "/v1/model", auth=auth)
    assert status == 200 and json.loads(body) == {"authorization": "Bearer tok-0123456789abcdef"}
    # another stack's CA does not verify this endpoint
    other = {**outputs, CA_OUTPUT: trustme.CA().cert_pem.bytes().decode()}
    with pytest.raises(client.ClientError, match="certificate does not verify"):
        client.request("GET", url + "/v1/model", auth=auth_of(other))
    # a CA file the operator names wins over the output
    assert auth_of(other, ca_file).cadata is None
    assert client.request("GET", url + "/v1/model", auth=auth_of(other, ca_file))[0] == 200
