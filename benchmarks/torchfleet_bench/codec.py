"""`torchfleet-bench codec`: per-request CPU of the runtime's codec and instrumentation,
in-process, best of N.

    torchfleet-bench codec     (numpy is used only to build the .npy body)

- request decode for one demo instance (3x64x64 float32): JSON with full-precision floats and
  with pixels rounded to 4 decimals (the body the side-by-side benchmarks send), the runtime's
  codec (orjson + level-by-level flatten into an array.array) against json.loads + torch.tensor,
  raw bytes and .npy;
- the answer's encode (10 logits);
- the same instance through the Open Inference Protocol's codec (/v2 JSON and the binary
  extension, decode and encode);
- what the instrumentation adds to one prediction: the four per-request stage histograms, the
  Server-Timing header, the request log line when debug is off, and per batch the summary
  aggregation; and the cost of one JSON log line when it is written.
"""

import argparse
import functools
import io
import json
import logging
import time
from collections.abc import Callable

import numpy as np
import torch
from torchfleet_runtime import codec, v2
from torchfleet_runtime.logs import BatchSummary, JsonFormatter
from torchfleet_runtime.metrics import Metrics

SHAPE = (3, 64, 64)


def _naive_decode(body: bytes) -> torch.Tensor:
    return torch.tensor(json.loads(body)["inputs"])


def best_us(fn: Callable[[], object], n: int = 30) -> float:
    fn()
    best = 1e9
    for _ in range(n):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def _open_inference_protocol(x: torch.Tensor, raw: bytearray, out: torch.Tensor) -> None:
    """The same instance through /v2's codec (v2.V2Infer): JSON (flat `data`, as tritonclient
    sends it) and the binary extension in, the answer out as JSON and as binary, beside /v1's."""
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, *SHAPE]}
    body_json = json.dumps({"inputs": [{**tensor, "data": x.flatten().tolist()}]}).encode()
    head = json.dumps(
        {"inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}]}
    ).encode()
    body_bin = head + raw
    hdr = {v2.HEADER_LENGTH: str(len(head))}

    def decode(body: bytes | bytearray, headers: dict[str, str]) -> torch.Tensor:
        return codec.to_tensor(
            v2.V2Infer("m", None).decode(body, "", headers, SHAPE, "float32"), f32
        )

    f32 = torch.float32
    json_us = best_us(lambda: decode(body_json, {}))
    bin_us = best_us(lambda: decode(body_bin, hdr))
    print(
        f"/v2 JSON {len(body_json) / 1024:.0f} KiB: {json_us / 1000:.2f} ms; "
        f"/v2 binary {len(body_bin) / 1024:.0f} KiB: {bin_us / 1000:.3f} ms"
    )
    answer = v2.V2Infer("m", None)

    def encode() -> object:  # from the model's outputs, as /v1's encode is timed
        structure, parts, non_finite = codec.output_parts(out, for_json=False)
        return answer.encode(structure, parts, True, non_finite, False, "1")

    enc_json = best_us(encode)
    answer.binary_output = True
    enc_bin = best_us(encode)
    raw_out = best_us(lambda: codec.encode_raw(out, True))
    print(
        f"encode the answer (10 logits): /v2 JSON {enc_json:.1f} us, /v2 binary {enc_bin:.1f} "
        f"us, /v1 binary {raw_out:.1f} us"
    )


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(
        prog="torchfleet-bench codec", description=__doc__.split("\n\n")[0]
    ).parse_args(argv)
    x = torch.randn(1, *SHAPE, generator=torch.Generator().manual_seed(0))
    full = json.dumps({"inputs": x.tolist()}).encode()
    rounded = json.dumps(
        {"inputs": np.round(torch.rand(1, *SHAPE).double().numpy(), 4).tolist()}
    ).encode()
    raw = bytearray(x.numpy().tobytes())
    buf = io.BytesIO()
    np.save(buf, x.numpy())
    npy = buf.getvalue()
    headers = {"x-shape": "1,3,64,64", "x-dtype": "float32"}
    f32 = torch.float32
    for name, body in (("full-precision", full), ("4 decimals", rounded)):
        ours = best_us(functools.partial(codec.decode, body, "application/json", {}, SHAPE, f32))
        naive = best_us(functools.partial(_naive_decode, body))
        print(
            f"JSON {name} {len(body) / 1024:.0f} KiB: codec {ours / 1000:.2f} ms; "
            f"json.loads + torch.tensor {naive / 1000:.2f} ms"
        )
    raw_us = best_us(lambda: codec.decode(raw, "application/octet-stream", headers, SHAPE, f32))
    npy_us = best_us(lambda: codec.decode(npy, "application/x-npy", {}, SHAPE, f32))
    print(f"raw {len(raw) / 1024:.0f} KiB: {raw_us / 1000:.3f} ms; .npy: {npy_us / 1000:.3f} ms")
    out = torch.randn(1, 10)
    print(
        f"encode a JSON answer (10 logits): {best_us(lambda: codec.encode_json(out, True)):.1f} us"
    )
    _open_inference_protocol(x, raw, out)

    m = Metrics()
    stage = m.device("cpu").stage
    reqlog = logging.getLogger("torchfleet_runtime.request")
    reqlog.setLevel(logging.INFO)
    t = {"decode": 0.0012, "queue": 0.0031, "model": 0.0094, "encode": 0.00004}

    def per_request() -> None:
        stage["decode"].observe(t["decode"])
        stage["queue"].observe(t["queue"])
        stage["encode"].observe(t["encode"])
        stage["write"].observe(0.00002)
        _ = (
            f"decode;dur={t['decode'] * 1000:.3f}, queue;dur={t['queue'] * 1000:.3f}, "
            f"model;dur={t['model'] * 1000:.3f}, encode;dur={t['encode'] * 1000:.3f}"
        )
        if reqlog.isEnabledFor(logging.DEBUG):
            reqlog.debug("never")

    summary = BatchSummary(logging.getLogger("bench.summary"), 10.0)

    def per_batch() -> None:
        stage["model"].observe(0.009)
        summary.add(8, 8, "full", 0.009, "v1")

    print(
        f"instrumentation per prediction (4 stage observes, Server-Timing, debug check): "
        f"{best_us(per_request, 2000):.1f} us; per batch (model observe + summary): "
        f"{best_us(per_batch, 2000):.1f} us"
    )
    rec = logging.LogRecord(
        "torchfleet_runtime.request",
        logging.INFO,
        __file__,
        1,
        "%s %s: %s",
        (400, "wrong_shape", "input shape [2] does not match the model"),
        None,
    )
    rec.request_id, rec.fields = "a1b2c3d4e5f60718", {"status": 400, "type": "wrong_shape"}
    fmt = JsonFormatter()
    print(f"one JSON log line formatted: {best_us(lambda: fmt.format(rec), 2000):.1f} us")
