"""Triton's own client (`tritonclient.http`, unchanged) against a runtime over TLS with a token:
health, metadata, infer with binary and JSON tensors both ways, FP32 and FP16 inputs, answers
equal to /v1/predict's, and its refusals as clean 4xx with the server serving after each."""

from __future__ import annotations

import json
import ssl
import urllib.request

import numpy as np
import pytest
import rt_models
import trustme

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

TOKEN = "triton-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
X = np.array([[0.5, -1.0, 2.0, 3.5], [1.0, 2.0, 3.0, 4.0], [0.0, 0.25, -0.5, 8.0]], "<f4")


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture(params=[0, 2], ids=["in-owner", "edge-processes"])
def node(request, start_runtime, tmp_path, ca):
    """(svc, client, ca file, model): a tiny FP32 model behind HTTPS and a token."""
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    svc = start_runtime(
        rt_models.tiny(),
        api_token=TOKEN,
        tls_cert_file=str(tmp_path / "cert.pem"),
        tls_key_file=str(tmp_path / "key.pem"),
        edge_workers=request.param,
    )
    client = httpclient.InferenceServerClient(
        f"127.0.0.1:{svc.port}", ssl=True, ssl_options={"ca_certs": str(tmp_path / "ca.pem")}
    )
    yield svc, client, str(tmp_path / "ca.pem"), "model"
    client.close()


def _v1(port: int, cafile: str, x: np.ndarray) -> np.ndarray:
    req = urllib.request.Request(
        f"https://127.0.0.1:{port}/v1/predict",
        json.dumps({"inputs": x.tolist()}).encode(),
        {"Content-Type": "application/json", **AUTH},
    )
    ctx = ssl.create_default_context(cafile=cafile)
    with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
        return np.array(json.loads(resp.read())["outputs"], dtype="<f4")


def _infer(client, x, binary_in=True, binary_out=True, datatype="FP32", model="model", **kw):
    inp = httpclient.InferInput("input", list(x.shape), datatype)
    inp.set_data_from_numpy(x, binary_data=binary_in)
    out = httpclient.InferRequestedOutput("output", binary_data=binary_out)
    # a copy: tritonclient writes Inference-Header-Content-Length into the dict it is given
    return client.infer(model, [inp], outputs=[out], headers=dict(AUTH), **kw)


def test_health_and_metadata(node):
    svc, client, _, model = node
    assert client.is_server_live(headers=AUTH) and client.is_server_ready(headers=AUTH)
    assert client.is_model_ready(model, headers=AUTH)
    assert not client.is_model_ready("another", headers=AUTH)
    server = client.get_server_metadata(headers=AUTH)
    assert server["name"] == "torchfleet" and "binary_tensor_data" in server["extensions"]
    meta = client.get_model_metadata(model, headers=AUTH)
    assert meta["versions"] == [svc.runtime.version]
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 3]}]
    version = svc.runtime.version
    assert client.get_model_metadata(model, version, headers=AUTH)["name"] == model


@pytest.mark.parametrize(
    ("binary_in", "binary_out"), [(True, True), (True, False), (False, True), (False, False)]
)
def test_infer_equals_v1_predict(node, binary_in, binary_out):
    svc, client, cafile, _ = node
    want = _v1(svc.port, cafile, X)
    result = _infer(client, X, binary_in, binary_out, request_id="trit-1")
    got = result.as_numpy("output")
    assert got.dtype == np.float32 and got.shape == (3, 3)
    np.testing.assert_array_equal(got, want)  # the same bytes: one model, one batcher
    response = result.get_response()
    assert response["id"] == "trit-1" and response["model_version"] == svc.runtime.version


def test_fp16_inputs_to_an_fp16_model(start_runtime, tmp_path, ca):
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    svc = start_runtime(
        rt_models.tiny().half(),
        dtype="float16",
        api_token=TOKEN,
        tls_cert_file=str(tmp_path / "cert.pem"),
        tls_key_file=str(tmp_path / "key.pem"),
        edge_workers=0,
    )
    client = httpclient.InferenceServerClient(
        f"127.0.0.1:{svc.port}", ssl=True, ssl_options={"ca_certs": str(tmp_path / "ca.pem")}
    )
    try:
        x = X.astype("<f2")
        meta = client.get_model_metadata("model", headers=AUTH)
        # the input is FP16; the runtime hands half-precision outputs back as FP32 (model.py)
        assert meta["inputs"][0]["datatype"] == "FP16" and meta["outputs"][0]["datatype"] == "FP32"
        want = _v1(svc.port, str(tmp_path / "ca.pem"), x.astype("<f4"))
        for binary_in, binary_out in ((True, True), (False, False)):
            got = _infer(client, x, binary_in, binary_out, datatype="FP16").as_numpy("output")
            assert got.dtype == np.float32  # as the metadata says
            np.testing.assert_array_equal(got, want)
    finally:
        client.close()


def test_refusals_are_4xx_and_the_server_keeps_serving(node):
    svc, client, cafile, model = node
    x = X[:1]

    def refused(fn, status: str, words: str) -> None:
        with pytest.raises(InferenceServerException) as err:
            fn()
        assert err.value.status() == status and words in err.value.message(), err.value
        np.testing.assert_array_equal(
            _infer(client, x).as_numpy("output"), _v1(svc.port, cafile, x)
        )

    refused(lambda: _infer(client, x, model="another"), "404", "unknown model")
    refused(lambda: _infer(client, x, model_version="999"), "404", "version")
    refused(lambda: _infer(client, X[:, :3].copy()), "400", "shape")
    refused(lambda: _infer(client, x.astype("<f8"), datatype="FP64"), "400", "float64")
    refused(
        lambda: client.infer(
            model, [httpclient.InferInput("input", [1, 4], "FP32")], headers=dict(AUTH)
        ),
        "400",
        "data",
    )
    # a binary_data_size that lies: the JSON header says 64 bytes, 16 follow
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, 4],
                    "parameters": {"binary_data_size": 64},
                }
            ]
        }
    ).encode()
    req = urllib.request.Request(
        f"https://127.0.0.1:{svc.port}/v2/models/{model}/infer",
        head + x.tobytes(),
        {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(head)),
            **AUTH,
        },
    )
    with pytest.raises(urllib.error.HTTPError) as http_err:
        urllib.request.urlopen(req, context=ssl.create_default_context(cafile=cafile), timeout=30)
    assert (
        http_err.value.code == 400
        and "binary_data_size" in json.loads(http_err.value.read())["error"]
    )
    # no token
    with pytest.raises(InferenceServerException) as err:
        inp = httpclient.InferInput("input", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        client.infer(model, [inp])
    assert err.value.status() == "401"
    np.testing.assert_array_equal(_infer(client, x).as_numpy("output"), _v1(svc.port, cafile, x))
