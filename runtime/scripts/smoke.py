#!/usr/bin/env python3
"""End-to-end smoke test of an installed runtime on whatever Python and torch run it.

Meant for the legacy stack (Python 3.8-3.10, torch 1.12.1) where the pytest suite (written for
the dev venv) does not run: demo model, fp32 and bf16, JSON / raw / .npy bodies, a bad request,
metrics, drain. Exits 1 on the first wrong answer. Example, with the cp39 wheelhouse:

    python3.9 -m venv /tmp/legacy && /tmp/legacy/bin/pip install --no-index \\
        --find-links .cache/wheelhouse-cp39 torch==1.12.1 'numpy<2' prometheus-client PyYAML
    PYTHONPATH=runtime/src /tmp/legacy/bin/python runtime/scripts/smoke.py
"""

import http.client
import io
import json
import struct
import sys
import tempfile

import torch

from torchfleet_runtime import compat, demo
from torchfleet_runtime.config import Config
from torchfleet_runtime.service import Runtime


def call(port, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request(method, path, body, headers or {})
    r = c.getresponse()
    return r.status, dict(r.getheaders()), r.read()


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        sys.exit(1)


def main():
    print("python", sys.version.split()[0], "torch", torch.__version__)
    model, _ = demo.write_demo_model(tempfile.mkdtemp(prefix="torchfleet-smoke-"))
    x = torch.randn(5, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = torch.jit.load(str(model))(x)
    for precision, tol in (("fp32", 1e-4), ("bf16", 0.05)):
        rt = Runtime(Config(model=str(model), port=0, spot_watch="off", precision=precision,
                            max_batch_size=4, log_level="warning"))
        rt.start()
        port = rt.port
        s, _, d = call(port, "POST", "/v1/predict", json.dumps({"inputs": x.tolist()}).encode(),
                       {"Content-Type": "application/json"})
        err = float((torch.tensor(json.loads(d)["outputs"]) - want).abs().max()) if s == 200 else None
        check(s == 200 and err < tol, f"{precision} JSON batch of 5 (cap 4: split): max error {err}")
        s, h, d = call(port, "POST", "/v1/predict", _raw(x),
                       {"Content-Type": "application/octet-stream", "X-Shape": "5,3,64,64", "X-Dtype": "float32",
                        "Accept": "application/octet-stream"})
        got = torch.tensor(struct.unpack("<50f", d)).reshape(5, 10) if s == 200 else None
        check(s == 200 and float((got - want).abs().max()) < tol, f"{precision} raw body, raw answer")
        npy = _npy(x)
        if npy is not None:
            s, _, _ = call(port, "POST", "/v1/predict", npy, {"Content-Type": "application/x-npy"})
            check(s == 200, f"{precision} .npy body")
        s, _, d = call(port, "POST", "/v1/predict", b'{"inputs": [1, 2]}', {"Content-Type": "application/json"})
        check(s == 400 and json.loads(d)["error"]["type"] == "wrong_shape", f"{precision} bad shape is a 400")
        s, _, d = call(port, "GET", "/metrics")
        check(s == 200 and b"torchfleet_batch_size_count" in d, f"{precision} metrics")
        rt.request_stop("smoke test")
        check(call(port, "GET", "/readyz")[0] == 503 and rt.drain(10), f"{precision} drain")
        rt.close()
    check(compat.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")), "OOM recognised")
    print("all good")


def _raw(x):
    return b"".join(struct.pack("<f", v) for v in x.reshape(-1).tolist())


def _npy(x):
    try:
        import numpy as np

        buf = io.BytesIO()
        np.save(buf, x.numpy())
        return buf.getvalue()
    except Exception as exc:  # numpy absent or broken (torch 1.12 + numpy 2): skip that form
        print("skip .npy body:", exc)
        return None


if __name__ == "__main__":
    main()
